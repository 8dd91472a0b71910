# The README's commands. Everything is installed from this repository's own files.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test demo demo-reset lint format bench native clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[head,dev,engines]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/pytest -q -ra

demo: $(STAMP)
	$(BIN)/sing demo

demo-reset: $(STAMP)
	$(BIN)/sing demo --reset

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The replay's hot modules compiled with mypyc (needs a C compiler and the Python headers; optional:
# without a current build the same sources run as pure Python). See sing/scheduler/native.py.
native: $(STAMP)
	$(BIN)/python -m sing.scheduler.native build

bench: $(STAMP)
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) var build/native build/lib build/bdist*
