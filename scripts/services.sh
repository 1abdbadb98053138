#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) answer; start them if
# they are installed but down. Exits non-zero, loudly, when one cannot be reached: the
# suites that need them must fail, never skip.
set -u

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() {
  local name=$1 port=$2
  for _ in $(seq 1 30); do
    port_open "$port" && return 0
    sleep 1
  done
  echo "ERROR: $name is not reachable on 127.0.0.1:$port" >&2
  return 1
}

ensure_postgres() {
  port_open 5432 && return 0
  echo "PostgreSQL is down; starting it" >&2
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    for version in /etc/postgresql/*; do
      pg_ctlcluster --skip-systemctl-redirect "$(basename "$version")" main start || true
    done
  fi
  wait_for PostgreSQL 5432
}

ensure_redis() {
  port_open 6379 && return 0
  echo "Redis is down; starting it" >&2
  if command -v redis-server >/dev/null; then
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
      --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  fi
  wait_for Redis 6379
}

status=0
for service in "${@:-postgres redis}"; do
  for name in $service; do
    case "$name" in
      postgres) ensure_postgres || status=1 ;;
      redis) ensure_redis || status=1 ;;
      *) echo "unknown service $name" >&2; status=1 ;;
    esac
  done
done
exit $status
