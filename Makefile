# make train  — create .venv, install aiayn (torch pinned), run the default job
# make test   — same install, run the tests on every core (PYTEST_ARGS to pass options; PYTEST_WORKERS=1 for one process)
# make test-fast — the inner loop: the tests of about a second or less (not slow, not a process of their own)
# make lint   — ruff, with the rules in pyproject.toml
# make gpu-check — same install, then on a machine with a CUDA GPU, in under 9 minutes: the gpu-marked
#                  tests, bf16 training throughput (big and base, eager, then each speed switch: CUDA graphs,
#                  length buckets, plain Adam), the user's command (train.py model=big task=wmt_en_fr, 100 steps)
#                  and beam-4 decoding (ours and CTranslate2); appends to benchmarks/results/gpu_suite.{jsonl,md} and
#                  train_throughput.jsonl (benchmarks/gpu_suite.py; GPU_CHECK_ARGS for its options). On a node where
#                  aiayn is installed already (from a wheelhouse, without internet): GPU_PYTHON=python3, no install
# make wheelhouse — the wheels a machine without internet (a cluster's GPU node) needs to install aiayn beside
#                  its own torch: WHEELHOUSE_ARGS="--python 3.12 --have node-packages.txt" (scripts/wheelhouse.py)
PYTHON ?= python3
VENV ?= .venv
# The pinned torch: the CPU build is enough for the default job and the tests; on a GPU machine
# pip takes the CUDA build of the same version.
TORCH_VERSION ?= 2.13.0
ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist: one worker per core (at most 8); worksteal balances the few long tests.
PYTEST_WORKERS ?= auto
PYTEST_XDIST := -n $(PYTEST_WORKERS) --maxprocesses=8 --dist worksteal
GPU_CHECK_ARGS ?=
# The Python that runs the GPU check: empty, .venv's (made by install); a path, that one as it is (a node's own
# torch and aiayn, installed from `make wheelhouse`'s wheels: the install's index is not reachable there).
GPU_PYTHON ?=
WHEELHOUSE_ARGS ?= --python 3.12

# Real data: the shared data folder beside the checkout when there is one, else the user cache
# (missing Multi30k files are downloaded there).
AIAYN_DATA_ROOT ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),$(HOME)/.cache/aiayn/data)
export AIAYN_DATA_ROOT

BIN := $(VENV)/bin

.PHONY: install train test test-fast lint gpu-check wheelhouse clean
install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install torch==$(TORCH_VERSION)
	$(BIN)/pip install -e '.[dev,bench,browse,onnx]'
	touch $@

train: install
	$(BIN)/python src/train.py $(ARGS)

test: install
	$(BIN)/python -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest $(PYTEST_XDIST) -m "not slow and not cli and not gpu" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .

gpu-check: $(if $(GPU_PYTHON),,install)
	$(or $(GPU_PYTHON),$(BIN)/python) benchmarks/gpu_suite.py $(GPU_CHECK_ARGS)

wheelhouse: install
	$(BIN)/python scripts/wheelhouse.py $(WHEELHOUSE_ARGS)

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
