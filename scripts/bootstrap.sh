#!/usr/bin/env bash
# Create a venv (default .venv) and install the project, editable, with its development
# dependency groups (default "dev": everything; "example" is what the example project needs),
# once per change of pyproject.toml or of what is asked for.
#   PYTHON=python3.13     the interpreter the venv is made with (default python3)
#   DEP_GROUPS="lint docs"  dependency groups of pyproject.toml (PEP 735)
#   EXTRAS=mysql          the package's own extras (mysql needs `scripts/system-deps.sh mysql`)
#   DJANGO_SPEC="django>=5.2,<6.0"  pins a Django release line
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
DEP_GROUPS=${DEP_GROUPS:-dev}
EXTRAS=${EXTRAS:-}
DJANGO_SPEC=${DJANGO_SPEC:-}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
wanted="$DEP_GROUPS|$EXTRAS|$DJANGO_SPEC"
stamp="$VENV/.installed-$( (cat pyproject.toml; echo "$wanted") | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  # pip 25.1 is the first to install dependency groups (--group).
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade "pip>=25.1"
  groups=()
  for group in $DEP_GROUPS; do groups+=(--group "$group"); done
  # shellcheck disable=SC2086  # DJANGO_SPEC is one requirement or nothing
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    -e ".${EXTRAS:+[$EXTRAS]}" "${groups[@]}" ${DJANGO_SPEC:+"$DJANGO_SPEC"}
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
