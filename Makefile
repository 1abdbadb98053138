.PHONY: example test lint replica

# Run the example project (SQLite unless DATABASE_URL is set) on ADDR, default
# 127.0.0.1:8000: `make example PORT=8080` or `make example ADDR=0.0.0.0:8000`.
example:
	ADDR="$(ADDR)" PORT="$(PORT)" bash scripts/example.sh

# The full suite: ruff, mypy, docs, all tests on SQLite, PostgreSQL and MariaDB on
# Django 5.2, and on Django 6.1 where a Python 3.12+ is installed; the packages built
# and their tests run from the sdist.
test:
	bash scripts/test.sh

lint:
	bash scripts/bootstrap.sh
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy

# The replica tests alone: a private primary and a lagging hot standby, started and
# stopped around them (scripts/replica.sh; scripts/test.sh runs it once).
replica:
	bash scripts/replica.sh test
