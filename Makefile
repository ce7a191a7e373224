# Every target creates or updates the virtual environment it needs, so each works on a fresh machine.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast bench clean

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0          # first, so the CPU build from local disk is used
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)   ## the main job on the embedded default
	$(BIN)/specfleet engine generate

test: $(STAMP)   ## the whole test suite, slow tests included (what CI runs)
	$(BIN)/python -m pytest -q -p no:cacheprovider

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
