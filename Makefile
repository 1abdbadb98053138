.PHONY: example test lint replica

# Run the example project on http://127.0.0.1:8000/ (SQLite unless DATABASE_URL is set).
example:
	bash scripts/example.sh

# The full suite: ruff, mypy, all tests on SQLite, PostgreSQL and MariaDB.
test:
	bash scripts/test.sh

lint:
	bash scripts/bootstrap.sh
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy

# The replica tests alone: a private primary and a lagging hot standby, started and
# stopped around them (scripts/replica.sh; scripts/test.sh runs it once).
replica:
	bash scripts/replica.sh test
