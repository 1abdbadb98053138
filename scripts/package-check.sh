#!/usr/bin/env bash
# The package pass of scripts/passes.sh. Build the sdist and the wheel, check them (twine
# check --strict, LICENSE and py.typed inside), install the wheel into a fresh venv on the
# newest Python here, and run the sdist's own sqlite pass against that install, and where
# that Python is 3.12+ (so Django 6.1) its postgres-prepared pass too. Extra arguments go
# to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== packages: build, twine check --strict"
.venv/bin/python -m build --quiet --outdir "$work/dist" . >/dev/null
.venv/bin/python -m twine check --strict "$work"/dist/*
wheel=$(ls "$work"/dist/*.whl)
sdist=$(ls "$work"/dist/*.tar.gz)
.venv/bin/python - "$wheel" "$sdist" <<'PY'
import sys, tarfile, zipfile
wheel, sdist = sys.argv[1:]
in_wheel = zipfile.ZipFile(wheel).namelist()
in_sdist = [name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name]
need = {
    "wheel": (in_wheel, ["idempotency/py.typed", "LICENSE", "idempotency/migrations/0001_initial.py"]),
    "sdist": (in_sdist, ["LICENSE", "conftest.py", "tests/conftest.py", "tests/settings.py",
                         "example_project/settings.py", "docs/index.md", "manage.py"]),
}
missing = [f"{kind}: {path}" for kind, (names, paths) in need.items()
           for path in paths if not any(name == path or name.endswith("/" + path) for name in names)]
if missing:
    sys.exit("missing from the packages: " + ", ".join(missing))
print(f"{len(in_wheel)} files in the wheel, {len(in_sdist)} in the sdist; LICENSE in both")
PY

python=$(bash scripts/newest-python.sh)
python=${python:-python3}
tar -xzf "$sdist" -C "$work"
src=$(ls -d "$work"/django_idempotency-*/)
# The suite must import the installed wheel, not the sources beside it.
rm -rf "$src/idempotency"
"$python" -m venv "$work/venv"
vpy=$work/venv/bin/python
"$vpy" -m pip install -q --disable-pip-version-check --upgrade "pip>=25.1"
"$vpy" -m pip install -q --disable-pip-version-check "$wheel" --group "${src}pyproject.toml:test"
cd "$src"
installed=$("$vpy" -c 'import idempotency; print(idempotency.__file__)')
case "$installed" in
  "$work/venv/"*) ;;
  *) echo "ERROR: the suite would import $installed, not the installed wheel" >&2; exit 1 ;;
esac
# The sdist's own scripts/passes.sh, with the venv's Python.
echo "== the sdist's suite against the installed wheel"
PY=$vpy bash scripts/passes.sh sqlite -q -p no:cacheprovider "$@"
if "$vpy" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
  PY=$vpy TEST_DATABASE_NAME=${TEST_DATABASE_NAME:-test_idempotency_newest} \
    bash scripts/passes.sh postgres-prepared -p no:cacheprovider "$@"
else
  echo "== no Python 3.12+ on this machine: Django 6.x not tested here (5.2 ran above)"
fi
cd "$root"
