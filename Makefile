# Two commands do everything on a fresh machine:
#   make run   - create .venv, install, reproduce the default experiment grid (dvc repro) offline
#   make test  - create/refresh .venv if needed, run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The offline dataset mirror beside the checkout (read-only; files are decompressed into data/).
SHARED_DATA := $(abspath ../shared/data)
ifneq ($(wildcard $(SHARED_DATA)/fashion-mnist),)
export FEDCME_DATA_MIRROR ?= $(SHARED_DATA)
endif

# No telemetry or analytics calls from the stack (offline machines, quiet logs).
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1

EXPERIMENT ?= default
CONFIG ?= params.yaml

.PHONY: install run train test test-quick compare clean

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

run: install
	test -d .dvc || $(VENV)/bin/dvc init --quiet
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m flows.pipeline.repro
	@echo "Report:       reports/results.md and reports/figures/accuracy.png"
	@echo "Compare runs: $(VENV)/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1  (http://127.0.0.1:5000)"
	@echo "Prefect UI:   $(VENV)/bin/prefect server start --host 127.0.0.1  (http://127.0.0.1:4200; docs/orchestration.md, \"Prefect's UI and schedules\")"

train: install
	$(VENV)/bin/fedcme train --config $(CONFIG) --experiment $(EXPERIMENT)

# Everything (what CI runs). Quick tier: the pure functions and the round loop on synthetic data,
# in about a minute; the tests marked slow (real Prefect and Dask servers, subprocess commands,
# killed processes, `dvc repro`, the real datasets) are left out. Both run in TEST_WORKERS test
# processes (pytest-xdist; CI's two cores), each test file whole in one of them, so a file's shared
# fixture is built once; in `make test` the files with the most slow tests go first (tests/conftest.py).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

test: install
	$(PYTEST) --no-loadscope-reorder

test-quick: install
	$(PYTEST) -m "not slow"

# The grid's experiments (git commits, `dvc exp run`s) side by side in a terminal: one column per
# method, headed by its label (reports/summary/<method>.json: mean final accuracy, shown in %), and
# only the params that differ; a commit without results (reports/ is not committed) is left out
# with one line saying so (flows/report/compare.py runs `dvc exp show --csv` and prints the table).
compare:
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m flows.report.compare compare

# Benchmarks (bench/, figures in BENCHMARKS.md): JSON lines appended to bench/results.jsonl.
.PHONY: bench bench-quick
bench: install
	$(PY) bench/run_all.py

bench-quick: install
	$(PY) bench/run_all.py --quick --jobs 2

clean:
	rm -rf runs .pytest_cache mlflow.db mlartifacts data/prepared data/partitions models metrics reports
