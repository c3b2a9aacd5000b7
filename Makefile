# Two commands for a newcomer:  `make run` (start the platform)  and  `make test` (the whole suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run status lint test test-fast bench clean help

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10+ is needed"'
	@command -v java >/dev/null || { echo "Java 17+ is needed (apt-get install openjdk-17-jre-headless)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,lint]'
	@touch $(STAMP)

install: $(STAMP)  ## create .venv and install; then `source .venv/bin/activate` puts lambda-platform on PATH
	@echo "installed: run '$(BIN)/lambda-platform --help', or 'source $(BIN)/activate' first to call lambda-platform"

run: $(STAMP)  ## set up and start the platform on its embedded defaults
	$(BIN)/lambda-platform up

status: $(STAMP)  ## each part of the platform on ./data: up or down (exit 1 when it is not serving)
	$(BIN)/lambda-platform status

lint: $(STAMP)  ## ruff, mypy and the layer contract (import-linter); .ci/run runs it before the tests
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: $(STAMP)  ## set up and run every test tier
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)  ## skip the slow end-to-end tier
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)  ## list the benchmarks (each takes minutes and prints ratios against a baseline)
	@echo "batch recompute:  $(BIN)/python benchmarks/batch_recompute.py --events 1000000 --repeat 2"
	@echo "speed layer:      $(BIN)/python benchmarks/speed_layer_bench.py freshness | throughput --users 1000"
	@echo "HTTP ingest:      $(BIN)/python benchmarks/ingest_bench.py --help"
	@echo "key reads:        $(BIN)/python benchmarks/query_bench.py --help"
	@echo "ingest after demo: $(BIN)/python benchmarks/ingest_after_demo.py --help"
	@echo "storage engines:  $(BIN)/python benchmarks/engines_bench.py --events 1000000 --repeat 2"
	@echo "cluster overhead: $(BIN)/python benchmarks/cluster_bench.py --events 1000000 --repeat 2"
	@echo "speed sources:    $(BIN)/python benchmarks/speed_layer_bench.py compare --users 1000 50000 --repeat 2"
	@echo "two checkouts:    $(BIN)/python benchmarks/checkouts_bench.py --before /tmp/bench-before --repeat 2"
	@echo "(see benchmarks/README.md)"

clean:  ## remove the virtualenv and local data
	rm -rf $(VENV) data
