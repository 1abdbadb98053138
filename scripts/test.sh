#!/usr/bin/env bash
# The full suite: lint, types, then every test on SQLite and again on PostgreSQL
# (with the concurrency, Celery and browser tests, which need real services),
# once as Django connects by default and once with prepared statements on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/system-deps.sh
bash scripts/services.sh postgres redis
PY=.venv/bin/python

echo "== ruff"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
echo "== mypy"
"$PY" -m mypy
echo "== docs"
"$PY" -m mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
echo "== tests on SQLite, Django $("$PY" -m django --version)"
env -u DATABASE_URL "$PY" -m pytest -m "not postgres" "$@"
echo "== tests on SQLite, Django 4.2 LTS"
VENV=.venv-django42 DJANGO_SPEC="django>=4.2,<5.0" bash scripts/bootstrap.sh
env -u DATABASE_URL .venv-django42/bin/python -m pytest -m "not postgres" -q "$@"
PG_URL=${PG_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/idempotency}
echo "== tests on PostgreSQL"
DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 "$PY" -m pytest "$@"
echo "== tests on PostgreSQL, prepared statements (server-side binding, prepare_threshold 0)"
DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 PREPARED_STATEMENTS=1 "$PY" -m pytest -q "$@"
