#!/usr/bin/env bash
# Run the example project: install, migrate, serve on http://127.0.0.1:8000/ (SQLite by default).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/python manage.py migrate --noinput
exec .venv/bin/python manage.py runserver "${@:-127.0.0.1:8000}"
