# The two commands the README opens with work on a machine with only Python:
# each creates .venv and installs what it needs first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-pgbouncer test-compat test-python unit lint typecheck bench bench-quick bench-load chaos compare clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python example_project/demo.py

test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest -q -ra --durations=15 tests

# The PostgreSQL store contract and the whole acceptance suite through PgBouncer in
# transaction pooling mode (.ci/pgbouncer.sh starts a private one on 6432; the
# acceptance tests that use SQLite or MariaDB run too, unchanged). Fails unless
# PgBouncer's SHOW STATS counted the run's transactions.
PGBOUNCER_PORT ?= 6432
PGBOUNCER_URL := postgresql+psycopg://postgres@127.0.0.1:$(PGBOUNCER_PORT)/test
test-pgbouncer: export PGBOUNCER_PORT := $(PGBOUNCER_PORT)
test-pgbouncer: $(STAMP)
	.ci/pgbouncer.sh start
	@before=$$(.ci/pgbouncer.sh xacts); status=0; \
	SB_TEST_PG=$(PGBOUNCER_URL) $(BIN)/python -m pytest -q -ra -p no:cacheprovider -k postgres \
		tests/integration/test_store_contract.py tests/integration/test_singleton_store_contract.py \
		|| status=$$?; \
	SB_TEST_PG=$(PGBOUNCER_URL) $(BIN)/python -m pytest -q -ra -p no:cacheprovider --durations=10 \
		tests/acceptance || status=$$?; \
	after=$$(.ci/pgbouncer.sh xacts); \
	echo "pgbouncer: $$((after - before)) transactions through 127.0.0.1:$(PGBOUNCER_PORT) during the run"; \
	if [ "$$after" -le "$$before" ]; then echo "pgbouncer: no traffic: the tests did not go through it" >&2; exit 1; fi; \
	exit $$status

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
	$(BIN)/python benchmarks/bench_singleton.py
	$(BIN)/python benchmarks/bench_load.py

bench-quick: $(STAMP)
	$(BIN)/python benchmarks/bench_scheduler.py --quick
	$(BIN)/python benchmarks/bench_scale.py --quick
	$(BIN)/python benchmarks/bench_singleton.py --quick
	$(BIN)/python benchmarks/bench_load.py --quick

# 3 beat replicas, 10,000 entries (half crontab() every minute), 5 minutes, in a
# PostgreSQL database of its own; exits non-zero unless every slot was sent once.
bench-load: $(STAMP)
	$(BIN)/python benchmarks/bench_load.py

# 5 beat replicas, 2 workers, own PostgreSQL and Redis, 10 minutes of seeded faults
# (benchmarks/README.md); exits non-zero if a slot ran twice or was lost.
chaos: $(STAMP)
	$(BIN)/python benchmarks/chaos.py --duration 600 --seed 1 --json benchmarks/results/chaos-latest.json

# The same failures applied to real beat processes of singlebeat, celery-redbeat,
# django-celery-beat and Celery's default (benchmarks/README.md), about 5 minutes.
compare: $(STAMP)
	$(BIN)/python benchmarks/compare_failures.py --json benchmarks/results/compare-latest.json

clean:
	rm -rf $(VENV) .venv-celery-* .venv-py-* .pytest_cache .mypy_cache .ruff_cache *.egg-info
