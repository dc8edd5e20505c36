# Two entry points, each does its own set-up on a fresh machine:
#   make quickstart   the main job: a LIPS run with `flwr run` on offline data
#   make test         the test suite (unit + real `flwr run` integration tests)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-$(shell cat pyproject.toml requirements-pins.txt | cksum | cut -d' ' -f1)

export FLWR_TELEMETRY_ENABLED = 0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION = 1

.PHONY: setup test test-unit quickstart clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-pins.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: an unpinned resolve would download another CUDA build
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -r requirements-pins.txt -e ".[dev,examples]"
	rm -f $(VENV)/.installed-*
	touch $@

test: setup
	$(BIN)/python -m pytest -q

test-unit: setup
	$(BIN)/python -m pytest -q tests/unit

quickstart: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python examples/run_quickstart.py

clean:
	rm -rf $(VENV)
