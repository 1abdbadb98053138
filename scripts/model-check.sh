#!/usr/bin/env bash
# Model-check the record protocol (model/protocol.pml) with Spin, exhaustively at the
# model's bounds: every property in both modes, then every seeded flaw, which must fail.
#
#   bash scripts/model-check.sh            # all of it (CI's `model` pass)
#   KEEP=1 bash scripts/model-check.sh     # keep the work directory (pan, trails)
#
# Exits non-zero when a property is not verified or a seeded flaw is not caught: a flaw
# the checker misses means the checker proves less than docs/trust.md says.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=$PWD/model/protocol.pml
command -v spin >/dev/null || {
  echo "spin is not installed (bash scripts/system-deps.sh spin)" >&2
  exit 2
}
work=$(mktemp -d "${TMPDIR:-/tmp}/model-check.XXXXXX")
if [ -z "${KEEP:-}" ]; then
  trap 'rm -rf "$work"' EXIT
else
  echo "work directory: $work"
fi
# A ceiling, not a bound of the model: the deepest run is a few hundred steps.
DEPTH=10000
# Safety runs need no cycle detection; the liveness run does (with weak fairness, -f).
SAFETY_CC=(-O2 -DSAFETY -DMEMLIM=4096)
LIVENESS_CC=(-O2 -DMEMLIM=6144 -DNFAIR=3) # weak fairness over all the processes
failed=0

# build NAME "SPIN FLAGS" "CC FLAGS": spin -a and gcc in a directory of its own.
build() {
  local dir=$work/$1
  mkdir -p "$dir"
  (cd "$dir" && spin -a $2 "$MODEL" >spin.out && gcc $3 -o pan pan.c 2>gcc.out) || {
    echo "build failed: $1" >&2
    cat "$dir/spin.out" "$dir/gcc.out" >&2
    exit 2
  }
}

# check DIR PROPERTY [PAN FLAGS]: runs pan, leaves its output in DIR/PROPERTY.out
check() {
  local dir=$work/$1 property=$2
  shift 2
  (cd "$dir" && ./pan -m$DEPTH -N "$property" "$@" >"$property.out" 2>&1) || true
}

field() { # field FILE: "N states, depth D, T s" from pan's report
  awk '/states, stored/ { s = $1 } /depth reached/ { d = $0; sub(/.*depth reached /, "", d); sub(/,.*/, "", d) }
       /elapsed time/ { t = $4 } END { printf "%s states, depth %s, %ss", s, d, t }' "$1"
}

verified() { # verified FILE: pan ran to the end and found nothing
  grep -q "errors: 0" "$1" && ! grep -q "reached -DMEMLIM bound\|max search depth too small" "$1"
}

property() { # property MODE DIR NAME [PAN FLAGS]
  local mode=$1 dir=$2 name=$3
  shift 3
  check "$dir" "$name" "$@"
  local out=$work/$dir/$name.out
  if verified "$out"; then
    printf 'verified  %-7s %-15s %s\n' "$mode" "$name" "$(field "$out")"
  else
    printf 'FAILED    %-7s %-15s %s\n' "$mode" "$name" "$(field "$out")"
    grep -E "violated|cycle|error|MEMLIM|too small" "$out" | head -5 | sed 's/^/          /'
    return 1
  fi
}

# in_parallel: runs its lines (commands) JOBS at a time, prints their output in order,
# and fails if any failed. The lease-mode runs take tens of seconds each.
in_parallel() {
  local i=0 line
  mkdir -p "$work/jobs"
  while IFS= read -r line; do
    i=$((i + 1))
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-2}" ]; do wait -n || true; done
    (eval "$line" >"$work/jobs/$i.out" 2>&1 || touch "$work/jobs/$i.failed") &
  done
  wait
  for ((n = 1; n <= i; n++)); do
    cat "$work/jobs/$n.out"
    [ ! -e "$work/jobs/$n.failed" ] || failed=1
  done
}

flaw() { # flaw FLAG MODE PROPERTY: the seeded flaw must make PROPERTY fail, with a trail
  local flag=$1 mode=$2 name=$3 spin_flags="-D$1" cc=("${SAFETY_CC[@]}") pan=()
  [ "$mode" = atomic ] && spin_flags="$spin_flags -DATOMIC"
  [ "$mode" = once ] && spin_flags="$spin_flags -DATOMIC -DWRITE_ONCE"
  if [ "$name" = settles ]; then
    spin_flags="$spin_flags $LIVENESS"
    cc=("${LIVENESS_CC[@]}")
    pan=(-a -f)
  fi
  local dir=$flag-$mode
  build "$dir" "$spin_flags" "${cc[*]}"
  check "$dir" "$name" "${pan[@]}"
  local out=$work/$dir/$name.out
  if grep -q "errors: [1-9]" "$out" && ls "$work/$dir"/*.trail >/dev/null 2>&1; then
    # The never claim of a safety property fails as "assertion violated !(!(...))"; the
    # table's own check in go() as "assertion violated ((SRC_...".
    what=$(grep -m1 -oE "acceptance cycle|assertion violated|invalid end state" "$out" || echo error)
    if grep -q "assertion violated.*SRC_\|assertion violated ((((" "$out"; then
      what="$what (the table's check in go())"
    elif [ "$what" = "assertion violated" ]; then
      what="$what (the property's never claim)"
    fi
    printf 'caught    %-7s %-23s %-15s %s; %s\n' "$mode" "$flag" "$name" "$what" "$(field "$out")"
  else
    printf 'MISSED    %-7s %-23s %-15s the seeded flaw was not caught\n' "$mode" "$flag" "$name"
    return 1
  fi
}

echo "== $(spin -V)"
echo "== properties (exhaustive, at the bounds stated in model/protocol.pml)"
build lease "" "${SAFETY_CC[*]}"
# Liveness at smaller bounds: weak fairness multiplies the states (3 duplicates take 4.5 GB
# and 4.5 minutes), and window expiry and the purge touch no record in flight.
LIVENESS="-DLIVENESS -DCLIENTS=2 -DEXPIRIES=0"
build lease-live "$LIVENESS" "${LIVENESS_CC[*]}"
build atomic "-DATOMIC" "${SAFETY_CC[*]}"
build once "-DATOMIC -DWRITE_ONCE" "${SAFETY_CC[*]}"
in_parallel <<'RUNS'
property atomic atomic one_effect
property atomic atomic true_replays
property atomic atomic fenced
property atomic atomic purge_safe
property atomic atomic all_or_nothing
property once once one_effect
property once once true_replays
property once once fenced
property once once purge_safe
property once once all_or_nothing
property lease lease one_effect
property lease lease true_replays
property lease lease fenced
property lease lease purge_safe
property lease lease-live settles -a -f
RUNS

echo "== seeded flaws (each must fail)"
in_parallel <<'RUNS'
flaw FLAW_NO_UNIQUE atomic one_effect
flaw FLAW_LOSER_COMMITS once one_effect
flaw FLAW_FINISH_OUTSIDE_TX atomic all_or_nothing
flaw FLAW_NO_EXPIRY_AT_CLAIM atomic true_replays
flaw FLAW_NO_FENCE lease fenced
flaw FLAW_PURGE_IN_FLIGHT lease purge_safe
flaw FLAW_NO_RECOVERY lease settles
RUNS

if [ "$failed" -ne 0 ]; then
  echo "model check FAILED" >&2
  exit 1
fi
echo "model check passed"
