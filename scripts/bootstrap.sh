#!/usr/bin/env bash
# Create a venv (default .venv) and install the project with its extras (default "dev"), once
# per change of pyproject.toml. DJANGO_SPEC (e.g. "django>=4.2,<5.0") pins another Django
# release. EXTRAS="dev,mysql" adds mysqlclient, which needs `scripts/system-deps.sh mysql` first.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
DJANGO_SPEC=${DJANGO_SPEC:-}
EXTRAS=${EXTRAS:-dev}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
stamp="$VENV/.installed-$( (cat pyproject.toml; echo "$DJANGO_SPEC $EXTRAS") | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # shellcheck disable=SC2086  # DJANGO_SPEC is one requirement or nothing
  "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]" ${DJANGO_SPEC:+"$DJANGO_SPEC"}
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
