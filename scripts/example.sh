#!/usr/bin/env bash
# Run the example project: install what it needs (the package and the "example" dependency
# group, not the test tool chain), migrate, collect the static files, add the demo user, serve:
# Django's runserver, or with DEBUG=False gunicorn (as deployed; the admin's CSS is served by
# WhiteNoise from STATIC_ROOT, default ./staticfiles).
#   ADDR=0.0.0.0:8080 or PORT=8080   where to serve (default 127.0.0.1:8000)
# SQLite by default; DATABASE_URL=postgres://... or mysql://... for a server (the matching
# extra is installed; a mysql:// URL first installs the Debian packages mysqlclient needs).
set -euo pipefail
cd "$(dirname "$0")/.."
ADDR=${ADDR:-127.0.0.1:${PORT:-8000}}
case "${DATABASE_URL:-}" in
  mysql://* | mysql2://* | mysqlgis://*)
    bash scripts/system-deps.sh mysql
    extras=mysql
    ;;
  postgres://* | postgresql://* | pgsql://* | psql://*) extras=postgres ;;
  *) extras= ;;
esac
DEP_GROUPS=example EXTRAS=$extras bash scripts/bootstrap.sh
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
      --bind "$ADDR" --workers "${WORKERS:-3}"
    ;;
esac
exec .venv/bin/python manage.py runserver "$ADDR"
