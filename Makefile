# The two commands the README opens with work on a machine with only Python:
# each creates .venv and installs what it needs first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test unit lint typecheck bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python example_project/demo.py

test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest -q -ra --durations=15 tests

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

lint: $(STAMP)
	$(BIN)/ruff check celery_singlebeat tests benchmarks example_project
	$(BIN)/ruff format --check celery_singlebeat

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_scheduler.py

bench-quick: $(STAMP)
	$(BIN)/python benchmarks/bench_scheduler.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
