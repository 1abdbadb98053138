#!/usr/bin/env bash
# Create a venv (default .venv) and install the project with its dev extras, once per change
# of pyproject.toml. DJANGO_SPEC (e.g. "django>=4.2,<5.0") pins another Django release.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
DJANGO_SPEC=${DJANGO_SPEC:-}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
stamp="$VENV/.installed-$( (cat pyproject.toml; echo "$DJANGO_SPEC") | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # shellcheck disable=SC2086  # DJANGO_SPEC is one requirement or nothing
  "$VENV/bin/python" -m pip install -q -e '.[dev]' ${DJANGO_SPEC:+"$DJANGO_SPEC"}
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
