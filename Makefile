# agentmars — set-up, tests and the demo. `make test` is what CI runs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTHON  ?= $(shell scripts/find-python.sh)
# Packages of the core that mypy checks strictly (the rest is linted).
MYPY_CORE := sdk/agentmars/sdk sandbox/agentmars/sandbox server/agentmars/server cli/agentmars
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: help env test lint typecheck pytest demo bench lock clean

help:
	@echo "make demo   - run instrumented agents against a local server, print the event stream"
	@echo "make test   - lint, type-check and run the whole test suite"
	@echo "make bench  - run the benchmarks (figures in docs/benchmarks.md)"
	@echo "make env    - create $(VENV) with every extra (Python 3.12) and system packages"

$(STAMP): pyproject.toml requirements/main.lock scripts/apt-packages.txt
	scripts/install-system-packages.sh
	@test -n "$(PYTHON)" || { echo "no Python 3.12 found"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements/main.lock -e ".[all,dev]"
	touch $@

# The process sandbox's init, built ahead so that no timed run compiles it.
env: $(STAMP)
	$(BIN)/python -m agentmars.sandbox.backends.sandbox_init >/dev/null

lint: env
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: env
	$(BIN)/mypy $(MYPY_CORE)

pytest: env
	$(BIN)/pytest

test: lint typecheck pytest

demo: env
	$(BIN)/agentmars demo

bench: env
	$(BIN)/agentmars bench sdk --json out/bench-sdk.json
	$(BIN)/agentmars bench sandbox --json out/bench-sandbox.json

# Re-resolve the pinned versions after changing dependencies in pyproject.toml.
lock:
	rm -rf /tmp/agentmars-lock && $(PYTHON) -m venv /tmp/agentmars-lock
	/tmp/agentmars-lock/bin/python -m pip install -q --upgrade pip
	/tmp/agentmars-lock/bin/python -m pip install -q -e ".[all,dev]"
	/tmp/agentmars-lock/bin/python -m pip freeze --exclude-editable > requirements/main.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache out
