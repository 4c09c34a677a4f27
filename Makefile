# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_TEST := $(VENV)/.installed-test
EXTRAS_TEST := test,data,convert
# Reference implementations for the weight-conversion tests, installed without their
# torchvision requirement (see pyproject.toml, extra `convert`).
NO_DEPS_TEST := timm==1.0.31 open_clip_torch==3.3.0

.PHONY: demo test lint notebooks clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(STAMP_TEST): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS_TEST)]"
	$(BIN)/python -m pip install -q --no-deps $(NO_DEPS_TEST)
	touch $@ $(STAMP_RUN)

demo: $(STAMP_RUN)
	$(BIN)/python launch.py --workdir=workdir/demo

lint: $(STAMP_TEST)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest -q tests

notebooks: $(STAMP_TEST)
	$(BIN)/jupytext --to ipynb notebooks/[0-9]*.py

clean:
	rm -rf $(VENV) workdir
