# The two entry points of the README. Both create/reuse .venv and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_OUT ?= outputs/demo
# one pytest worker per core (pytest-xdist); PYTEST_WORKERS= runs the suite in one process;
# loadgroup keeps the tests of an xdist_group on one worker (the Ray tests share one Ray)
PYTEST_WORKERS ?= -n auto --dist loadgroup
# the tests' many processes (workers, preloaded servers, fresh-interpreter checks) read the
# package's bytecode from __pycache__ instead of each compiling it again, whatever the shell says
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest

.PHONY: demo test test-fast env lint clean

env:
	@bash scripts/bootstrap_env.sh

demo: env
	$(PY) -m ctrcal run configs/demo.yaml --out $(DEMO_OUT)

test: env
	$(VENV)/bin/ruff check ctrcal tests scripts
	$(VENV)/bin/ruff format --check ctrcal tests scripts
	$(VENV)/bin/lint-imports
	$(PYTEST) $(PYTEST_WORKERS)

# the edit loop: the same lint, every test but those marked slow (end-to-end runs, kills,
# subprocesses); `make test` (the CI) runs them all
test-fast: env
	$(VENV)/bin/ruff check ctrcal tests scripts
	$(VENV)/bin/ruff format --check ctrcal tests scripts
	$(VENV)/bin/lint-imports
	$(PYTEST) $(PYTEST_WORKERS) -m "not slow"

lint: env
	$(VENV)/bin/ruff check ctrcal tests scripts
	$(VENV)/bin/ruff format --check ctrcal tests scripts
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache
