"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from postgres import PostgresNotInstalled, find_postgres_bin, running_postgres

# One verdict per commit: `make test` (and a plain `pytest`) draws the same examples every run
# and ignores examples saved by earlier runs. `make test-slow` loads ``wide``: random seeds and
# 5,000 examples for the tests that ask `hypothesis_budget.examples()` for their count.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("wide", max_examples=5000, print_blob=True)
settings.load_profile(os.environ.get("LOGHUB_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A SQLAlchemy URL of a database on a PostgreSQL server started for this session.

    Fails (never skips) when PostgreSQL is missing: a skipped back end is an untested one.
    """
    try:
        find_postgres_bin()
    except PostgresNotInstalled as exc:
        pytest.fail(str(exc), pytrace=False)
    with running_postgres() as url:
        yield url


# -- `make test` on two workers (pytest-xdist, ``-n 2 --dist loadgroup``) ---------------------
#
# Each test module is one unit of work, so a module's servers and fixtures start once, on one
# worker; every test that uses the Spark session is in one unit, so one JVM serves them all;
# a test marked with its own ``xdist_group`` (each of the nemesis runs) is a unit alone. The
# units start longest first, from the figures below (seconds of one unit on this machine,
# from ``pytest --durations``), so the last unit to start is a short one. A figure that went
# stale only costs balance, never a verdict.
UNIT_SECONDS: dict[str, float] = {
    "spark": 120,
    "tests/integration/test_consumer_worker.py": 78,
    "tests/integration/test_bench_smoke.py": 51,
    "tests/integration/test_chaos.py": 48,
    **{f"nemesis-run-{run}": 45 for run in range(10)},
    "tests/cluster/test_replication.py": 46,
    "tests/integration/test_cli_docs.py": 44,
    "tests/integration/test_sdk_consumer_worker.py": 37,
    "tests/integration/test_cli_admin.py": 36,
    "tests/integration/test_lease_balance.py": 32,
    "tests/cluster/test_cluster_nodes.py": 31,
    "tests/integration/test_resource_bounds.py": 24,
    "tests/cluster/test_kafka_cluster.py": 21,
    "tests/integration/test_kafka.py": 20,
    "tests/integration/test_cli_produce.py": 16,
    "tests/integration/test_console.py": 15,
    "tests/cluster/test_control_plane.py": 14,
    "tests/cluster/test_nemesis.py": 12,
    "tests/integration/test_damage.py": 11,
    "tests/cluster/test_group_coordination.py": 10,
    "tests/integration/test_cli_errors.py": 10,
    "tests/integration/test_consumer_memory.py": 10,
}
_TESTS = Path(__file__).resolve().parent


def _unit(item: pytest.Item) -> str:
    if "spark" in getattr(item, "fixturenames", ()):
        return "spark"
    return item.path.relative_to(_TESTS.parent).as_posix()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # not an xdist worker: the run is serial, in the files' order
    units: dict[pytest.Item, str] = {}
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        if marker is None:
            item.add_marker(pytest.mark.xdist_group(_unit(item)))
            units[item] = _unit(item)
        else:
            units[item] = str(marker.args[0] if marker.args else marker.kwargs["name"])
    first_seen = {unit: index for index, unit in reversed(list(enumerate(units.values())))}
    items.sort(key=lambda item: (-UNIT_SECONDS.get(units[item], 0.0), first_seen[units[item]]))
