#!/usr/bin/env bash
# Debian packages the full suite needs, installed when missing:
#   browser: Chromium and its driver for the browser test (browser downloads by test tools
#            do not work on these machines, so we use the distribution's build);
#   mysql:   the MariaDB client library and pkg-config, which mysqlclient (the `mysql`
#            extra) is built against;
#   pgbouncer: Debian's PgBouncer, for the pass through a pooler in transaction mode
#            (scripts/pgbouncer.sh runs a private one; the system service stays off);
#   valgrind: callgrind, for benchmarks/instructions.py (its smoke test runs in the suite);
#   spin:    the Spin model checker, for scripts/model-check.sh (it compiles with gcc);
#   patroni: Patroni and etcd, for the failover pass (scripts/patroni.sh runs a private
#            cluster of the machine's PostgreSQL, polled with curl; the packages' own
#            services are not used);
#   galera:  the Galera provider and rsync (its state transfers), for the galera pass
#            (scripts/galera.sh runs a private cluster of the machine's MariaDB server).
# Usage: system-deps.sh [browser] [mysql] [pgbouncer] [valgrind] [spin] [patroni] [galera]
#        (no argument: all seven)
set -euo pipefail
missing=()
for need in "${@:-browser mysql pgbouncer valgrind spin patroni galera}"; do
  for name in $need; do
    case "$name" in
      browser)
        [ -x /usr/bin/chromium ] || missing+=(chromium)
        [ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
        ;;
      mysql)
        dpkg -s libmariadb-dev >/dev/null 2>&1 || missing+=(libmariadb-dev)
        command -v pkg-config >/dev/null || missing+=(pkg-config)
        ;;
      pgbouncer)
        [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
        ;;
      valgrind)
        command -v valgrind >/dev/null || missing+=(valgrind)
        ;;
      spin)
        command -v spin >/dev/null || missing+=(spin)
        command -v gcc >/dev/null || missing+=(gcc)
        ;;
      patroni)
        command -v patroni >/dev/null || missing+=(patroni)
        [ -x /usr/bin/etcd ] || missing+=(etcd-server)
        command -v curl >/dev/null || missing+=(curl)
        ;;
      galera)
        [ -f /usr/lib/galera/libgalera_smm.so ] || missing+=(galera-4)
        command -v rsync >/dev/null || missing+=(rsync)
        [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
        ;;
      *) echo "unknown system dependency group $name" >&2; exit 2 ;;
    esac
  done
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
echo "Installing Debian packages: ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
