#!/usr/bin/env bash
# A private PgBouncer in transaction pooling mode in front of the machine's PostgreSQL,
# for the suite's pass through a pooler (docs/databases.md, "Behind PgBouncer").
#
#   scripts/pgbouncer.sh start   # listens on 127.0.0.1:$PGBOUNCER_PORT (6433: not the
#                                # port of a system pgbouncer, 6432)
#   scripts/pgbouncer.sh stop
#
# Its configuration, pid file and log live in $PGBOUNCER_DIR (a directory of its own
# under /tmp by default); the system's pgbouncer service and /etc/pgbouncer are never
# touched. Every database of the server behind it is reachable by name, trust auth.
# As root it runs as the postgres user (PgBouncer refuses to run as root).
set -euo pipefail
PORT=${PGBOUNCER_PORT:-6433}
DIR=${PGBOUNCER_DIR:-/tmp/idempotency-pgbouncer-$PORT}
PG_HOST=${PGBOUNCER_TARGET_HOST:-127.0.0.1}
PG_PORT=${PGBOUNCER_TARGET_PORT:-5432}
PGBOUNCER=${PGBOUNCER_BIN:-/usr/sbin/pgbouncer}

stop() {
  if [ -f "$DIR/pgbouncer.pid" ]; then
    pid=$(cat "$DIR/pgbouncer.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$DIR/pgbouncer.pid"
  fi
}

start() {
  [ -x "$PGBOUNCER" ] || bash "$(dirname "$0")/system-deps.sh" pgbouncer
  stop
  mkdir -p "$DIR"
  cat >"$DIR/pgbouncer.ini" <<EOF
[databases]
* = host=$PG_HOST port=$PG_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
; The tests ask its console (database pgbouncer) that they really are behind it.
admin_users = postgres
auth_file = $DIR/userlist.txt
pool_mode = transaction
; The suite opens many connections at once (threads, gunicorn workers, Celery).
max_client_conn = 500
default_pool_size = 40
; Django sends these at connect time; PgBouncer would refuse the unknown ones.
ignore_startup_parameters = extra_float_digits,options
logfile = $DIR/pgbouncer.log
pidfile = $DIR/pgbouncer.pid
EOF
  echo '"postgres" ""' >"$DIR/userlist.txt"
  : >"$DIR/pgbouncer.log"
  user=()
  if [ "$(id -u)" -eq 0 ]; then
    chown -R postgres "$DIR"
    user=(-u postgres)
  fi
  "$PGBOUNCER" -d -q "${user[@]}" "$DIR/pgbouncer.ini"
  for _ in $(seq 50); do
    if pg_isready -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres; then
      echo "PgBouncer (transaction pooling) on 127.0.0.1:$PORT, in $DIR"
      return 0
    fi
    sleep 0.1
  done
  echo "PgBouncer did not start on 127.0.0.1:$PORT; its log:" >&2
  cat "$DIR/pgbouncer.log" >&2
  return 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
