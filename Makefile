# The two entry points of the README. Both create/reuse .venv and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_OUT ?= outputs/demo

.PHONY: demo test env lint clean

env:
	@bash scripts/bootstrap_env.sh

demo: env
	$(PY) -m ctrcal run configs/demo.yaml --out $(DEMO_OUT)

test: env
	$(VENV)/bin/ruff check ctrcal tests scripts
	$(VENV)/bin/lint-imports
	$(PY) -m pytest

lint: env
	$(VENV)/bin/ruff check ctrcal tests scripts
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache
