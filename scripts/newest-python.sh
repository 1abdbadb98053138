#!/usr/bin/env bash
# Print the newest Python 3.12+ interpreter on this machine (Django 6.x needs 3.12), or
# nothing. Looks on PATH (python3.12 ... python3.19, python3) and in pyenv's versions; a
# candidate counts only if it runs and can make a venv.
set -u
candidates=()
for minor in 19 18 17 16 15 14 13 12; do
  command -v "python3.$minor" >/dev/null 2>&1 && candidates+=("$(command -v "python3.$minor")")
done
command -v python3 >/dev/null 2>&1 && candidates+=("$(command -v python3)")
if command -v pyenv >/dev/null 2>&1; then
  for python in "$(pyenv root)"/versions/3.*/bin/python3; do
    [ -x "$python" ] && candidates+=("$python")
  done
fi
best= best_version=0
for python in "${candidates[@]}"; do
  version=$("$python" -c 'import sys, venv, ensurepip; v = sys.version_info; print(v[0] * 100 + v[1]) if v >= (3, 12) else None' 2>/dev/null) || continue
  [ -n "$version" ] || continue
  if [ "$version" -gt "$best_version" ]; then
    best=$python best_version=$version
  fi
done
[ -n "$best" ] && echo "$best"
exit 0
