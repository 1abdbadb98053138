.PHONY: example docs test lint replica

# Run the example project (SQLite unless DATABASE_URL is set) on ADDR, default
# 127.0.0.1:8000: `make example PORT=8080` or `make example ADDR=0.0.0.0:8000`.
example:
	ADDR="$(ADDR)" PORT="$(PORT)" bash scripts/example.sh

# The documentation site, built strict into site/ as CI's docs pass builds it. From a
# fresh clone too: bootstrap creates .venv with the docs dependency group (and the pip,
# 25.1+, that installs groups). DEP_GROUPS=dev keeps a development venv's stamp.
docs:
	DEP_GROUPS="$(or $(DEP_GROUPS),docs)" bash scripts/bootstrap.sh
	.venv/bin/python -m mkdocs build --strict --site-dir site
	.venv/bin/python scripts/offline_site.py site

# Everything CI runs (.ci/run): the passes listed in scripts/passes.sh.
test:
	bash scripts/test.sh

lint:
	bash scripts/bootstrap.sh
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy

# One pass of scripts/passes.sh: a private primary and a lagging hot standby, started
# and stopped around the replica tests.
replica:
	bash scripts/passes.sh replica
