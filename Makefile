# The two commands the README opens with work on a machine with only Python:
# each creates .venv and installs what it needs first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-compat test-python unit lint typecheck bench bench-quick chaos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python example_project/demo.py

test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest -q -ra --durations=15 tests

# The oldest Celery we support, in a venv of its own: the scheduler subclasses
# Celery's Scheduler, whose internals move between releases.
CELERY_OLDEST ?= 5.2.7
KOMBU_OLDEST ?= 5.2.4
COMPAT := .venv-celery-$(CELERY_OLDEST)
test-compat:
	test -x $(COMPAT)/bin/python || $(PYTHON) -m venv $(COMPAT)
	$(COMPAT)/bin/pip install --quiet "celery==$(CELERY_OLDEST)" "kombu==$(KOMBU_OLDEST)" -e '.[dev]'
	$(COMPAT)/bin/python -m pytest -q -p no:cacheprovider tests/unit

# Unit and contract suites under another interpreter: make test-python PY=/path/to/python3.9
PY ?= python3
PYVENV = .venv-py-$(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
test-python:
	test -x $(PYVENV)/bin/python || $(PY) -m venv $(PYVENV)
	$(PYVENV)/bin/pip install --quiet -e '.[dev]'
	$(PYVENV)/bin/python -m pytest -q -p no:cacheprovider tests/unit tests/integration/test_store_contract.py

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

lint: $(STAMP)
	$(BIN)/ruff check celery_singlebeat tests benchmarks example_project
	$(BIN)/ruff format --check celery_singlebeat

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_scheduler.py
	$(BIN)/python benchmarks/bench_scale.py

bench-quick: $(STAMP)
	$(BIN)/python benchmarks/bench_scheduler.py --quick
	$(BIN)/python benchmarks/bench_scale.py --quick

# 5 beat replicas, 2 workers, own PostgreSQL and Redis, 10 minutes of seeded faults
# (benchmarks/README.md); exits non-zero if a slot ran twice or was lost.
chaos: $(STAMP)
	$(BIN)/python benchmarks/chaos.py --duration 600 --seed 1 --json benchmarks/results/chaos-latest.json

clean:
	rm -rf $(VENV) .venv-celery-* .venv-py-* .pytest_cache .mypy_cache .ruff_cache *.egg-info
