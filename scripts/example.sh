#!/usr/bin/env bash
# Run the example project: install, migrate, collect the static files, add the demo user, serve
# on http://127.0.0.1:8000/: Django's runserver, or with DEBUG=False gunicorn (as deployed; the
# admin's CSS is served by WhiteNoise from STATIC_ROOT, default ./staticfiles).
# SQLite by default; DATABASE_URL=postgres://... or mysql://... for a server (a mysql:// URL
# first installs the Debian packages mysqlclient builds against, then the `mysql` extra).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${DATABASE_URL:-}" in
  mysql://* | mysql2://* | mysqlgis://*)
    bash scripts/system-deps.sh mysql
    EXTRAS=dev,mysql bash scripts/bootstrap.sh
    ;;
  *) bash scripts/bootstrap.sh ;;
esac
.venv/bin/python manage.py migrate --noinput
.venv/bin/python manage.py collectstatic --noinput -v 0
# The demo user of the README's curl examples (alice / alice), made once.
.venv/bin/python manage.py shell -c "
from django.contrib.auth.models import User
if not User.objects.filter(username='alice').exists():
    User.objects.create_user('alice', password='alice')
"
case "${DEBUG:-True}" in
  False | false | 0 | off | no)
    exec .venv/bin/python -m gunicorn example_project.wsgi:application \
      --bind "${1:-127.0.0.1:8000}" --workers "${WORKERS:-3}"
    ;;
esac
exec .venv/bin/python manage.py runserver "${@:-127.0.0.1:8000}"
