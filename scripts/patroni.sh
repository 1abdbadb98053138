#!/usr/bin/env bash
# A private three-node PostgreSQL cluster under Patroni, with a one-node etcd as its DCS,
# for the patroni pass (scripts/passes.sh; docs/high-availability.md).
#
#   scripts/patroni.sh start        # etcd on 127.0.0.1:$PATRONI_ETCD_PORT (23791), PostgreSQL
#                                   # on 5511-5513, Patroni's REST API on 8011-8013; returns
#                                   # once one node leads and, in synchronous mode, one
#                                   # standby is synchronous
#   scripts/patroni.sh node N       # (re)start node N's Patroni (after a test killed it)
#   scripts/patroni.sh url [DB]     # the multi-host URL of database DB (idempotency)
#   scripts/patroni.sh stop
#
# Everything lives in $PATRONI_DIR (/tmp/idempotency-ha-patroni by default) and runs as the
# postgres user, from Debian's packages (patroni, etcd-server, PostgreSQL 15); the machine's
# own PostgreSQL is not touched. PATRONI_SYNC=strict (default) bootstraps with
# synchronous_mode and synchronous_mode_strict, PATRONI_SYNC=off with asynchronous
# replication; a test changes it at run time through the REST API (PATCH /config).
# A few seconds of ttl and loop_wait so that a failover takes seconds, not half a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${PATRONI_DIR:-/tmp/idempotency-ha-patroni}
ETCD_PORT=${PATRONI_ETCD_PORT:-23791}
ETCD_PEER_PORT=${PATRONI_ETCD_PEER_PORT:-23801}
PG_PORT=${PATRONI_PG_PORT:-5511}     # node N listens on PG_PORT + N - 1
API_PORT=${PATRONI_API_PORT:-8011}   # and answers Patroni's REST API on API_PORT + N - 1
NODES=${PATRONI_NODES:-3}
SYNC=${PATRONI_SYNC:-strict}
BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}
SCOPE=idempotency-ha

# As the postgres user (PostgreSQL refuses to run as root), by exec: a process started in
# the background with it is the one whose pid $! is.
AS_POSTGRES=()
if [ "$(id -u)" -eq 0 ]; then AS_POSTGRES=(setpriv --reuid=postgres --regid=postgres --init-groups --); fi

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop() {
  for n in $(seq "$NODES"); do
    if alive "$DIR/patroni$n.pid"; then kill -KILL "$(cat "$DIR/patroni$n.pid")" || true; fi
    if "${AS_POSTGRES[@]}" "$BIN/pg_ctl" -D "$DIR/node$n" status >/dev/null 2>&1; then
      "${AS_POSTGRES[@]}" "$BIN/pg_ctl" -D "$DIR/node$n" -m immediate -w stop >/dev/null 2>&1 || true
    fi
  done
  if alive "$DIR/etcd.pid"; then
    kill "$(cat "$DIR/etcd.pid")" || true
    sleep 0.5
  fi
  rm -rf "$DIR"
}

config() {
  local n=$1 sync=false strict=false
  if [ "$SYNC" = strict ]; then sync=true strict=true; fi
  cat <<EOF
scope: $SCOPE
name: node$n
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:$((API_PORT + n - 1))
  connect_address: 127.0.0.1:$((API_PORT + n - 1))
etcd3:
  hosts: 127.0.0.1:$ETCD_PORT
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 2
    retry_timeout: 3
    maximum_lag_on_failover: 1048576
    synchronous_mode: $sync
    synchronous_mode_strict: $strict
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        max_connections: 100
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 128MB
        # Loopback test clusters: a killed process loses nothing the kernel holds.
        fsync: "off"
  initdb:
    - encoding: UTF8
    - locale: C.UTF-8
    - auth: trust
postgresql:
  listen: 127.0.0.1:$((PG_PORT + n - 1))
  connect_address: 127.0.0.1:$((PG_PORT + n - 1))
  data_dir: $DIR/node$n
  bin_dir: $BIN
  pgpass: $DIR/pgpass$n
  authentication:
    superuser: {username: postgres}
    replication: {username: postgres}
    rewind: {username: postgres}
  parameters:
    unix_socket_directories: $DIR
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
EOF
}

start_node() {
  local n=$1
  if alive "$DIR/patroni$n.pid"; then return; fi
  [ -s "$DIR/patroni$n.yml" ] || config "$n" >"$DIR/patroni$n.yml"
  # From its own directory: its processes re-enter the working directory, which a clone in
  # a private temporary directory (mktemp -d) does not let the postgres user into.
  (cd "$DIR" && exec "${AS_POSTGRES[@]}" patroni "$DIR/patroni$n.yml" >>"$DIR/patroni$n.log" 2>&1) &
  echo $! >"$DIR/patroni$n.pid"
}

api() { curl -s --noproxy '*' -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((API_PORT + $1 - 1))/$2"; }

wait_for() {
  local what=$1 seconds=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    if [ $SECONDS -ge $deadline ]; then
      echo "patroni.sh: $what within ${seconds}s failed; the logs:" >&2
      tail -n 30 "$DIR"/*.log >&2 || true
      exit 1
    fi
    sleep 0.5
  done
}

leader() {
  for n in $(seq "$NODES"); do [ "$(api "$n" primary)" = 200 ] && return 0; done
  return 1
}

replicas() {
  local count=0
  for n in $(seq "$NODES"); do [ "$(api "$n" "replica?lag=1MB")" = 200 ] && count=$((count + 1)); done
  [ "$count" -eq $((NODES - 1)) ]
}

synchronous() {
  for n in $(seq "$NODES"); do [ "$(api "$n" synchronous)" = 200 ] && return 0; done
  return 1
}

start() {
  stop
  mkdir -p "$DIR"
  [ "$(id -u)" -ne 0 ] || chown postgres "$DIR"
  "${AS_POSTGRES[@]}" etcd --name etcd1 --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "etcd1=http://127.0.0.1:$ETCD_PEER_PORT" \
    --log-level warn >"$DIR/etcd.log" 2>&1 &
  echo $! >"$DIR/etcd.pid"
  wait_for "etcd up" 30 curl -sf --noproxy '*' -m 2 -o /dev/null "http://127.0.0.1:$ETCD_PORT/health"
  # The first node bootstraps the cluster; the others clone it once it leads.
  start_node 1
  wait_for "a leader" 60 leader
  for n in $(seq 2 "$NODES"); do start_node "$n"; done
  wait_for "every standby streaming" 90 replicas
  if [ "$SYNC" = strict ]; then wait_for "a synchronous standby" 30 synchronous; fi
  echo "Patroni cluster $SCOPE ($SYNC): PostgreSQL on 127.0.0.1:$PG_PORT-$((PG_PORT + NODES - 1)), REST API on $API_PORT-$((API_PORT + NODES - 1)), etcd on $ETCD_PORT, in $DIR"
}

url() {
  local pairs=""
  for n in $(seq "$NODES"); do pairs+="${pairs:+,}127.0.0.1:$((PG_PORT + n - 1))"; done
  # django-environ reads host:p,host:q as HOST "a,b" and PORT "p,q", libpq's multi-host form;
  # read-write: libpq skips the standbys, whichever node leads.
  echo "postgres://postgres@$pairs/${1:-idempotency}?target_session_attrs=read-write&connect_timeout=3"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  node) start_node "${2:?node number}" ;;
  url) url "${2:-}" ;;
  *) echo "usage: $0 start|stop|node N|url [DB]" >&2; exit 2 ;;
esac
