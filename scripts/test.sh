#!/usr/bin/env bash
# The full suite (`make test`, and CI's .ci/run):
#   lint, types and the docs build;
#   every test, the docs' examples included, on Django 5.2 LTS with what Django 6.0 and 6.1
#   remove raised as errors: on SQLite, on PostgreSQL as Django connects by default, and on
#   MariaDB;
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
echo "== tests on PostgreSQL, $(versions "$PY")"
DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 "$PY" -m pytest -m "not mariadb" "$@"
if [ -z "$(bash scripts/newest-python.sh)" ]; then
  # Otherwise the Django 6.1 pass of scripts/package-check.sh runs with them on.
  echo "== tests on PostgreSQL, prepared statements (server-side binding, prepare_threshold 0), $(versions "$PY")"
  DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 PREPARED_STATEMENTS=1 "$PY" -m pytest -m "not mariadb" -q "$@"
fi
MARIADB_URL=${MARIADB_DATABASE_URL:-mysql://root@127.0.0.1:3306/idempotency}
echo "== tests on MariaDB, $(versions "$PY")"
DATABASE_URL=$MARIADB_URL REQUIRE_MARIADB=1 "$PY" -m pytest -m "not postgres" -q "$@"

bash scripts/ninja-releases.sh "$@"
bash scripts/package-check.sh "$@"
