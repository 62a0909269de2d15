# The two commands a new user needs are `make run` and `make test`. `make run` installs only
# what the service needs (`install-service`); `make test` and the rest everything (`install`:
# the test, bench and Spark extras too).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SERVICE_STAMP := $(VENV)/.installed-service
DATA_DIR ?= ./data

.PHONY: install install-service run test test-fast test-peers console-screenshots diagram bench clean lint-ratchet types-ratchet

install: $(STAMP)

install-service: $(SERVICE_STAMP)

# Each re-runs only when pyproject.toml changes; safe to call any number of times. The full
# install covers the service's.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench,spark]'
	@touch $(STAMP) $(SERVICE_STAMP)

$(SERVICE_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ $(STAMP) -nt pyproject.toml ]; then touch $(SERVICE_STAMP); else \
		$(BIN)/python -m pip install --quiet --upgrade pip && \
		$(BIN)/python -m pip install --quiet -e . && touch $(SERVICE_STAMP); fi

# Every setting is an environment variable (docs/OPERATIONS.md, "Settings"); these are only the
# defaults when EVENTLOG_DATA_DIR, EVENTLOG_HOST or EVENTLOG_PORT is not set.
run: install-service
	EVENTLOG_DATA_DIR="$${EVENTLOG_DATA_DIR:-$(DATA_DIR)}" EVENTLOG_HOST="$${EVENTLOG_HOST:-127.0.0.1}" \
	EVENTLOG_PORT="$${EVENTLOG_PORT:-8080}" $(BIN)/eventlog serve

# The suite at one process per server (N = 1 where a test names none), in TEST_WORKERS worker
# processes (pytest-xdist; a test file stays on one worker, tests/analytics/ too: one Spark
# session); then the tests marked `serial` (time bounds that want a quiet machine) alone; then
# the tests marked `shards` once more against shard families (EVENTLOG_TEST_PROCESSES=2: the API
# tests written against one process run against two shards; tests/broker/ runs both shapes by
# itself). TEST_WORKERS=0 runs each pass in this one process. Three workers on two cores: the
# suite waits on servers, sleeps and fsyncs as much as it computes (a clean-clone run used 1.4
# of the 2 cores over its 18 minutes at 3 workers); docs/PERFORMANCE.md, "The test suite's time".
TEST_WORKERS ?= 3
XDIST = -n $(TEST_WORKERS) --dist loadgroup

# Every pass runs even when one before it failed; make test fails if any did.
test: install test-peers
	failed=0; \
	$(BIN)/python -m pytest $(XDIST) -m "not serial" $(PYTEST_ARGS) || failed=1; \
	$(BIN)/python -m pytest -m serial $(PYTEST_ARGS) || failed=1; \
	EVENTLOG_TEST_PROCESSES=2 $(BIN)/python -m pytest $(XDIST) -m shards $(PYTEST_ARGS) || failed=1; \
	exit $$failed

test-fast: install test-peers
	$(BIN)/python -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# tests/lint_ratchet.json from the tree: after mending lint offences (the ratchet only shrinks)
lint-ratchet: install
	$(BIN)/python -m tests.test_lint

# tests/types_ratchet.json from the tree: after mending type errors (the ratchet only shrinks)
types-ratchet: install
	$(BIN)/python -m tests.test_types

# Debian's chromium for the console's browser tests, libfuse2 for the power-cut tests, kcat and
# KafkaJS (npm, where node is) for the Kafka client tests (skipped with the reason where they cannot be)
test-peers:
	@sh tests/install-test-peers.sh

# docs/console/*.png, the screenshots docs/CONSOLE.md shows, from the browser tests
console-screenshots: install test-peers
	EVENTLOG_CONSOLE_SCREENSHOTS=docs/console $(BIN)/python -m pytest -q tests/console

# docs/architecture.svg, the picture in docs/ARCHITECTURE.md, from its source (standard library
# only; tests/test_architecture_doc.py fails when the two differ)
diagram:
	$(PYTHON) docs/architecture_diagram.py

bench: install
	sh bench/install-peers.sh
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache build *.egg-info
