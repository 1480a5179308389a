# `make test` and `make demo` work on a fresh machine: they create .venv and install memcores.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-slow lint format demo bench mutate clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,ray,envpool,torchrl,rllib]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# over one pytest-xdist worker per CPU core, at most 8 (each holds its own torch): the suite
# is CPU-bound
test: lint
	$(BIN)/python -m pytest -q -n auto --maxprocesses 8

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

demo: $(STAMP)
	$(BIN)/memcores list cores
	$(BIN)/memcores supervised experiments/configs/demo_copy.yaml run.dir=runs/demo_copy
	$(BIN)/memcores train experiments/configs/demo_rl.yaml run.dir=runs/demo_rl run.overwrite=true

bench: $(STAMP)
	$(BIN)/memcores bench cores

# mutation testing of the maths the results rest on (mutmut, one module at a time; not part of
# `make test`): writes results/mutation/, whose README says how long it took
mutate: $(STAMP)
	$(BIN)/python tests/mutate.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
