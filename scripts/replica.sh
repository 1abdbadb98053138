#!/usr/bin/env bash
# A private PostgreSQL primary and a hot standby streaming from it, for the replica
# pass (scripts/passes.sh; docs/databases.md, "Read replicas").
#
#   scripts/replica.sh start   # primary on 127.0.0.1:$REPLICA_PRIMARY_PORT (5491),
#                              # standby on 127.0.0.1:$REPLICA_STANDBY_PORT (5492)
#   scripts/replica.sh test    # start, run the replica pass once, stop (scripts/passes.sh)
#   scripts/replica.sh stop
#
# Both clusters live in $REPLICA_DIR (under /tmp by default) and run as the postgres
# user; the machine's own PostgreSQL is not touched. The standby is made with
# pg_basebackup -R and applies each commit $REPLICA_DELAY (3s) late
# (recovery_min_apply_delay), so what a test reads from it really lags.
set -euo pipefail
cd "$(dirname "$0")/.."
PRIMARY_PORT=${REPLICA_PRIMARY_PORT:-5491}
STANDBY_PORT=${REPLICA_STANDBY_PORT:-5492}
DIR=${REPLICA_DIR:-/tmp/idempotency-replica-$PRIMARY_PORT}
DELAY=${REPLICA_DELAY:-3s}
BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}

as_postgres() {
  if [ "$(id -u)" -eq 0 ]; then
    su postgres -s /bin/bash -c "$(printf '%q ' "$@")"
  else
    "$@"
  fi
}

stop() {
  for cluster in standby primary; do
    if [ -f "$DIR/$cluster/postmaster.pid" ]; then
      as_postgres "$BIN/pg_ctl" -D "$DIR/$cluster" -m immediate -w stop >/dev/null || true
    fi
  done
  rm -rf "$DIR"
}

start() {
  stop
  mkdir -p "$DIR"
  [ "$(id -u)" -ne 0 ] || chown postgres "$DIR"
  as_postgres "$BIN/initdb" -D "$DIR/primary" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
  cat >>"$DIR/primary/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PRIMARY_PORT
unix_socket_directories = '$DIR'
wal_level = replica
max_wal_senders = 4
max_connections = 100
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
  echo "host replication postgres 127.0.0.1/32 trust" >>"$DIR/primary/pg_hba.conf"
  as_postgres "$BIN/pg_ctl" -D "$DIR/primary" -l "$DIR/primary.log" -w start >/dev/null
  as_postgres "$BIN/pg_basebackup" -h 127.0.0.1 -p "$PRIMARY_PORT" -U postgres \
    -D "$DIR/standby" -R -X stream -c fast
  cat >>"$DIR/standby/postgresql.conf" <<EOF
port = $STANDBY_PORT
hot_standby = on
recovery_min_apply_delay = '$DELAY'
EOF
  as_postgres "$BIN/pg_ctl" -D "$DIR/standby" -l "$DIR/standby.log" -w start >/dev/null
  in_recovery=$(as_postgres "$BIN/psql" -h 127.0.0.1 -p "$STANDBY_PORT" -U postgres -d postgres \
    -Atc "SELECT pg_is_in_recovery()")
  [ "$in_recovery" = t ] || { echo "the standby is not in recovery" >&2; exit 1; }
  echo "PostgreSQL primary on 127.0.0.1:$PRIMARY_PORT, hot standby on 127.0.0.1:$STANDBY_PORT ($DELAY behind), in $DIR"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  test)
    shift
    exec bash scripts/passes.sh replica "$@"
    ;;
  *) echo "usage: $0 start|stop|test [pytest arguments]" >&2; exit 2 ;;
esac
