#!/usr/bin/env bash
# The full suite (`make test`, and CI's .ci/run):
#   lint, types and the docs build;
#   every test, the docs' examples included, on Django 5.2 LTS with what Django 6.0 and 6.1
#   remove raised as errors: on SQLite, on PostgreSQL as Django connects by default, and on
#   MariaDB;
#   the production topology: one pass through PgBouncer in transaction pooling mode, one
#   against a streaming replica, one with several servers and workers on one database;
#   the django-ninja adapter on every ninja release the `ninja` extra admits;
#   the packages: built, checked, the wheel installed in a fresh venv on the newest Python
#   here, and the sdist's own suite run against it on SQLite, and where that Python is 3.12+
#   on Django 6.1 and PostgreSQL with psycopg's prepared statements on (scripts/package-check.sh;
#   without such a Python, the prepared-statements pass runs here on Django 5.2).
# Extra arguments go to every pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-deps.sh  # before bootstrap: mysqlclient builds against libmariadb-dev
EXTRAS=mysql DJANGO_SPEC="django>=5.2,<6.0" bash scripts/bootstrap.sh
bash scripts/services.sh postgres mariadb redis
PY=.venv/bin/python
versions() { "$1" -c 'import sys, django; print(f"Django {django.get_version()}, Python {sys.version.split()[0]}")'; }

echo "== ruff"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
echo "== mypy"
"$PY" -m mypy
echo "== docs build"
"$PY" -m mkdocs build --strict --quiet --site-dir "$(mktemp -d)"

SQLITE_TESTS="not postgres and not mariadb and not server_db"
echo "== tests on SQLite, $(versions "$PY")"
env -u DATABASE_URL "$PY" -m pytest -m "$SQLITE_TESTS" "$@"
PG_URL=${PG_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/idempotency}
# The topology passes at the end run their own markers, once each.
PG_TESTS="not mariadb and not pgbouncer and not replica and not topology and not tenants"
echo "== tests on PostgreSQL, $(versions "$PY")"
DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 "$PY" -m pytest -m "$PG_TESTS" "$@"
if [ -z "$(bash scripts/newest-python.sh)" ]; then
  # Otherwise the Django 6.1 pass of scripts/package-check.sh runs with them on.
  echo "== tests on PostgreSQL, prepared statements (server-side binding, prepare_threshold 0), $(versions "$PY")"
  DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 PREPARED_STATEMENTS=1 "$PY" -m pytest -m "$PG_TESTS" -q "$@"
fi
MARIADB_URL=${MARIADB_DATABASE_URL:-mysql://root@127.0.0.1:3306/idempotency}
echo "== tests on MariaDB, $(versions "$PY")"
DATABASE_URL=$MARIADB_URL REQUIRE_MARIADB=1 "$PY" -m pytest -m "not postgres" -q "$@"

# ---- Production topology (issue 17): PgBouncer, a streaming replica, several servers.
# Each is one lean pass; the main PostgreSQL passes above leave their markers out.
echo "== tests through PgBouncer (transaction pooling): concurrency, transactions, HTTP, Celery; atomic and lease mode"
PGB_PORT=${PGBOUNCER_PORT:-6433}
PGBOUNCER_PORT=$PGB_PORT bash scripts/pgbouncer.sh start
trap 'PGBOUNCER_PORT=$PGB_PORT bash scripts/pgbouncer.sh stop' EXIT
PGB_URL=$(echo "$PG_URL" | sed -E "s#@([^:/]+)(:[0-9]+)?/#@127.0.0.1:$PGB_PORT/#")
PGB_TEST_DB=test_idempotency_pgbouncer
# --reuse-db: PgBouncer keeps server connections to the test database, so it is
# created through it but dropped directly, with FORCE, afterwards.
PGBOUNCER=1 DATABASE_URL=$PGB_URL TEST_DATABASE_NAME=$PGB_TEST_DB REQUIRE_POSTGRES=1 \
  "$PY" -m pytest -q --reuse-db -p no:cacheprovider -m "not session and not mariadb" \
  tests/test_pgbouncer.py tests/test_concurrency.py tests/test_lease.py tests/test_waiting.py \
  tests/test_claim_statement.py tests/test_example_http.py tests/test_example_ninja_http.py \
  tests/test_async.py tests/test_celery.py "$@"
PGBOUNCER_PORT=$PGB_PORT bash scripts/pgbouncer.sh stop
psql "${PG_URL%/*}/postgres" -qc "DROP DATABASE IF EXISTS $PGB_TEST_DB WITH (FORCE)"
echo "== tests against a streaming replica (a private primary and a hot standby 3 s behind)"
bash scripts/replica.sh test "$@"
echo "== several servers and workers on one database: 3 gunicorn instances (one killed), 2 Celery workers and beat"
DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 "$PY" -m pytest -q -m topology tests/test_topology.py "$@"
echo "== tenants (issue 26): a database per tenant behind a router; a schema per tenant (django-tenants)"
# Settings of their own (--ds): several databases behind a router; django-tenants' backend.
TENANTS_RUN=(env DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 TEST_DATABASE_NAME=test_idempotency_tenants
  "$PY" -m pytest -q -p no:cacheprovider -m tenants)
"${TENANTS_RUN[@]}" --ds=tests.deployment.shards_settings tests/deployment/test_database_per_tenant.py "$@"
"${TENANTS_RUN[@]}" --ds=tests.deployment.tenants_settings tests/deployment/test_schema_per_tenant.py "$@"

bash scripts/ninja-releases.sh "$@"
PG_TESTS=$PG_TESTS bash scripts/package-check.sh "$@"
