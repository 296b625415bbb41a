# Development tasks for gradtx (GNU make).
#
#   make test    lint (below), pytest, notebooks (nbmake), strict docs build
#   make lint    ruff check + ruff format --check + basedpyright (type check of gradtx/)
#   make quick   pytest without the tests marked slow (the registry's cross products, subprocesses)
#   make demo    run examples/train_mlp.py
#   make docs    run the notebooks, then build the documentation into site/ (with their outputs)
#   make dist    build the wheel and sdist into dist/, twine check, install the wheel in a clean venv
#   make bench   run the benchmarks (python -m benchmarks.run)
#   make chart   redraw docs/images/performance-*.svg from the snapshots in benchmarks/snapshots/
#   make clean   remove build, cache and docs output (keeps .venv)
#
# The first run creates .venv and installs the package with all extras; the virtual
# environment is brought up to date again whenever pyproject.toml changes. Tests run against the installed
# package (not the source tree), which is reinstalled before every test run.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test
.DELETE_ON_ERROR:

PYTHON   ?= python3
VENV     := .venv
BIN      := $(VENV)/bin
STAMP    := $(VENV)/.installed
SITE_DIR ?= site
EXTRAS   := test,docs,dev,bench

NOTEBOOKS := $(wildcard notebooks/*.ipynb)

export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Silence mkdocs-material's end-of-life banner in build output.
export NO_MKDOCS_2_WARNING := 1

.PHONY: venv install demo test lint unit quick notebooks docs dist bench chart clean

# --- environment -------------------------------------------------------------------------------

# The dependencies are installed by uv, which downloads and unpacks in parallel (a fresh install
# takes a quarter of pip's time); where uv cannot be installed or cannot reach the index, pip does
# the same install.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip setuptools
	if $(BIN)/python -m pip install --quiet uv \
	    && $(BIN)/uv pip install --python $(BIN)/python '.[$(EXTRAS)]'; then :; \
	else $(BIN)/python -m pip install '.[$(EXTRAS)]'; fi
	touch $@

venv: $(STAMP)

# Fast reinstall of the package alone (its dependencies are already in place), so tests,
# notebooks and the demo import exactly what a user would install, never the source tree.
# Build output is removed first so that a deleted module cannot linger in the wheel.
define reinstall
	rm -rf build gradtx.egg-info
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation --force-reinstall .
	rm -rf build gradtx.egg-info
	cd / && $(abspath $(BIN))/python -c 'import gradtx; print("gradtx from", gradtx.__file__)'
endef

define lint_cmds
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/basedpyright
endef

# pytest is run through its entry point from the repository root (not `python -m pytest`),
# so the root is not put on sys.path and the installed package is the one under test.
# Two worker processes (pytest-xdist; compiling is mostly single-threaded, and there are 2
# cores), each taking the next test as it finishes one, so neither core idles at the end.
define unit_cmds
	$(BIN)/pytest -p no:cacheprovider -n 2 --dist worksteal
endef

ifeq ($(strip $(NOTEBOOKS)),)
define notebook_cmds
	@echo "no notebooks/*.ipynb found; skipping notebook tests"
endef
else
# Two at a time, as the tests: each notebook runs in a kernel of its own. They run as copies in
# build/notebooks/, which keep their outputs (--overwrite) for the docs build to show; the
# committed notebooks stay without outputs.
define notebook_cmds
	rm -rf build/notebooks && mkdir -p build/notebooks && cp $(NOTEBOOKS) build/notebooks/
	$(BIN)/pytest -p no:cacheprovider -n 2 --nbmake --overwrite build/notebooks/*.ipynb
endef
endif

define docs_cmds
	$(BIN)/mkdocs build --strict --site-dir $(SITE_DIR)
endef

# The distributions as they would be published: built from a clean copy of the sources,
# checked by twine, and the wheel installed into a fresh virtual environment.
define dist_cmds
	rm -rf dist build gradtx.egg-info
	$(BIN)/python -m build --no-isolation --outdir dist . > /dev/null
	rm -rf build gradtx.egg-info
	$(BIN)/twine check --strict dist/*
	$(BIN)/python .ci/check_dist.py dist
endef

# --- tasks -------------------------------------------------------------------------------------

install: $(STAMP)
	$(reinstall)

test: $(STAMP)
	$(lint_cmds)
	$(reinstall)
	$(unit_cmds)
	$(notebook_cmds)
	$(docs_cmds)
	$(dist_cmds)

lint: $(STAMP)
	$(lint_cmds)

unit: install
	$(unit_cmds)

quick: install
	$(unit_cmds) -m "not slow"

notebooks: install
	$(notebook_cmds)

docs: install
	$(notebook_cmds)
	$(docs_cmds)

dist: $(STAMP)
	$(dist_cmds)

demo: install
	$(BIN)/python examples/train_mlp.py

bench: install
	$(BIN)/python -m benchmarks.run

chart: $(STAMP)
	$(BIN)/python -m benchmarks.chart

clean:
	rm -rf $(SITE_DIR) build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -type d \
	  \( -name __pycache__ -o -name .ipynb_checkpoints \) -print0 | xargs -0 rm -rf
