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
echo "== tests on PostgreSQL"
DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 "$PY" -m pytest -m "not mariadb" "$@"
echo "== tests on PostgreSQL, prepared statements (server-side binding, prepare_threshold 0)"
DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 PREPARED_STATEMENTS=1 "$PY" -m pytest -m "not mariadb" -q "$@"
MARIADB_URL=${MARIADB_DATABASE_URL:-mysql://root@127.0.0.1:3306/idempotency}
echo "== tests on MariaDB"
DATABASE_URL=$MARIADB_URL REQUIRE_MARIADB=1 "$PY" -m pytest -m "not postgres" -q "$@"
