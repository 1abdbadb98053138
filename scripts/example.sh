#!/usr/bin/env bash
# Run the example project: install, migrate, add the demo user, serve on http://127.0.0.1:8000/ (SQLite by default).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/python manage.py migrate --noinput
# The demo user of the README's curl examples (alice / alice), made once.
.venv/bin/python manage.py shell -c "
from django.contrib.auth.models import User
if not User.objects.filter(username='alice').exists():
    User.objects.create_user('alice', password='alice')
"
exec .venv/bin/python manage.py runserver "${@:-127.0.0.1:8000}"
