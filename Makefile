# Two commands for a newcomer:  `make run` (start the platform)  and  `make test` (the whole suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The console's page tests drive Debian's chromium through its chromedriver (tests/serving/test_console.py).
BROWSER := /usr/bin/chromedriver
APT     := env DEBIAN_FRONTEND=noninteractive apt-get -y -q --no-install-recommends
NICE   ?= nice -n 10

.PHONY: install browser run status kafka lint test test-fast bench clean help

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

# The last two steps save start-up work later, and neither is a requirement (a failure is named, the install goes
# on, and the platform runs as without it). worker_bytecode adds bytecode to the PySpark archives Spark's Python
# workers import: without it each worker process compiles PySpark again, about a CPU-second. class_archive_training
# writes this installation's Spark class-data-sharing archives (a minute or two, once; nothing when they are in
# place): without them the first Spark drivers of `up` or of a test run load their classes from the jars, and the
# first to exit spends 15-30 s writing the archive (deploy/runtime/class_archive.py).
$(STAMP): pyproject.toml deploy/runtime/worker_bytecode.py deploy/runtime/class_archive_training.py
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10+ is needed"'
	@command -v java >/dev/null || { echo "Java 17+ is needed (apt-get install openjdk-17-jre-headless)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,lint]'
	-$(BIN)/python -m deploy.runtime.worker_bytecode
	-$(BIN)/python -m deploy.runtime.class_archive_training
	@touch $(STAMP)

install: $(STAMP)  ## create .venv and install; then `source .venv/bin/activate` puts lambda-platform on PATH
	@echo "installed: run '$(BIN)/lambda-platform --help', or 'source $(BIN)/activate' first to call lambda-platform"

browser: $(BROWSER)  ## Debian's chromium and chromedriver for the console's page tests (apt-get; as root or with sudo)

$(BROWSER):
	@if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; else \
	  echo "chromium is needed by the console's page tests: run 'sudo apt-get install chromium chromium-driver'"; exit 0; fi; \
	  $$SUDO $(APT) install chromium chromium-driver >/dev/null || { $$SUDO apt-get -q update >/dev/null && $$SUDO $(APT) install chromium chromium-driver >/dev/null; }

run: $(STAMP)  ## set up and start the platform on its embedded defaults
	$(BIN)/lambda-platform up

status: $(STAMP)  ## each part of the platform on ./data: up or down (exit 1 when it is not serving)
	$(BIN)/lambda-platform status

kafka: $(STAMP)  ## a local one-node Kafka broker on 127.0.0.1:9092 (data/kafka) in the foreground; Ctrl-C stops it
	$(BIN)/python -m deploy.runtime.kafka_broker --dir data/kafka

lint: $(STAMP)  ## ruff, mypy and the layer contract (import-linter); .ci/run runs it before the tests
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Two workers: the end-to-end tests mostly wait (on JVMs starting, triggers, polls), so two share the
# two cores well (a third ran slower, again in run 30: benchmarks/RESULTS.md, 2026-11-28 15:07); tests
# that share data or the Kafka broker stay on one worker (xdist_group, set in tests/conftest.py), and
# work goes out in the conftest's costliest-first order (--no-loadscope-reorder keeps xdist from
# putting the biggest group first instead). TEST_WORKERS=1 on a one-core machine.
TEST_WORKERS ?= 2
# --cpu-durations: the 25 tests costing the run the most CPU (tests/support/cpu_durations.py), beside pyproject's
# --durations (on two busy cores a test's wall time is mostly the other worker's work).
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --cpu-durations=25

# The class archives again before a run (under a second when they are in place): the cache keeps four, so
# installs in other checkouts may have evicted this one's, and the suite checks that they are there.
ARCHIVES := -$(BIN)/python -m deploy.runtime.class_archive_training

# The project's bytecode, written once before a run: where PYTHONDONTWRITEBYTECODE is set (as on this project's
# CI host) Python caches none, and each of the few hundred Python processes a run starts would compile the
# modules it imports again. A module edited later is compiled as usual (its cached bytecode no longer matches).
BYTECODE := $(BIN)/python -m compileall -q -j 0 shared_logic batch_layer speed_layer serving deploy tests

test: $(STAMP) $(BROWSER)  ## set up and run every test tier (9-16 minutes on 2 cores, as fast as a shared host runs)
	$(ARCHIVES)
	$(BYTECODE)
	$(PYTEST)

test-fast: $(STAMP)  ## skip the slow end-to-end tier (under 3 minutes)
	$(ARCHIVES)
	$(BYTECODE)
	$(PYTEST) -m "not slow"

bench: $(STAMP)  ## quick variant of every benchmark (10-15 min on 2 cores), one table; BENCH_ARGS=--write-results appends it to benchmarks/RESULTS.md
	$(NICE) $(BIN)/python benchmarks/suite.py $(BENCH_ARGS)

clean:  ## remove the virtualenv and local data
	rm -rf $(VENV) data
