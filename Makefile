# The two commands of the README's quick start. Both create .venv on first use.
#   make demo   install workledger and run the payroll demo on ./workledger.db
#   make test   install the test extras and run the whole suite, then ruff and mypy
#               (two pytest workers; `make test PYTEST_ARGS=` runs it in one process)
#   make check  the fast tier, under 2 minutes: ruff, mypy, and the unit, contract and docs
#               tests on SQLite only (the pure core, the storage port, the model at its small
#               size); `make test` stays the whole suite and what CI runs
#   make docs   regenerate docs/cli.md from the click commands (tests/test_docs.py checks it)
#   make schema regenerate storage/sql/<dialect>/schema.sql from a freshly migrated SQLite file
#               and PostgreSQL database (tests/test_schema_file.py checks it); run it after
#               adding a migration
#   make excerpts  run the commands of every console excerpt in README.md and docs/ and
#               rewrite the excerpts (tests/excerpts.py; tests/test_doc_excerpts.py checks them)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?= -n 2

.PHONY: demo test check docs schema excerpts

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

demo: $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[demo,web]'
	$(BIN)/workledger demo payroll

test: $(BIN)/python
	@[ -x /usr/bin/chromium ] || echo "make test: no /usr/bin/chromium, so the browser tests" \
		"(tests/test_dashboard_browser.py) will be skipped; install it: apt-get install chromium" >&2
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,web]'
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
	$(BIN)/ruff check src tests
	$(BIN)/mypy

# The test extras, installed again only when pyproject.toml changed (a no-op pip install asks
# the package index about every dependency: too slow for the fast tier).
$(VENV)/.test-extras: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,web]'
	touch $@

check: $(VENV)/.test-extras
	$(BIN)/ruff check src tests
	$(BIN)/mypy
	WORKLEDGER_TEST_BACKENDS=sqlite $(BIN)/python -m pytest -q $(PYTEST_ARGS) \
		-m 'unit or contract or docs'

docs: $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	$(BIN)/python -c 'from workledger.cli import reference; print(reference(), end="")' > docs/cli.md

schema: $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	$(BIN)/python tests/schema_files.py

excerpts: $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	$(BIN)/python tests/excerpts.py
