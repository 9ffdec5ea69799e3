# Two commands set everything up on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
ARGS ?=

.PHONY: run serve test lint bench installer llama clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --progress-bar off -q --upgrade pip setuptools wheel

# llama.cpp as this machine gets it: scripts/llama_build.py picks CUDA, HIP, Vulkan or CPU and says why
# in one line, builds once per flag set into a cache keyed by the flags (a first build takes 10-40
# minutes on 2 cores), installs CuPy for our kernels where a GPU driver is, and does nothing when the
# recorded choice is unchanged. Every step below installs it first, so pip never builds it on its own.
llama: | $(PY)
	$(PYTHON) scripts/llama_build.py install --python $(PY)

$(VENV)/.run-deps: pyproject.toml | $(PY) llama
	$(PIP) install --progress-bar off -e '.[gui,default-model]'
	touch $@ $(VENV)/.serve-deps

$(VENV)/.serve-deps: pyproject.toml | $(PY) llama
	$(PIP) install --progress-bar off -e '.[default-model]'
	touch $@

$(VENV)/.dev-deps: pyproject.toml | $(PY) llama
	$(PIP) install --progress-bar off -e '.[dev]'
	touch $@ $(VENV)/.run-deps $(VENV)/.serve-deps

run: llama $(VENV)/.run-deps
	$(PY) -m app $(ARGS)

serve: llama $(VENV)/.serve-deps
	$(PY) -m app serve $(ARGS)

lint: llama $(VENV)/.dev-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest $(ARGS)

bench: llama $(VENV)/.serve-deps
	$(PY) -m app bench $(ARGS)

# Linux bundle + self-extracting installer in dist/ (installer/build.sh says what each step does).
# It uses the same flag-keyed llama.cpp build as the steps above. WITH_MODEL=1 embeds the default model;
# BUNDLE_EXTRAS (default cuda12: CuPy + NVRTC for our kernels) picks extras to bundle, empty for none.
BUNDLE_EXTRAS ?= cuda12
installer: llama $(VENV)/.dev-deps
	WITH_MODEL=$(WITH_MODEL) EXTRAS=$(BUNDLE_EXTRAS) PYTHON=$(PYTHON) bash installer/build.sh

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
