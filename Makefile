# spatialvqa: `make repro` sets everything up and regenerates every result; `make test` sets up and tests.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)
export HF_HUB_OFFLINE := 1
# small matrix products thrash when OpenBLAS spreads them over threads on a 2-core machine
export OPENBLAS_NUM_THREADS ?= 1
# WordNet 3.0 for METEOR lives here (scripts/setup_wordnet.sh copies it from Debian's packages)
export NLTK_DATA := $(abspath $(VENV))/nltk_data
# these machines set PYTHONDONTWRITEBYTECODE=1: then every process compiles again each module it imports (the tests
# start hundreds of processes). Unset, the first import of a module writes its .pyc and later processes reuse it.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup repro repro-check test check nbtest pytest pytest-slow bench bench-pipeline stage-times readme interop docs

setup: $(VENV)/.setup-done

# torch==2.13.0 goes in first: any later torch requirement is then already met by the CPU wheel. pip installs it
# (pip's configuration on these machines points at the local wheel) and uv, which installs the rest: uv downloads and
# unpacks in parallel, 10 s where pip took 53 s on a fresh clone (measured 2026-11-27); pip does it when uv cannot.
# Nothing is byte-compiled here: the recipes below let Python write bytecode (unexport PYTHONDONTWRITEBYTECODE), so
# only what is imported gets compiled, once, instead of all of site-packages (compileall took 24 s of setup).
UV_PIP = $(VENV)/bin/uv pip install --python $(PY) -q
$(VENV)/.setup-done: pyproject.toml constraints.txt scripts/setup_wordnet.sh scripts/setup_docs.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile uv || echo "setup: uv could not be installed; pip installs the rest"
	# constraints.txt: the versions the committed results were made with (a new release of numpy or scipy moves the last
	# digit of a measurement, and with it which questions the filter keeps)
	$(UV_PIP) -c constraints.txt -e ".[dev]" || $(PY) -m pip install -q --no-compile -c constraints.txt -e ".[dev]"
	# only the label table of TotalSegmentator is used (a test checks ours against it); no torch/nnU-Net
	$(UV_PIP) --no-deps "totalsegmentator==2.18.0" || $(PY) -m pip install -q --no-compile --no-deps "totalsegmentator==2.18.0"
	$(PY) -m ipykernel install --sys-prefix --name spatialvqa --display-name "Python (spatialvqa)" >/dev/null
	bash scripts/setup_wordnet.sh
	# Debian's graphviz (the DAG on the docs' pipeline page) and chromium (the docs' browser test)
	bash scripts/setup_docs.sh
	touch $@

# The main job: the whole pipeline on the embedded default data, then proof that it is up to date, and whether the
# run changed anything committed (on a clean checkout of main: nothing, dvc.lock included; the clocks live in
# reports/times/ and *.times.jsonl, outside git and DVC).
repro: setup
	dvc repro
	dvc status
	@if git diff --quiet -- dvc.lock results figures 2>/dev/null; then echo "make repro: dvc.lock, results/ and figures/ are byte for byte as committed"; \
	else echo "make repro: changed from the commit:"; git --no-pager diff --stat -- dvc.lock results figures; fi

# Byte for byte: the chosen stages run twice (1 and 2 threads, another PYTHONHASHSEED), their declared outputs compared
# (benchmarks/check_repro.py; the stages' inputs must be in the working tree). Two result trees: check_repro.py compare A B.
STAGES ?= ctsvqa_score
THREADS ?= 1,2
repro-check: setup
	python benchmarks/check_repro.py run --stages $(STAGES) --threads $(THREADS)

# Notebooks and library in sync and clean, notebook tests, then pytest. (Side by side, `make -j2 nbtest pytest`, they
# took longer on 2 cores: 5 min 21 s against 1 min 09 s + 4 min 01 s one after the other, measured 2026-11-27.)
test: setup check nbtest pytest

check:
	nbdev-export
	nbdev-clean
	@git diff --quiet -- nbs spatialvqa || { echo "nbdev-export/nbdev-clean changed files: notebooks and spatialvqa/ are out of sync"; git --no-pager diff --stat -- nbs spatialvqa; exit 1; }

nbtest:
	nbdev-test --n-workers 2

# `slow` tests (full-size models and data) run with `make pytest-slow`. Two worker processes (pytest-xdist): every
# test makes its own temporary files (tmp_path, tmp_path_factory), none depends on another's order; a file's tests stay in
# one worker (--dist loadfile), so each module-scoped fixture is built once; files are handed out longest first
# (tests/conftest.py's LONGEST_FIRST; --no-loadscope-reorder keeps that order instead of xdist's by number of tests);
# PYTEST_WORKERS=0 runs them in this process.
PYTEST_WORKERS ?= 2
pytest:
	pytest -q -m "not slow" -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

pytest-slow:
	pytest -q -m slow

bench: setup
	python benchmarks/bench_measure.py
	python benchmarks/bench_measure_process.py

# Track A from convert to validated at 60 and 240 scans (seconds per scan per stage, the ratio larger/smaller) and the
# per-scan stages on a local Dask cluster of 1, 2 and 4 workers; fails when a stage's cost per scan grows more than
# 1.3x. About 40 min on 2 busy cores. More options in BENCH_PIPELINE_ARGS, e.g. --no-dask, --by cpu, --sizes 30,120
bench-pipeline: setup
	python benchmarks/bench_pipeline.py --check $(BENCH_PIPELINE_ARGS)

# each stage's time in the last `dvc repro` (from the executed notebooks' papermill metadata): after a cold `make repro`
stage-times:
	python benchmarks/stage_times.py --markdown

# README.md is written from nbs/index.ipynb (tests/test_readme.py checks that it is up to date)
readme:
	$(PY) scripts/readme.py --dag --tables

# Optional, not part of `make test`: lmms-eval 0.7.3 from PyPI in its own venv (torch==2.13.0 first), every package pinned
# by interop/constraints.txt (as measured to work), runs the exported task from a temporary working directory outside the
# repository, with its `dummy` model and with a model that checks every question's images; prints the numbers, the
# expected ones and the time, and fails on any error lmms-eval reports. The export is data/export (`dvc repro -s
# export`); on a clone without it, the README walk-through's export of 6 phantoms (interop/small_export.py).
INTEROP_VENV ?= .venv-interop
INTEROP_EXPORT ?= data/export

$(INTEROP_VENV)/.interop-done: interop/constraints.txt
	test -x $(INTEROP_VENV)/bin/python || python3 -m venv $(INTEROP_VENV)
	$(INTEROP_VENV)/bin/python -m pip install -q torch==2.13.0
	# lmms-eval requires torchvision, and torchvision 0.28 (the one built for torch 2.13.0) does not load with torch's CPU
	# build 2.13.0+cpu ("operator torchvision::nms does not exist"): torchvision 0.29.1 moves this venv, and only this one,
	# to torch 2.14.1; filelock < 4 (lmms-eval 0.7.3 imports filelock._api): see interop/constraints.txt
	$(INTEROP_VENV)/bin/python -m pip install -q -c interop/constraints.txt "lmms-eval==0.7.3" "torchvision==0.29.1"
	touch $@

interop: setup $(INTEROP_VENV)/.interop-done
	@if [ -f $(INTEROP_EXPORT)/spatialvqa_trackA.parquet ]; then E=$(INTEROP_EXPORT); else \
	  echo "$(INTEROP_EXPORT): no export; building the README walk-through's export in .cache/interop"; \
	  $(PY) interop/small_export.py --out .cache/interop >/dev/null && E=.cache/interop/work/export; fi; \
	$(INTEROP_VENV)/bin/python interop/run_lmms_eval.py --export $$E

# The documentation site from nbs/ into _site/ (open _site/index.html), offline: MkDocs + mkdocs-jupyter, the library
# notebooks executed as nbdev-test runs them (cached in .cache/docs), results read from the committed files.
docs: setup
	$(PY) scripts/docs.py --out _site
