# The two commands the README opens with work on a machine with only Python:
# each creates .venv and installs what it needs first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo example test test-django test-django-newest test-pgbouncer test-compat test-python test-oldest unit lint typecheck bench bench-quick bench-load bench-failover bench-failover-mariadb bench-stored chaos explore compare docs plots clean dist smoke check-extras coverage coverage-python

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,suites,bench,release]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python example_project/demo.py

# The Django example project's deployment (example_project/docker-compose.yml,
# k8s/) as local processes: migrate, runserver, 3 beat replicas, a worker, on the
# local PostgreSQL (a database of its own) and Redis; adds a stored schedule
# through the admin's form and fails unless every slot ran once (about 30 s).
example: $(STAMP)
	$(BIN)/python example_project/run_example.py

# The suites mostly wait on real processes (beat replicas, workers, database
# clusters), so they run side by side in pytest-xdist workers: every test has its
# own tables, queues, ports and work directory. Tests that must not share a worker
# with each other carry an xdist_group (--dist loadgroup); those that must have
# the machine to itself are marked serial and run after. docs/testing.md, "How
# long the project's own suites take", says how TEST_WORKERS was chosen.
TEST_WORKERS ?= 4
test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest -q -ra --durations=15 -n $(TEST_WORKERS) --dist loadgroup -m "not serial" tests
	$(BIN)/python -m pytest -q -ra --durations=5 -m serial tests
	$(MAKE) --no-print-directory test-django

# The Django app (tests/django) under pytest-django, once per database: Django's
# settings are one per process, so each database is a run of its own with the
# suite's project (tests/django/sbproject) pointed at it by SB_DJANGO_DB. The
# runs go side by side (each has its own test databases, named per checkout and
# xdist worker), their output kept in a folder and shown one run after another.
DJANGO_DBS ?= sqlite postgres mysql
DJANGO_WORKERS ?= 2
test-django: $(STAMP)
	@out=$$(mktemp -d); \
	for db in $(DJANGO_DBS); do \
		( SB_DJANGO_DB=$$db $(BIN)/python -m pytest -q -ra -p no:cacheprovider --durations=5 \
			--ds=sbproject.settings -n $(DJANGO_WORKERS) --dist loadgroup tests/django \
			> $$out/$$db.log 2>&1; echo $$? > $$out/$$db.status ) & \
	done; wait; status=0; \
	for db in $(DJANGO_DBS); do \
		echo "test-django: $$db"; cat $$out/$$db.log; \
		[ "$$(cat $$out/$$db.status)" = 0 ] || status=1; \
	done; rm -rf $$out; exit $$status

# The PostgreSQL store contracts (slots, singleton leases, the fleet's rows and
# controls, the failover's write-back and broken connections) and the acceptance
# tests that use the shared PostgreSQL (marked shared_postgres by
# tests/conftest.py) through PgBouncer in transaction pooling mode
# (.ci/pgbouncer.sh starts a private one on 6432). The fleet contract's LISTEN
# tests skip there (a pooler's channel is deaf by design; make test holds that
# case against a PgBouncer of its own). The acceptance tests on SQLite, MariaDB
# or a PostgreSQL cluster of their own would not go through it: make test ran
# them already. Fails unless PgBouncer's SHOW STATS counted the run's transactions.
PGBOUNCER_PORT ?= 6432
PGBOUNCER_URL := postgresql+psycopg://postgres@127.0.0.1:$(PGBOUNCER_PORT)/test
test-pgbouncer: export PGBOUNCER_PORT := $(PGBOUNCER_PORT)
test-pgbouncer: $(STAMP)
	.ci/pgbouncer.sh start
	@before=$$(.ci/pgbouncer.sh xacts); status=0; \
	SB_TEST_PG=$(PGBOUNCER_URL) $(BIN)/python -m pytest -q -ra -p no:cacheprovider -k postgres \
		tests/integration/test_store_contract.py tests/integration/test_singleton_store_contract.py \
		tests/integration/test_fleet_contract.py tests/integration/test_failover_contract.py \
		|| status=$$?; \
	SB_TEST_PG=$(PGBOUNCER_URL) $(BIN)/python -m pytest -q -ra -p no:cacheprovider --durations=10 \
		-n $(TEST_WORKERS) --dist loadgroup -m shared_postgres tests/acceptance || status=$$?; \
	after=$$(.ci/pgbouncer.sh xacts); \
	echo "pgbouncer: $$((after - before)) transactions through 127.0.0.1:$(PGBOUNCER_PORT) during the run"; \
	if [ "$$after" -le "$$before" ]; then echo "pgbouncer: no traffic: the tests did not go through it" >&2; exit 1; fi; \
	exit $$status

# The in-process suites under another interpreter or Celery run side by side
# in this many pytest-xdist workers: they are CPU-bound (Hypothesis, the
# simulation), and the machine has two cores (docs/testing.md).
UNIT_WORKERS ?= 2

# The Django app under Django's newest release that django-celery-beat supports
# (6.0; 6.x needs Python 3.12+), in a venv of its own:
# make test-django-newest PY=/path/to/python3.13
DJANGO_NEWEST ?= Django>=6.0,<6.1
DJANGO_VENV = $(PYVENV)-django
test-django-newest:
	test -x $(DJANGO_VENV)/bin/python || $(PY) -m venv $(DJANGO_VENV)
	$(DJANGO_VENV)/bin/pip install --quiet -e '.[dev,suites]' '$(DJANGO_NEWEST)'
	$(DJANGO_VENV)/bin/python -c 'import django, sys; print("test-django-newest: Python %d.%d, Django %s" % (*sys.version_info[:2], django.get_version()))'
	$(MAKE) --no-print-directory test-django BIN=$(DJANGO_VENV)/bin STAMP= DJANGO_DBS="$(DJANGO_NEWEST_DBS)"
DJANGO_NEWEST_DBS ?= sqlite postgres

# The deterministic fault explorer (docs/testing.md, "The explorer"): SEEDS
# seeds from FROM, each shrunk and given its replay line when it fails;
# REPLAY=seed (with FAULTS=i,j from that line) runs one again, exactly.
SEEDS ?= 200
FROM ?= 0
explore: $(STAMP)
	$(BIN)/python -m celery_singlebeat.testing.explore $(if $(REPLAY),--replay $(REPLAY) $(if $(FAULTS),--faults $(FAULTS)),--seeds $(SEEDS) --from $(FROM)) $(if $(WITHOUT),--without $(WITHOUT))

# The oldest Celery we support, in a venv of its own: the scheduler subclasses
# Celery's Scheduler, whose internals move between releases.
CELERY_OLDEST ?= 5.2.7
KOMBU_OLDEST ?= 5.2.4
COMPAT := .venv-celery-$(CELERY_OLDEST)
test-compat:
	test -x $(COMPAT)/bin/python || $(PYTHON) -m venv $(COMPAT)
	$(COMPAT)/bin/pip install --quiet "celery==$(CELERY_OLDEST)" "kombu==$(KOMBU_OLDEST)" -e '.[dev]'
	$(COMPAT)/bin/python -m pytest -q -p no:cacheprovider -n $(UNIT_WORKERS) tests/unit

# Unit and contract suites under another interpreter: make test-python PY=/path/to/python3.9
PY ?= python3
PYVENV = .venv-py-$(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PYTHON_TESTS := tests/unit tests/integration/test_store_contract.py
test-python:
	test -x $(PYVENV)/bin/python || $(PY) -m venv $(PYVENV)
	$(PYVENV)/bin/pip install --quiet -e '.[dev]'
	$(PYVENV)/bin/python -m pytest -q -p no:cacheprovider -n $(UNIT_WORKERS) --dist loadgroup $(PYTHON_TESTS)

# The oldest interpreter with the oldest Celery, together: what CI runs in place
# of test-compat and test-python on the oldest Python (the oldest stack a user
# runs, in one venv and one pass of the suites): make test-oldest PY=/path/to/python3.9
OLDEST_VENV = $(PYVENV)-celery-$(CELERY_OLDEST)
test-oldest:
	test -x $(OLDEST_VENV)/bin/python || $(PY) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/pip install --quiet "celery==$(CELERY_OLDEST)" "kombu==$(KOMBU_OLDEST)" -e '.[dev]'
	$(OLDEST_VENV)/bin/python -c 'import celery, sys; assert celery.__version__ == "$(CELERY_OLDEST)", celery.__version__; print("test-oldest: Python %d.%d, Celery %s" % (*sys.version_info[:2], celery.__version__))'
	$(OLDEST_VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(UNIT_WORKERS) --dist loadgroup $(PYTHON_TESTS)

# The release (docs/release.md): the wheel and sdist in dist/, their metadata
# rendered (twine) and checked against the source (version, contents, entry points).
dist: $(STAMP)
	rm -rf dist build
	$(BIN)/python -m build
	$(BIN)/twine check --strict dist/*
	$(BIN)/python .ci/check_dist.py

# The wheel in a clean venv outside the checkout: beat on the embedded SQLite
# default sends a few runs through Redis, then singlebeat status lists them.
smoke: dist
	$(BIN)/python .ci/smoke_wheel.py

# Each extra alone in a clean venv, installed from the wheel, used for real.
check-extras: dist
	$(BIN)/python .ci/check_extras.py

# Line and branch coverage of the package by the in-process suites (the unit tests
# and the store contracts on SQLite, PostgreSQL and MariaDB); fails under the floor
# in setup.cfg ([coverage:report] fail_under).
COVERAGE_TESTS := tests/unit tests/integration/test_store_contract.py \
	tests/integration/test_singleton_store_contract.py tests/integration/test_fleet_contract.py
# pytest-cov gathers it from the xdist workers too (coverage.py alone would
# measure only the controller) and combines it before the report.
# The floor is held by the report that follows both runs, not by pytest-cov
# after the first: the Django app is measured by the second.
COVERAGE_RUN = -m pytest -q -p no:cacheprovider -n $(UNIT_WORKERS) --dist loadgroup \
	--cov --cov-report= --cov-fail-under=0 $(COVERAGE_TESTS)
# The Django app in process too (pytest-django on SQLite; its real beat
# processes, marked slow, measure nothing here), appended to the same data.
COVERAGE_DJANGO = -m pytest -q -p no:cacheprovider -n $(UNIT_WORKERS) --dist loadgroup \
	--cov --cov-append --cov-report= --cov-fail-under=0 --ds=sbproject.settings \
	-m "not slow" tests/django
coverage: $(STAMP)
	$(BIN)/python -m coverage erase
	$(BIN)/python $(COVERAGE_RUN)
	SB_DJANGO_DB=sqlite $(BIN)/python $(COVERAGE_DJANGO)
	$(BIN)/python -m coverage report

# The same under another interpreter, in its own venv: CI measures coverage on the
# newest Python in place of that interpreter's test-python run (the suites are a
# superset of test-python's), which saves running them twice.
coverage-python:
	test -x $(PYVENV)/bin/python || $(PY) -m venv $(PYVENV)
	$(PYVENV)/bin/pip install --quiet -e '.[dev,suites]'
	$(PYVENV)/bin/python -m coverage erase
	$(PYVENV)/bin/python $(COVERAGE_RUN)
	SB_DJANGO_DB=sqlite $(PYVENV)/bin/python $(COVERAGE_DJANGO)
	$(PYVENV)/bin/python -m coverage report

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

# ruff, then the architecture's import contracts ([tool.importlinter] in
# pyproject.toml; CONTRIBUTING.md says what each forbids and why). import-linter
# needs Python 3.11+ (the dev extra installs it there): under an older
# interpreter the contracts are not checked, said so, and CI (Python 3.11) fails.
lint: $(STAMP)
	$(BIN)/ruff check celery_singlebeat tests benchmarks example_project docs .ci
	$(BIN)/ruff format --check celery_singlebeat
	@if [ -x $(BIN)/lint-imports ]; then echo "$(BIN)/lint-imports --no-cache"; \
		$(BIN)/lint-imports --no-cache; \
	elif [ -n "$$CI" ]; then echo "lint: $(BIN)/lint-imports missing" >&2; exit 1; \
	else echo "lint: import contracts not checked (import-linter needs Python 3.11+)"; fi

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

# A PostgreSQL primary with a streaming standby of its own (asynchronous over a
# 300 ms link, then synchronous), 3 beat replicas and a SingletonTask worker
# through a movable address, 3 failovers per mode (benchmarks/bench_failover.py),
# about 4 minutes; writes results/failover-latest.json. Not part of make test.
bench-failover: $(STAMP)
	$(BIN)/python benchmarks/bench_failover.py --mode both --failovers 3 --seed 1

# The same with MariaDB (benchmarks/failover_mariadb.py): a primary and a GTID
# replica of its own, asynchronous through a 300 ms link, then semi-synchronous
# (AFTER_SYNC); about 4 minutes; writes results/failover-mariadb-latest.json.
bench-failover-mariadb: $(STAMP)
	$(BIN)/python benchmarks/bench_failover.py --database mariadb --mode both --failovers 3 --seed 1

# Stored entries at 10,000 and 100,000: 3 singlebeat replicas against one
# django-celery-beat DatabaseScheduler, in PostgreSQL databases of the run's own
# (start-up, edit to send, idle and storm statements, missed and doubled runs;
# benchmarks/README.md), about 15 minutes; writes results/stored-latest.json.
bench-stored: $(STAMP)
	$(BIN)/python benchmarks/bench_stored.py

# 5 beat replicas, 2 workers, own PostgreSQL and Redis, 10 minutes of seeded faults
# (benchmarks/README.md); exits non-zero if a slot ran twice or was lost.
chaos: $(STAMP)
	$(BIN)/python benchmarks/chaos.py --duration 600 --seed 1 --json benchmarks/results/chaos-latest.json

# The same failures applied to real beat processes of singlebeat, celery-redbeat,
# django-celery-beat and Celery's default (benchmarks/README.md), about 5 minutes.
compare: $(STAMP)
	$(BIN)/python benchmarks/compare_failures.py --json benchmarks/results/compare-latest.json

# The docs site, warnings as errors and every cross reference checked (nitpicky).
# The docs extra goes into the same venv on first use: its stamp is its own.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	rm -rf docs/_build
	$(BIN)/sphinx-build -b html -n -W --keep-going -q docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

# The PNGs under docs/_static/plots, from benchmarks/results/*.json, and the
# algorithm page's sequence diagram (all committed: the docs build draws nothing).
plots: $(DOCS_STAMP)
	$(BIN)/python benchmarks/plots.py
	$(BIN)/python docs/diagrams/takeover_sequence.py

clean:
	rm -rf $(VENV) .venv-celery-* .venv-py-* .pytest_cache .mypy_cache .ruff_cache *.egg-info \
		docs/_build dist build .coverage
