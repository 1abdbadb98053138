#!/usr/bin/env bash
# The full suite: lint, types, then every test on SQLite, on PostgreSQL (with the
# concurrency, Celery and browser tests, which need real services) once as Django
# connects by default and once with prepared statements on, and once on MariaDB.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-deps.sh  # before bootstrap: mysqlclient builds against libmariadb-dev
EXTRAS=dev,mysql bash scripts/bootstrap.sh
bash scripts/services.sh postgres mariadb redis
PY=.venv/bin/python

echo "== ruff"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
echo "== mypy"
"$PY" -m mypy
echo "== docs"
"$PY" -m mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
echo "== tests on SQLite, Django $("$PY" -m django --version)"
SQLITE_TESTS="not postgres and not mariadb and not server_db"
env -u DATABASE_URL "$PY" -m pytest -m "$SQLITE_TESTS" "$@"
echo "== tests on SQLite, Django 4.2 LTS"
VENV=.venv-django42 DJANGO_SPEC="django>=4.2,<5.0" bash scripts/bootstrap.sh
env -u DATABASE_URL .venv-django42/bin/python -m pytest -m "$SQLITE_TESTS" -q "$@"
PG_URL=${PG_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/idempotency}
# The topology passes at the end run their own markers, once each.
PG_TESTS="not mariadb and not pgbouncer and not replica and not topology"
echo "== tests on PostgreSQL"
DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 "$PY" -m pytest -m "$PG_TESTS" "$@"
echo "== tests on PostgreSQL, prepared statements (server-side binding, prepare_threshold 0)"
DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 PREPARED_STATEMENTS=1 "$PY" -m pytest -m "$PG_TESTS" -q "$@"
MARIADB_URL=${MARIADB_DATABASE_URL:-mysql://root@127.0.0.1:3306/idempotency}
echo "== tests on MariaDB"
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
