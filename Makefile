# goodlens: `make run` starts the collector on the bundled sample data; `make test` runs every test.
# Both create .venv/ and install what they need; `make test` also installs Debian's chromium,
# chromium-driver, prometheus and a Java runtime (for Spark) when they are missing.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8470
DB ?= .goodlens/demo.duckdb
APT_PACKAGES := chromium chromium-driver prometheus default-jre-headless

SAMPLES := $(patsubst %/manifest.json,%,$(wildcard sample_data/*/manifest.json))

.PHONY: run reset test test-unit lint bench sample-data clean system-deps screenshots \
	record-fixtures

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.stamp-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[server]'
	touch $@

$(VENV)/.stamp-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[server,test,torch,lightning,transformers,spark,torchft]'
	touch $@ $(VENV)/.stamp-run

system-deps:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v prometheus >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $(APT_PACKAGES); \
	fi

# `make run RESET=1` starts from an empty store: the samples only
run: $(VENV)/.stamp-run $(if $(RESET),reset)
	@mkdir -p $(dir $(DB))
	@echo "goodlens: collector on http://127.0.0.1:$(PORT) with the sample traces in $(DB)"
	@echo "  dashboard: http://127.0.0.1:$(PORT)/"
	@echo "  runs:    $(BIN)/goodlens runs --url http://127.0.0.1:$(PORT)"
	@echo "  metrics: http://127.0.0.1:$(PORT)/metrics"
	$(BIN)/goodlens serve --db $(DB) --port $(PORT) --metrics-retention all $(addprefix --load ,$(SAMPLES))

# Removes the demo store alone (the samples load again on the next `make run`; importing them
# is idempotent, so only what was sent to the collector since is lost); .venv/ stays.
reset:
	@if [ -x $(BIN)/goodlens ] && [ -e "$(patsubst parquet:%,%,$(DB))" ] && \
	  $(BIN)/goodlens runs --db $(DB) 2>&1 | grep -q "held by another process"; then \
	  echo "$(DB) is held by a running collector (make run?): stop it (Ctrl-C), then make reset"; \
	  exit 1; \
	fi
	rm -rf $(patsubst parquet:%,%,$(DB)) $(patsubst parquet:%,%,$(DB)).wal

# The whole suite in one pytest run on two pytest-xdist workers, each module on one worker
# (`--dist loadfile`, pyproject.toml); every test has its own timeout (pytest-timeout), so a
# hang fails that test and the run goes on.
test: $(VENV)/.stamp-test system-deps
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --durations=25

# The unit tier has no module-scoped fixtures: its tests are spread one by one (--dist load).
test-unit: $(VENV)/.stamp-test
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist load tests/unit

# Record the real runs the replay tests read (tests/fixtures/runs/, docs/testing.md): run it
# on a quiet machine when the exporter's wire output or a job's clock lines change.
# ONLY="ddp-slow hf" records some.
record-fixtures: $(VENV)/.stamp-test
	$(BIN)/python -m tests.record $(ONLY)

lint: $(VENV)/.stamp-test
	$(BIN)/ruff check .
	$(BIN)/lint-imports

bench: $(VENV)/.stamp-test
	$(BIN)/python bench/exporter_hot_path.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/collector_memory.py
	$(BIN)/python bench/accounting.py
	$(BIN)/python bench/simulate.py
	$(BIN)/python bench/detectors.py
	$(BIN)/python bench/dashboard.py
	$(BIN)/python bench/relay.py
	$(BIN)/python bench/scaleout.py
	$(BIN)/python bench/cluster.py
	$(BIN)/python bench/torch_overhead.py
	$(BIN)/python bench/integrations.py
	$(BIN)/python bench/torchft_overhead.py
	$(BIN)/python bench/accuracy.py

screenshots: $(VENV)/.stamp-test system-deps
	$(BIN)/python docs/screenshots.py

# docs/cli.md and docs/http-api.md are generated from --help and the OpenAPI document
# (tests/unit/test_cli_reference.py fails while they are stale).
.PHONY: docs
docs: $(VENV)/.stamp-run
	$(BIN)/python -m goodlens.cli.docs

# The fault scenario (docs/elastic.md): 3 torchrun agents x 2 gloo ranks, a node killed, a
# hot spare joining, a straggler evicted automatically; leaves the store in FAULTS_DIR.
FAULTS_DIR ?= .goodlens/faults
.PHONY: demo-faults
demo-faults: $(VENV)/.stamp-test
	rm -rf $(FAULTS_DIR)
	$(BIN)/python examples/elastic/scenario.py --out $(FAULTS_DIR)
	$(BIN)/goodlens report --db $(FAULTS_DIR)/faults.duckdb --run faults
	@echo "dashboard: $(BIN)/goodlens dashboard --db $(FAULTS_DIR)/faults.duckdb --port $(PORT)"

# The same fault schedule two ways (docs/ft.md): torchrun restarts from DCP checkpoints,
# then torchft; both runs in one store for the dashboard's compare view.
FT_DIR ?= .goodlens/ft
.PHONY: demo-ft
demo-ft: $(VENV)/.stamp-test
	rm -rf $(FT_DIR)
	$(BIN)/python examples/elastic/scenario.py --out $(FT_DIR)/restart --run-id restart \
	  --nproc 1 --steps 200 --global-batch 24 --micro-batch 4 --compute-ms 25 --slow-pct 600
	$(BIN)/python examples/ft/scenario.py --out $(FT_DIR)/torchft --run-id torchft --steps 200
	$(BIN)/python examples/ft/compare.py $(FT_DIR)/restart/restart.duckdb restart \
	  $(FT_DIR)/torchft/torchft.duckdb torchft
	$(BIN)/goodlens export --db $(FT_DIR)/restart/restart.duckdb --run restart --out $(FT_DIR)/trace
	$(BIN)/goodlens import $(FT_DIR)/trace --db $(FT_DIR)/torchft/torchft.duckdb
	@echo "compare: $(BIN)/goodlens dashboard --db $(FT_DIR)/torchft/torchft.duckdb --port $(PORT)" \
	  "then /compare?runs=restart,torchft"

sample-data: $(VENV)/.stamp-run
	$(BIN)/python sample_data/generate.py

clean:
	rm -rf $(VENV) .goodlens *.egg-info
