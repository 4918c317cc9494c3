# Two set-up commands, each bootstrapping its own virtualenv from nothing but Python 3.11:
#   make demo   train t5_tiny on the bundled corpus for a few minutes on CPU, evaluate, export
#   make test   the test suite (make test-fast skips tests marked slow)
# and after `make demo`, `make finetune-demo`: the sentiment task from the demo model and from a
# random init, same budget, and the naive Bayes baseline (BENCHMARKS.md has the figures)
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
DEMO_DIR ?= runs/demo
DEMO_STEPS ?= 200
DEMO_BATCH ?= 16
FT_STEPS ?= 600
FT_FLAGS = --task=sentiment --config.train.steps=$(FT_STEPS) --config.data.batch_size=16 \
    --config.data.targets_length=8 --config.train.eval_every=50 --config.optim.learning_rate=0.01

.PHONY: demo finetune-demo test test-fast bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python setup.py
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/t5lite train --config=configs/t5_tiny.py --workdir=$(DEMO_DIR) \
	    --config.train.steps=$(DEMO_STEPS) --config.data.batch_size=$(DEMO_BATCH) --config.train.eval_every=100
	$(BIN)/t5lite eval --workdir=$(DEMO_DIR)
	$(BIN)/t5lite export --workdir=$(DEMO_DIR) --out=$(DEMO_DIR)_hf

finetune-demo: $(VENV)/.installed
	$(BIN)/t5lite finetune --workdir=runs/ft_pretrained --from=$(DEMO_DIR) $(FT_FLAGS)
	$(BIN)/t5lite finetune --workdir=runs/ft_random --from=$(DEMO_DIR) --random_init $(FT_FLAGS)
	$(BIN)/python bench/naive_bayes_sentiment.py

# Two test processes (pytest-xdist), a file each at a time: most tests wait on one core (a
# compile, a subprocess), so two keep CI's two cores busy. Files in collection order, the slow
# ones first (tests/conftest.py), so that the longest do not start last.
TEST_FLAGS = -q -n 2 --dist loadfile --no-loadscope-reorder

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(TEST_FLAGS)

test-fast: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(TEST_FLAGS) -m 'not slow'

bench: $(VENV)/.installed-test
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .bench runs
