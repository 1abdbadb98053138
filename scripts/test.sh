#!/usr/bin/env bash
# `make test`, and CI's .ci/run: set this machine up (Debian packages, .venv on Django 5.2
# LTS, the database servers), then run every pass CI runs, as scripts/passes.sh lists them.
# Extra arguments go to every pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-deps.sh  # before bootstrap: mysqlclient builds against libmariadb-dev
EXTRAS=mysql DJANGO_SPEC="django>=5.2,<6.0" bash scripts/bootstrap.sh
bash scripts/services.sh postgres mariadb redis
bash scripts/passes.sh ci "$@"
