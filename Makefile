# Every target sets up what it needs: a fresh machine only needs python3 and make.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-slow chaos bench lint setup system-deps clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py src/loghub/client/_encode.c src/loghub/spark/_scan.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# PostgreSQL (for the tests of the PostgreSQL back ends) and Java (for Spark) from Debian's
# packages, installed only when missing.
system-deps:
	bash scripts/ensure-system-deps.sh

run: $(STAMP) system-deps
	$(VENV)/bin/loghub demo --data-dir run-data

test: $(STAMP) system-deps
	$(PY) -m pytest -q -m 'not slow'

# The long suites, then every property test again with random seeds and more examples
# (5,000 for the Spark decoder's): a failure there prints how to reproduce it.
test-slow: $(STAMP) system-deps
	$(PY) -m pytest -q -m slow
	LOGHUB_HYPOTHESIS_PROFILE=wide $(PY) -m pytest -q -m hypothesis --timeout 3600

# Real processes under real faults (see tests/chaos/driver.py and docs/operations.md);
# CHAOS_SECONDS=600 for a longer run, LOGHUB_SEED=... to replay one, CHAOS_ARGS for more.
CHAOS_SECONDS ?= 180
chaos: $(STAMP) system-deps
	$(PY) tests/chaos/driver.py --seconds $(CHAOS_SECONDS) --spark $(CHAOS_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/ingest.py
	$(PY) benchmarks/pull.py
	$(PY) benchmarks/groups.py
	$(PY) benchmarks/heartbeats.py
	$(PY) benchmarks/idle_shards.py
	$(PY) benchmarks/rebalance.py
	$(PY) benchmarks/spark_source.py
	$(PY) benchmarks/big_bodies.py
	$(PY) benchmarks/consumer_memory.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) run-data .pytest_cache .mypy_cache .ruff_cache .hypothesis
