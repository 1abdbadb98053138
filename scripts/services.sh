#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432), MariaDB (127.0.0.1:3306) and Redis (127.0.0.1:6379)
# answer; start them if they are installed but down. Exits non-zero, loudly, when one cannot be reached: the
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

ensure_mariadb() {
  if ! port_open 3306; then
    echo "MariaDB is down; starting it" >&2
    if [ -x /usr/sbin/mariadbd ]; then
      mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null
      start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
    fi
    wait_for MariaDB 3306 || return 1
  fi
  load_mariadb_time_zones
}

# Django converts datetimes to the current time zone in SQL (CONVERT_TZ: date_hierarchy,
# Trunc*): MariaDB needs its time zone tables for that, and ships them empty.
load_mariadb_time_zones() {
  local sql=(mariadb --user=root --host=127.0.0.1 --port=3306 --batch --skip-column-names)
  local zones
  if ! zones=$("${sql[@]}" -e "SELECT COUNT(*) FROM mysql.time_zone_name"); then
    echo "ERROR: MariaDB answers on 127.0.0.1:3306 but root cannot log in" >&2
    return 1
  fi
  [ "$zones" != 0 ] && return 0
  echo "Loading MariaDB's time zone tables" >&2
  mariadb-tzinfo-to-sql /usr/share/zoneinfo 2>/dev/null | "${sql[@]}" mysql
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
      mariadb) ensure_mariadb || status=1 ;;
      redis) ensure_redis || status=1 ;;
      *) echo "unknown service $name" >&2; status=1 ;;
    esac
  done
done
exit $status
