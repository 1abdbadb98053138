#!/usr/bin/env bash
# Every pass CI runs, written once. `make test` (and .ci/run) is scripts/test.sh, which sets
# the machine up and runs `passes.sh ci`; tox.ini's environments run the database passes on
# any Python x Django; scripts/package-check.sh runs two of them against the installed wheel.
#
#   bash scripts/passes.sh ci                    # all of them, in CI's order (below)
#   bash scripts/passes.sh NAME [pytest args]    # one of them
#
# pass               database (env)                       what runs
# lint               -                                    ruff check, ruff format --check
# mypy               -                                    mypy (django-stubs)
# docs               -                                    mkdocs build --strict; scripts/offline_site.py:
#                                                         no page loads anything from another host
# model              -                                    scripts/model-check.sh: Spin verifies the
#                                                         protocol model and catches its seeded flaws
# sqlite             SQLite (DATABASE_URL unset)          pytest -m "not postgres and not mariadb and not server_db"
# postgres           PG_DATABASE_URL                      pytest -m "$PG_TESTS"
# postgres-prepared  PG_DATABASE_URL, PREPARED_STATEMENTS pytest -m "$PG_TESTS and not benchmarks" (psycopg's
#                                                         server-side binding; the benchmarks' smoke
#                                                         tests run once, in the postgres pass)
# mariadb            MARIADB_DATABASE_URL                 pytest -m "not postgres and not galera"
# pgbouncer          PG_DATABASE_URL through PgBouncer    pytest -m "not session and not mariadb" $PGBOUNCER_TESTS
# replica            a private primary and hot standby    pytest -m replica tests/deployment/test_replica.py
# topology           PG_DATABASE_URL                      pytest -q -m topology tests/deployment/test_topology.py
# patroni            a private Patroni cluster (3 nodes)  pytest -m patroni tests/deployment/test_patroni.py:
#                                                         the primary killed under load, synchronous
#                                                         (strict) then asynchronous; figures printed
# galera             a private Galera cluster (3 nodes)   pytest -m galera tests/deployment/test_galera.py:
#                                                         duplicates on different nodes, lagging nodes
# tenants            PG_DATABASE_URL, settings of its own pytest -m tenants: a database per tenant
#                                                         (tests.deployment.shards_settings), a schema
#                                                         per tenant (tests.deployment.tenants_settings)
# ninja              SQLite                               pytest tests/unit/test_ninja.py
# ninja-releases     SQLite                               the ninja pass on each admitted django-ninja release
# package            SQLite, then PostgreSQL              build, check, install the wheel; sqlite and
#                                                         postgres-prepared from the sdist against it
#
# CI runs them on Django 5.2 LTS in .venv (PY), except the package pass, whose venv has the
# newest Django the newest Python here takes (6.1 on 3.12+); postgres-prepared runs on 5.2
# only when there is no such Python. PY is the Python that runs pytest (.venv/bin/python);
# TEST_DATABASE_NAME, when set, names the test database of every database pass. The passes
# on a server database run only the tests that reach a database (DATABASE_TESTS_ONLY,
# tests/conftest.py): the rest run in the sqlite pass, and in the package pass on the
# newest Django.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PG_URL=${PG_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/idempotency}
MARIADB_URL=${MARIADB_DATABASE_URL:-mysql://root@127.0.0.1:3306/idempotency}
# The deployment passes run their own markers, once each; the main PostgreSQL passes leave
# them out.
PG_TESTS="not mariadb and not pgbouncer and not replica and not topology and not tenants and not patroni"
# What a transaction pooler could break: concurrency, transactions, HTTP, Celery, outages.
PGBOUNCER_TESTS="tests/deployment/test_pgbouncer.py tests/deployment/test_pgbouncer_outage.py
  tests/protocol/test_concurrency.py tests/protocol/test_lease.py tests/protocol/test_waiting.py
  tests/unit/stores/test_postgres.py tests/example/test_http.py tests/example/test_ninja_http.py
  tests/protocol/test_async.py tests/protocol/test_celery.py"
CI="lint mypy docs model sqlite postgres postgres-prepared mariadb pgbouncer replica topology
  patroni galera tenants ninja-releases package"

versions() {
  "$PY" -c 'import sys, django; print(f"Django {django.get_version()}, Python {sys.version.split()[0]}")'
}

run_pass() {
  local name=$1
  shift
  case "$name" in
    lint)
      echo "== ruff"
      "$PY" -m ruff check .
      "$PY" -m ruff format --check .
      ;;
    mypy)
      echo "== mypy"
      "$PY" -m mypy
      ;;
    docs)
      echo "== docs build, and no request of the site to another host"
      local site
      site=$(mktemp -d)
      "$PY" -m mkdocs build --strict --quiet --site-dir "$site"
      "$PY" scripts/offline_site.py "$site"
      rm -rf "$site"
      ;;
    model)
      echo "== the protocol model, checked by Spin (docs/trust.md)"
      bash scripts/model-check.sh
      ;;
    sqlite)
      echo "== tests on SQLite, $(versions)"
      env -u DATABASE_URL "$PY" -m pytest -m "not postgres and not mariadb and not server_db" "$@"
      ;;
    postgres)
      echo "== tests on PostgreSQL, $(versions)"
      DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 DATABASE_TESTS_ONLY=1 "$PY" -m pytest -m "$PG_TESTS" "$@"
      ;;
    postgres-prepared)
      echo "== tests on PostgreSQL, prepared statements (server-side binding, prepare_threshold 0), $(versions)"
      DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 PREPARED_STATEMENTS=1 DATABASE_TESTS_ONLY=1 \
        "$PY" -m pytest -q -m "$PG_TESTS and not benchmarks" "$@"
      ;;
    mariadb)
      echo "== tests on MariaDB, $(versions)"
      DATABASE_URL=$MARIADB_URL REQUIRE_MARIADB=1 DATABASE_TESTS_ONLY=1 \
        "$PY" -m pytest -q -m "not postgres and not galera" "$@"
      ;;
    pgbouncer) pgbouncer_pass "$@" ;;
    replica)
      echo "== tests against a streaming replica (a private primary and a hot standby 3 s behind)"
      bash scripts/replica.sh start
      trap 'bash scripts/replica.sh stop' EXIT
      DATABASE_URL="postgres://postgres@127.0.0.1:${REPLICA_PRIMARY_PORT:-5491}/idempotency" \
        REPLICA_URL="postgres://postgres@127.0.0.1:${REPLICA_STANDBY_PORT:-5492}/idempotency" \
        REQUIRE_POSTGRES=1 TEST_DATABASE_NAME=${TEST_DATABASE_NAME:-test_idempotency_replica} \
        "$PY" -m pytest -q -p no:cacheprovider -m replica tests/deployment/test_replica.py "$@"
      bash scripts/replica.sh stop
      trap - EXIT
      ;;
    topology)
      echo "== several servers and workers on one database: 3 gunicorn instances (one killed), 2 Celery workers and beat"
      DATABASE_URL=$PG_URL REQUIRE_POSTGRES=1 "$PY" -m pytest -q -m topology tests/deployment/test_topology.py "$@"
      ;;
    patroni)
      echo "== a Patroni cluster (etcd, 3 PostgreSQL nodes) whose primary is killed under load"
      bash scripts/patroni.sh start
      trap 'bash scripts/patroni.sh stop' EXIT
      DATABASE_URL=$(bash scripts/patroni.sh url) REQUIRE_POSTGRES=1 \
        "$PY" -m pytest -q -p no:cacheprovider -m patroni tests/deployment/test_patroni.py "$@"
      bash scripts/patroni.sh stop
      trap - EXIT
      ;;
    galera)
      echo "== a Galera cluster (3 MariaDB nodes): duplicates on different nodes, lagging nodes"
      bash scripts/galera.sh start
      trap 'bash scripts/galera.sh stop' EXIT
      DATABASE_URL=$(bash scripts/galera.sh url 1) REQUIRE_MARIADB=1 \
        GALERA_URLS="$(for n in 1 2 3; do bash scripts/galera.sh url $n; done)" \
        "$PY" -m pytest -q -p no:cacheprovider -m galera tests/deployment/test_galera.py "$@"
      bash scripts/galera.sh stop
      trap - EXIT
      ;;
    tenants)
      echo "== tenants: a database per tenant behind a router; a schema per tenant (django-tenants)"
      local run=(env DATABASE_URL="$PG_URL" REQUIRE_POSTGRES=1
        TEST_DATABASE_NAME="${TEST_DATABASE_NAME:-test_idempotency}_tenants"
        "$PY" -m pytest -q -p no:cacheprovider -m tenants)
      "${run[@]}" --ds=tests.deployment.shards_settings tests/deployment/test_database_per_tenant.py "$@"
      "${run[@]}" --ds=tests.deployment.tenants_settings tests/deployment/test_schema_per_tenant.py "$@"
      ;;
    ninja)
      echo "== ninja adapter on django-ninja $("$PY" -c 'import importlib.metadata as m; print(m.version("django-ninja"))'), SQLite"
      env -u DATABASE_URL "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_ninja.py "$@"
      ;;
    ninja-releases) bash scripts/ninja-releases.sh "$@" ;;
    package) bash scripts/package-check.sh "$@" ;;
    ci) ci "$@" ;;
    *)
      echo "unknown pass: $name (one of: $(echo $CI) ci)" >&2
      exit 2
      ;;
  esac
}

pgbouncer_pass() {
  echo "== tests through PgBouncer (transaction pooling): concurrency, transactions, HTTP, Celery; atomic and lease mode"
  local port=${PGBOUNCER_PORT:-6433}
  local url test_db=${TEST_DATABASE_NAME:-test_idempotency_pgbouncer}
  url=$(echo "$PG_URL" | sed -E "s#@([^:/]+)(:[0-9]+)?/#@127.0.0.1:$port/#")
  PGBOUNCER_PORT=$port bash scripts/pgbouncer.sh start
  trap "PGBOUNCER_PORT=$port bash scripts/pgbouncer.sh stop" EXIT
  # --reuse-db: PgBouncer keeps server connections to the test database, so it is created
  # through it but dropped directly, with FORCE, afterwards.
  # shellcheck disable=SC2086  # PGBOUNCER_TESTS is a list of paths
  PGBOUNCER=1 DATABASE_URL=$url TEST_DATABASE_NAME=$test_db REQUIRE_POSTGRES=1 \
    "$PY" -m pytest -q --reuse-db -p no:cacheprovider -m "not session and not mariadb" $PGBOUNCER_TESTS "$@"
  PGBOUNCER_PORT=$port bash scripts/pgbouncer.sh stop
  trap - EXIT
  psql "${PG_URL%/*}/postgres" -qc "DROP DATABASE IF EXISTS $test_db WITH (FORCE)"
}

ci() {
  local began
  for name in $CI; do
    # Where a Python 3.12+ is here, the package pass runs this one on Django 6.1.
    if [ "$name" = postgres-prepared ] && [ -n "$(bash scripts/newest-python.sh)" ]; then
      continue
    fi
    began=$SECONDS
    run_pass "$name" "$@"
    echo "== pass $name took $((SECONDS - began)) s"
  done
}

if [ $# -eq 0 ]; then
  echo "usage: $0 PASS [pytest arguments], PASS one of: $(echo $CI) ci" >&2
  exit 2
fi
run_pass "$@"
