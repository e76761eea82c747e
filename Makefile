# Two commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
FEDBROKER_TRACES ?= ../shared/traces
export FEDBROKER_TRACES

.PHONY: run test lint typecheck clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

# The main job: the broker on simulated clusters (two on-prem, one cloud pool) with a
# workload generator and a live table; a second terminal can `fedbroker submit` against it.
run: $(VENV)/.installed
	$(BIN)/fedbroker demo

lint: $(VENV)/.installed
	$(BIN)/ruff check broker adapters policies tests
	$(BIN)/ruff format --check broker adapters policies tests
	$(BIN)/lint-imports

typecheck: $(VENV)/.installed
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
