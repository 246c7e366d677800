# fedlit: `make install && make quickstart`, then `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install quickstart test test-fast test-all test-gpu lint benchmark clean

install: $(STAMP)

# torch and torchvision first, at the versions that lie on this machine's disk (no multi-GB download).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

quickstart: $(STAMP)
	$(BIN)/fedlit fit --config recipes/quickstart.yaml

# The default suite (pyproject's addopts: not slow, not gpu) in PYTEST_WORKERS processes (pytest-xdist), each test
# file in one of them (its module fixtures built once, its tests in their order). `PYTEST_WORKERS=0`: one process.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadfile

test: $(STAMP)
	$(BIN)/python -m pytest $(XDIST)

# The default suite less the tests marked `long` (whole runs, subprocesses): the quick check while editing.
test-fast: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -m "not slow and not gpu and not long"

test-all: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -m ""

# The tests marked `gpu`, on CUDA: every strategy's exact resume, the fused training and evaluation equalities, cached
# features, 16-mixed and bf16-mixed, the ranks' exchange on one device, the flagship recipe for 2 rounds with a random
# SAM ViT-B (docs/runs.md, "On a GPU"). Skips itself where torch sees no CUDA device. GPU_PYTHON: the venv's python,
# else python3 (a GPU machine without a package index: shared/docs/GPU.md).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_WORKERS ?= 4
test-gpu:
	@if $(GPU_PYTHON) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
		$(GPU_PYTHON) -m pytest -n $(GPU_WORKERS) --dist loadfile -m gpu; \
	else \
		echo "make test-gpu: skipped (torch sees no CUDA device)"; \
	fi

# ruff (lint and format), the import contracts of pyproject.toml (layers that import only downward, the engine's
# three parts, no circles), then mypy (strict on the lowest layer, the engine's seams and the Strategy API).
lint: $(STAMP)
	$(BIN)/ruff check fedlit tests benchmarks scripts
	$(BIN)/ruff format --check fedlit tests benchmarks scripts
	$(BIN)/lint-imports
	$(BIN)/mypy

benchmark: $(STAMP)
	$(BIN)/python benchmarks/loop_overhead.py

clean:
	rm -rf runs .pytest_cache .hypothesis
