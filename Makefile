# One task runner for people, the README and CI alike.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-faults lint bench clean

setup: $(STAMP)

# Reinstall only when the dependency list changes; `make setup` is idempotent.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

demo: setup
	$(BIN)/toolloop demo

test: setup
	$(BIN)/python -m pytest -q -m "not faults"

test-faults: setup
	$(BIN)/python -m pytest -q -m faults --timeout 1800

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: setup
	$(BIN)/python -m ops.bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
