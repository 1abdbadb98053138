#!/usr/bin/env bash
# A private three-node MariaDB Galera cluster, for the galera pass (scripts/passes.sh;
# docs/high-availability.md).
#
#   scripts/galera.sh start   # MariaDB on 127.0.0.1:$GALERA_PORT.. (3321-3323), group
#                             # communication on 4571-4573, IST on 4581-4583, SST (rsync)
#                             # on 4591-4593; returns once every node is Synced
#   scripts/galera.sh url N [DB]   # the URL of database DB (idempotency) on node N
#   scripts/galera.sh stop
#
# Everything lives in $GALERA_DIR (/tmp/idempotency-ha-galera by default) and runs as the
# mysql user, from Debian's packages (galera-4, MariaDB 10.11, rsync for the state
# transfers); the machine's own MariaDB is not touched. Node 1 bootstraps the cluster, the
# others join it by a state transfer, one at a time. One applier thread per node
# (wsrep_slave_threads = 1): a node applies the others' commits in order, a little late,
# as a loaded node does.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${GALERA_DIR:-/tmp/idempotency-ha-galera}
PORT=${GALERA_PORT:-3321}          # node N listens on PORT + N - 1
GCOMM_PORT=${GALERA_GCOMM_PORT:-4571}
IST_PORT=${GALERA_IST_PORT:-4581}
SST_PORT=${GALERA_SST_PORT:-4591}
NODES=${GALERA_NODES:-3}
MARIADBD=${MARIADBD:-/usr/sbin/mariadbd}
PROVIDER=${GALERA_PROVIDER:-/usr/lib/galera/libgalera_smm.so}

AS_MYSQL=()
if [ "$(id -u)" -eq 0 ]; then AS_MYSQL=(setpriv --reuid=mysql --regid=mysql --init-groups --); fi

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

sql() {
  local n=$1
  shift
  mariadb --no-defaults -uroot -h127.0.0.1 -P$((PORT + n - 1)) -N -B -e "$*"
}

stop() {
  for n in $(seq "$NODES" -1 1); do
    if alive "$DIR/node$n.pid"; then kill -KILL "$(cat "$DIR/node$n.pid")" || true; fi
  done
  # A state transfer's rsync daemon, if a join was under way (its pid file is the joiner's).
  for pidfile in "$DIR"/node*/rsync_sst.pid; do
    if alive "$pidfile"; then kill -KILL "$(cat "$pidfile")" || true; fi
  done
  rm -rf "$DIR"
}

config() {
  local n=$1 members=""
  for m in $(seq "$NODES"); do members+="${members:+,}127.0.0.1:$((GCOMM_PORT + m - 1))"; done
  cat <<EOF
[mariadbd]
datadir = $DIR/node$n
socket = $DIR/node$n.sock
pid-file = $DIR/node$n.mariadbd.pid
log-error = $DIR/node$n.err
port = $((PORT + n - 1))
bind-address = 127.0.0.1
skip-name-resolve
character-set-server = utf8mb4
collation-server = utf8mb4_unicode_ci
default-time-zone = '+00:00'
# What Galera requires: row-based replication, InnoDB, interleaved auto-increment locks.
binlog_format = ROW
default_storage_engine = InnoDB
innodb_autoinc_lock_mode = 2
innodb_buffer_pool_size = 64M
innodb_log_file_size = 32M
# Loopback test clusters: a killed process loses nothing the kernel holds.
innodb_flush_log_at_trx_commit = 0
max_connections = 200
wsrep_on = ON
wsrep_provider = $PROVIDER
wsrep_cluster_name = idempotency-ha
wsrep_cluster_address = gcomm://$members
wsrep_node_name = node$n
wsrep_node_address = 127.0.0.1
wsrep_provider_options = "gmcast.listen_addr=tcp://127.0.0.1:$((GCOMM_PORT + n - 1));ist.recv_addr=127.0.0.1:$((IST_PORT + n - 1));gcache.size=64M"
wsrep_sst_method = rsync
wsrep_sst_receive_address = 127.0.0.1:$((SST_PORT + n - 1))
wsrep_slave_threads = 1
EOF
}

start_node() {
  local n=$1
  shift
  "${AS_MYSQL[@]}" "$MARIADBD" --defaults-file="$DIR/node$n.cnf" "$@" >>"$DIR/node$n.out" 2>&1 &
  echo $! >"$DIR/node$n.pid"
}

synced() { [ "$(sql "$1" "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'WSREP_LOCAL_STATE_COMMENT'" 2>/dev/null)" = Synced ]; }

wait_for() {
  local what=$1 seconds=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    if [ $SECONDS -ge $deadline ] || ! alive "$DIR/node$n.pid"; then
      echo "galera.sh: $what within ${seconds}s failed; the logs:" >&2
      tail -n 30 "$DIR"/*.err >&2 || true
      exit 1
    fi
    sleep 0.5
  done
}

start() {
  stop
  mkdir -p "$DIR"
  [ "$(id -u)" -ne 0 ] || chown mysql:mysql "$DIR"
  for n in $(seq "$NODES"); do config "$n" >"$DIR/node$n.cnf"; done
  # Node 1's data directory is made here; the others get theirs by a state transfer.
  "${AS_MYSQL[@]}" mariadb-install-db --defaults-file="$DIR/node1.cnf" \
    --auth-root-authentication-method=normal --skip-test-db >"$DIR/install.log" 2>&1
  local n=1
  start_node 1 --wsrep-new-cluster
  wait_for "node 1 bootstrapping the cluster" 60 synced 1
  for n in $(seq 2 "$NODES"); do
    mkdir -p "$DIR/node$n"
    [ "$(id -u)" -ne 0 ] || chown mysql:mysql "$DIR/node$n"
    start_node "$n"
    wait_for "node $n joining" 90 synced "$n"
  done
  size=$(sql 1 "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'WSREP_CLUSTER_SIZE'")
  [ "$size" = "$NODES" ] || { echo "galera.sh: the cluster has $size nodes, not $NODES" >&2; exit 1; }
  echo "Galera cluster of $NODES nodes: MariaDB on 127.0.0.1:$PORT-$((PORT + NODES - 1)), in $DIR"
}

url() {
  echo "mysql://root@127.0.0.1:$((PORT + ${1:?node number} - 1))/${2:-idempotency}"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  url) url "${2:-}" "${3:-}" ;;
  *) echo "usage: $0 start|stop|url N [DB]" >&2; exit 2 ;;
esac
