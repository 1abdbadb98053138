#!/usr/bin/env bash
# The ninja pass of scripts/passes.sh (the django-ninja adapter's tests) on every ninja
# release that the `ninja` extra admits (the adapter uses ninja's result converter, which is
# not public API), in a venv of their own (.venv-ninja). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-ninja DEP_GROUPS=test DJANGO_SPEC="django>=5.2,<6.0" bash scripts/bootstrap.sh
PY=.venv-ninja/bin/python
spec=$("$PY" - <<'PY'
import tomllib
from packaging.requirements import Requirement
with open("pyproject.toml", "rb") as file:
    extra = tomllib.load(file)["project"]["optional-dependencies"]["ninja"]
print(Requirement(extra[0]).specifier)
PY
)
releases=$("$PY" -m pip index versions django-ninja --disable-pip-version-check 2>/dev/null \
  | sed -n 's/^Available versions: //p' | tr -d ' ' | tr ',' '\n' \
  | "$PY" -c "
import sys
from packaging.specifiers import SpecifierSet
from packaging.version import Version
admitted = SpecifierSet('$spec')
print(' '.join(sorted((v for v in sys.stdin.read().split() if Version(v) in admitted), key=Version)))
")
if [ -z "$releases" ]; then
  echo "ERROR: no django-ninja release found for $spec" >&2
  exit 1
fi
for release in $releases; do
  "$PY" -m pip install -q --disable-pip-version-check "django-ninja==$release"
  PY=$PY bash scripts/passes.sh ninja "$@"
done
