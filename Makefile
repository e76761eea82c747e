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

# The main job. Until the service exists (issue 3) it is the simulator comparison on a
# generated openb-shaped federation of three member clusters and a generated workload.
run: $(VENV)/.installed
	$(BIN)/fedbroker simulate --protocol fill --clusters 3 --seed 1 \
		--policy binpack --policy fgd --policy gang --policy spread --policy firstfit --policy random

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
