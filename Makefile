# The two README commands: `make sample` (installs only what sampling needs) and `make test`
# (installs the dev extra too, then runs ruff, mypy and the whole test suite, as CI does).
# `make test-fast` is for local work: the same without the tests marked slow or ray.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed first, pinned: pip then keeps it instead of pulling another build. On a
# machine without a GPU, a CPU-only wheel is much smaller:
#   make sample TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0

.PHONY: install install-dev sample test test-fast lint bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# the core package: numpy, gymnasium, torch, ... (no dev tools, Ray, Atari or pyarrow)
install: $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e .

# everything the test suite needs, optional extras included
install-dev: install
	$(BIN)/pip install --quiet -e ".[dev]"

sample: install
	$(BIN)/rlconnect sample --env CartPole-v1 --num-envs 8 --steps 20000

test: install-dev
	$(BIN)/ruff check .
	$(BIN)/mypy src benchmarks
	$(BIN)/python -m pytest -q

test-fast: install-dev
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not slow and not ray"

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python benchmarks/bench_connectors.py
