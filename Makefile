# Entry points, each does its own set-up on a fresh machine:
#   make main   the main job: FedBN vs LIPS with `flwr run` on offline Fashion-MNIST
#   make test   the test suite (unit + real `flwr run` integration tests), after `make lint`
#   make lint   ruff and mypy on lips_flwr/ (versions pinned in requirements-pins.txt)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-$(shell cat pyproject.toml requirements-pins.txt | cksum | cut -d' ' -f1)

export FLWR_TELEMETRY_ENABLED = 0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION = 1

.PHONY: setup data lint test test-unit main clean

setup: $(STAMP) data

# Offline Fashion-MNIST from Debian (as root); elsewhere the loader downloads it once.
data:
	@test -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	       && (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) ; } \
	  || echo "note: dataset-fashion-mnist not installed; Fashion-MNIST will be downloaded"

$(STAMP): pyproject.toml requirements-pins.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: an unpinned resolve would download another CUDA build
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -r requirements-pins.txt -e ".[dev,examples]"
	rm -f $(VENV)/.installed-*
	touch $@

lint: setup
	$(BIN)/ruff check lips_flwr
	$(BIN)/mypy lips_flwr

test: setup lint
	$(BIN)/python -m pytest -q

test-unit: setup
	$(BIN)/python -m pytest -q tests/unit

main: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python examples/paper/run_grid.py \
	  examples/paper/conf/fashion-mnist-quick.toml --algorithms fedbn,lips --seeds 0

clean:
	rm -rf $(VENV)
