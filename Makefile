# Entry points, each does its own set-up on a fresh machine:
#   make main         the main job: FedBN vs LIPS with `flwr run` on offline Fashion-MNIST
#   make test         everything CI runs (.ci/run): lint and the whole suite (in two halves),
#                     the installed wheel, the lowest supported versions and the base install
#                     without torch at once (see .ci/run's timings)
#   make test-fast    unit tests but the slow ones, one quick `flwr run` (about 1.5 min on 2 cores: 83 s): the inner loop
#   make lint         ruff and mypy on lips_flwr/ (versions pinned in requirements-pins.txt)
#   make test-wheel   build sdist + wheel, install the wheel in a fresh venv, run the
#                     quickstart apps (both APIs) under `flwr run` against that install
#   make test-lowest  unit tests (of the slow ones, the sweep's) at the lowest versions
#                     pyproject.toml claims (requirements-lowest.txt; torch pinned below)
#   make test-no-torch  the wheel with its base dependencies only (flwr, numpy: no torch,
#                     no Ray) in a fresh venv: the plugin imports and masks a round
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-$(shell cat pyproject.toml requirements-pins.txt | cksum | cut -d' ' -f1)
WHEEL_VENV  ?= .venv-wheel
LOWEST_VENV ?= .venv-lowest
NOTORCH_VENV ?= .venv-notorch
TORCH        = torch==2.14.1 torchvision==0.29.1
TORCH_LOWEST = torch==2.13.0
QUICK_RUN    = tests/integration/test_flwr_run_examples.py::test_example_app_masks_on_schedule[quickstart-message-server]

export FLWR_TELEMETRY_ENABLED = 0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION = 1

.PHONY: setup data lint test test-suite test-suite-apps test-suite-rest test-fast test-fast-unit test-fast-plugin test-fast-rest test-fast-run test-unit test-wheel test-lowest \
	test-no-torch dist main clean

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
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -r requirements-pins.txt -e ".[dev,examples]"
	rm -f $(VENV)/.installed-*
	touch $@

lint: setup
	$(BIN)/ruff check lips_flwr
	$(BIN)/mypy lips_flwr

# Lint and the suite in two halves at once, about even in CPU seconds (the Flower App
# end-to-end tests; the deployment tests, which wait on Flower's heartbeats, and the swap-in
# ones with the unit tests), while the wheel's, the lowest versions' and the base install's
# venvs install and test: one pytest process keeps one core busy at most, and the CPU, not
# waiting, is what CI spends. Each target's output is printed whole when it ends.
test: setup
	$(MAKE) -j5 --output-sync=target lint test-suite-apps test-suite-rest test-wheel test-lowest test-no-torch

# (test_swap_in.py with the rest: in a CI at bd6f7e3 the apps half ended 150 s after it)
SUITE_REST_INTEGRATION = tests/integration/test_deployment.py tests/integration/test_swap_in.py
test-suite-apps: setup
	@date +"test-suite-apps: started %T"
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 tests/integration \
	  $(addprefix --ignore=,$(SUITE_REST_INTEGRATION))
	@date +"test-suite-apps: ended %T"

test-suite-rest: setup
	@date +"test-suite-rest: started %T"
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 $(SUITE_REST_INTEGRATION) tests/unit
	@date +"test-suite-rest: ended %T"

# The whole suite in one process (what the two halves run), for whoever calls it alone.
test-suite: setup
	$(BIN)/python -m pytest -q --durations=15

# The unit tests in two halves at once (one core each), the quick flwr run on the core the first
# half frees: beside both halves, its Ray start-up slowed them by more than it took.
FAST_MARKS = -m "not integration and not slow"
FAST_PLUGIN = tests/unit/strategies tests/unit/core tests/unit/clients
test-fast: setup
	$(MAKE) -j2 --output-sync=target test-fast-plugin test-fast-rest test-fast-run

test-fast-unit: setup
	$(BIN)/python -m pytest -q $(FAST_MARKS)

test-fast-plugin: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider $(FAST_MARKS) $(FAST_PLUGIN)

test-fast-rest: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider $(FAST_MARKS) tests/unit $(addprefix --ignore=,$(FAST_PLUGIN))

test-fast-run: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider "$(QUICK_RUN)"

test-unit: setup
	$(BIN)/python -m pytest -q tests/unit

dist: setup
	rm -rf dist
	$(BIN)/python -m build --outdir dist .

# The throwaway venvs (wheel, lowest versions, base install): pip compiles no .pyc files at
# install (at the lowest versions 48 CPU-s with them, 16 without); the tests' first imports
# compile what they use (~3 CPU-s) and keep it, PYTHONDONTWRITEBYTECODE set or not.
PIP_INSTALL = install -q --no-compile
test-wheel test-lowest test-no-torch: export PYTHONDONTWRITEBYTECODE =

# The package as a user gets it: no editable install, nothing of the checkout on the path
# (tests/integration/conftest.py checks where lips_flwr was imported from).
test-wheel: dist
	@date +"test-wheel: started %T"
	rm -rf $(WHEEL_VENV)
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/pip $(PIP_INSTALL) --upgrade pip
	$(WHEEL_VENV)/bin/pip $(PIP_INSTALL) $(TORCH)
	$(WHEEL_VENV)/bin/pip $(PIP_INSTALL) -r requirements-pins.txt "$$(ls dist/lips_flwr-*.whl)[examples]"
	cd "$$(mktemp -d)" && LIPS_TEST_INSTALLED=1 $(abspath $(WHEEL_VENV))/bin/python -m pytest -q \
	  -p no:cacheprovider -c $(CURDIR)/pyproject.toml --rootdir $(CURDIR) \
	  -k server $(CURDIR)/tests/integration/test_flwr_run_examples.py
	@date +"test-wheel: ended %T"

# At the lowest versions: the unit tests but the slow ones (sweeps, child processes, timeouts:
# 400 of their 550 CPU seconds), then the sweep's own tests whole (Ray tasks at the lowest flwr,
# torch and Ray). The current versions run every test.
test-lowest:
	@date +"test-lowest: started %T"
	rm -rf $(LOWEST_VENV)
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/pip $(PIP_INSTALL) --upgrade pip
	$(LOWEST_VENV)/bin/pip $(PIP_INSTALL) $(TORCH_LOWEST)
	$(LOWEST_VENV)/bin/pip $(PIP_INSTALL) -r requirements-lowest.txt
	$(LOWEST_VENV)/bin/pip $(PIP_INSTALL) --no-deps .
	$(LOWEST_VENV)/bin/python -c "import flwr, numpy, torch, sys; print('lowest:', sys.version.split()[0], \
	  'flwr', flwr.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)"
	$(LOWEST_VENV)/bin/python -m pytest -q -p no:cacheprovider $(FAST_MARKS) tests/unit
	$(LOWEST_VENV)/bin/python -m pytest -q -p no:cacheprovider -m slow tests/unit/experiments/runner/test_sweep.py
	@date +"test-lowest: ended %T"

# The base install as a SuperLink or an edge client gets it: the wheel and flwr and numpy, at
# the versions of requirements-pins.txt (as constraints, without its extras: no Ray), nothing
# else. tests/install/no_torch_check.py runs from outside the checkout.
test-no-torch: dist
	@date +"test-no-torch: started %T"
	rm -rf $(NOTORCH_VENV)
	$(PYTHON) -m venv $(NOTORCH_VENV)
	sed 's/\[[a-z,]*\]//' requirements-pins.txt > $(NOTORCH_VENV)/constraints.txt
	$(NOTORCH_VENV)/bin/pip $(PIP_INSTALL) -c $(NOTORCH_VENV)/constraints.txt "$$(ls dist/lips_flwr-*.whl)"
	cd "$$(mktemp -d)" && $(abspath $(NOTORCH_VENV))/bin/python $(CURDIR)/tests/install/no_torch_check.py
	@date +"test-no-torch: ended %T"

main: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python examples/paper/run_grid.py \
	  examples/paper/conf/fashion-mnist-quick.toml --algorithms fedbn,lips --seeds 0 --engine flwr

clean:
	rm -rf $(VENV) $(WHEEL_VENV) $(LOWEST_VENV) $(NOTORCH_VENV) dist build
