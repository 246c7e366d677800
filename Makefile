# fedlit: `make install && make quickstart`, then `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install quickstart test test-all lint benchmark clean

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

test: $(STAMP)
	$(BIN)/python -m pytest

test-all: $(STAMP)
	$(BIN)/python -m pytest -m ""

# ruff, then the import contract of pyproject.toml (layers that import only downward, no circles).
lint: $(STAMP)
	$(BIN)/ruff check fedlit tests benchmarks scripts
	$(BIN)/lint-imports

benchmark: $(STAMP)
	$(BIN)/python benchmarks/loop_overhead.py

clean:
	rm -rf runs .pytest_cache .hypothesis
