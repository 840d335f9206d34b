# Every target sets up what it needs: a fresh machine only needs python3 and make.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-slow chaos nemesis bench cluster-demo lint setup system-deps clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py src/loghub/client/_encode.c src/loghub/wire/_logcheck.c \
		src/loghub/storage/_gather_c.c src/loghub/spark/_scan.c
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

# on two workers (pytest-xdist): each test module is one unit of work, longest first
# (tests/conftest.py); TEST_WORKERS=0 runs the suite in one process, in the files' order
TEST_WORKERS ?= 2
test: $(STAMP) system-deps
	$(PY) -m pytest -q -m 'not slow' $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) \
		--dist loadscope --no-loadscope-reorder)

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

# Jepsen-style runs on a 3-node cluster (tests/nemesis, docs/nemesis.md): writers of unique ids,
# seeded faults, then a history checker; exit 1 if an acknowledged write was lost, an offset
# holds two values, or (replicated) a shard's replicas are not in sync and byte-identical after
# healing. Three replicas of each shard by default (NEMESIS_REPLICATION_FACTOR=1: one copy,
# moved by hand-overs). LOGHUB_SEED=... replays a schedule, NEMESIS_ARGS for more (--faults a,b).
# NEMESIS_NETWORK: netns (namespaces and nft rules, root), proxy, or auto (netns when it can run).
NEMESIS_RUNS ?= 100
NEMESIS_SECONDS ?= 60
NEMESIS_REPLICATION_FACTOR ?= 3
NEMESIS_NETWORK ?= auto
nemesis: $(STAMP) system-deps
	$(PY) tests/nemesis/run.py --runs $(NEMESIS_RUNS) --seconds $(NEMESIS_SECONDS) \
		--replication-factor $(NEMESIS_REPLICATION_FACTOR) --network $(NEMESIS_NETWORK) $(NEMESIS_ARGS)

# Every benchmark in benchmarks/ within BENCH_MINUTES (Redis and NATS beside LogHub, started
# and stopped by the scripts), then BENCHMARKS.md with tables and charts from
# benchmarks/results/ (see docs/benchmarks.md); BENCH_ARGS="--only ingest,pull" for a part.
BENCH_MINUTES ?= 20
bench: $(STAMP) system-deps
	$(PY) benchmarks/run_all.py --minutes $(BENCH_MINUTES) $(BENCH_ARGS)

# Three etcd members and three LogHub nodes on loopback ports: writes and a consumer group
# across them, a node killed and its shards moved (docs/cluster.md); everything stopped by PID.
cluster-demo: $(STAMP) system-deps
	$(PY) scripts/cluster_demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) run-data .pytest_cache .mypy_cache .ruff_cache .hypothesis
