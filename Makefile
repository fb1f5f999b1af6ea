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

.PHONY: setup repro test check nbtest pytest pytest-slow bench bench-pipeline readme interop docs

setup: $(VENV)/.setup-done

# torch==2.13.0 goes in first: any later torch requirement is then already met by the CPU wheel.
$(VENV)/.setup-done: pyproject.toml scripts/setup_wordnet.sh scripts/setup_docs.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	# only the label table of TotalSegmentator is used (a test checks ours against it); no torch/nnU-Net
	$(PY) -m pip install -q --no-deps "totalsegmentator==2.18.0"
	$(PY) -m ipykernel install --sys-prefix --name spatialvqa --display-name "Python (spatialvqa)" >/dev/null
	bash scripts/setup_wordnet.sh
	# Debian's graphviz (the DAG on the docs' pipeline page) and chromium (the docs' browser test)
	bash scripts/setup_docs.sh
	touch $@

# The main job: the whole pipeline on the embedded default data, then proof that it is up to date.
repro: setup
	dvc repro
	dvc status

# Notebooks and library in sync and clean, notebook tests, then pytest.
test: setup check nbtest pytest

check:
	nbdev-export
	nbdev-clean
	@git diff --quiet -- nbs spatialvqa || { echo "nbdev-export/nbdev-clean changed files: notebooks and spatialvqa/ are out of sync"; git --no-pager diff --stat -- nbs spatialvqa; exit 1; }

nbtest:
	nbdev-test --n-workers 2

# `slow` tests (full-size models and data) run with `make pytest-slow`
pytest:
	pytest -q -m "not slow"

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

# README.md is written from nbs/index.ipynb (tests/test_readme.py checks that it is up to date)
readme:
	$(PY) scripts/readme.py

# Optional, not part of `make test`: lmms-eval 0.7.3 from PyPI in its own venv (torch==2.13.0 first) runs the exported
# task (data/export from `dvc repro -s export`) from a temporary working directory outside the repository, with its
# `dummy` model and with a model that checks every question's images; prints the numbers, the expected ones and the time.
INTEROP_VENV ?= .venv-interop

$(INTEROP_VENV)/.interop-done:
	test -x $(INTEROP_VENV)/bin/python || python3 -m venv $(INTEROP_VENV)
	$(INTEROP_VENV)/bin/python -m pip install -q torch==2.13.0
	# lmms-eval requires torchvision, and torchvision 0.28 (the one built for torch 2.13.0) does not load with torch's CPU
	# build 2.13.0+cpu ("operator torchvision::nms does not exist"): torchvision 0.29.1 moves this venv, and only this one,
	# to torch 2.14
	$(INTEROP_VENV)/bin/python -m pip install -q "lmms-eval==0.7.3" "torchvision==0.29.1"
	touch $@

interop: $(INTEROP_VENV)/.interop-done
	$(INTEROP_VENV)/bin/python interop/run_lmms_eval.py --export data/export

# The documentation site from nbs/ into _site/ (open _site/index.html), offline: MkDocs + mkdocs-jupyter, the library
# notebooks executed as nbdev-test runs them (cached in .cache/docs), results read from the committed files.
docs: setup
	$(PY) scripts/docs.py --out _site
