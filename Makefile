# Two commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
FEDBROKER_TRACES ?= ../shared/traces
export FEDBROKER_TRACES

.PHONY: run test lint typecheck clean system-deps image

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Two stamps: `run` installs what running needs (and the simulator's plots); the test
# tools (pytest, playwright, schemathesis, linters) only for `make test` and its parts.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[plot]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[plot,test]'
	touch $@

# The main job: the broker on simulated clusters (two on-prem, one cloud pool) with a
# workload generator and a live table; a second terminal can `fedbroker submit` against it.
run: $(VENV)/.installed
	$(BIN)/fedbroker demo

lint: $(VENV)/.installed-test
	$(BIN)/ruff check broker adapters policies tests
	$(BIN)/ruff format --check broker adapters policies tests
	$(BIN)/lint-imports

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

# promtool (alert rule tests), Chromium (dashboard test) and kubectl (kustomize rendering of
# deploy/) come from Debian's packages;
# installed when missing and root, else their tests skip with a reason (or fail under
# FEDBROKER_REQUIRE_SERVICES=1, as in CI).
system-deps:
	@if command -v promtool >/dev/null && command -v chromium >/dev/null \
	  && command -v kubectl >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus chromium kubectl; \
	else echo "make: promtool, chromium or kubectl missing (apt-get install prometheus \
	  chromium kubectl)"; fi

test: $(VENV)/.installed-test system-deps lint typecheck
	$(BIN)/python -m pytest -q

# The container image from the Dockerfile, named as deploy/kustomize expects it
# (fedbroker:<version>); `make image IMAGE=registry.example.com/team/fedbroker:0.1.0` for a
# registry of yours, then `docker push` it and set it in the kustomization
# (docs/install.md). `make test` builds no image.
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGE ?= fedbroker:$(VERSION)
DOCKER ?= docker
image:
	$(DOCKER) build -t $(IMAGE) .

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
