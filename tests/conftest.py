"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
from collections.abc import Iterator

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


# -- `make test` on two workers (pytest-xdist, ``-n 2 --dist loadscope``) ---------------------
#
# Each test module is one unit of work, so a module's servers and fixtures start once, on one
# worker, and its tests run in their order; the Spark tests (tests/spark) are one unit, so one
# JVM serves them all; each run of a test in OWN_UNITS is a unit alone (the nemesis runs). The
# units start longest first, from the figures below (seconds of one unit on this machine, from
# ``pytest --durations``), so the last unit to start is a short one. A figure that went stale
# only costs balance, never a verdict. (xdist's own ``loadgroup`` mode cannot be used: it
# renames the items, which pytest 9 no longer lets a plugin do.)
OWN_UNITS = {"tests/cluster/test_nemesis.py::test_short_nemesis_run_loses_no_acknowledged_write"}
UNIT_SECONDS: dict[str, float] = {
    "spark": 120,
    "tests/integration/test_consumer_worker.py": 78,
    "tests/integration/test_bench_smoke.py": 51,
    "tests/integration/test_chaos.py": 48,
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
OWN_UNIT_SECONDS = 45.0  # one nemesis run


def _own_unit(nodeid: str) -> bool:
    return nodeid.split("[", 1)[0] in OWN_UNITS


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to (see above), from its node id."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/spark/"):
        return "spark"
    return nodeid if _own_unit(nodeid) else path


def _seconds(unit: str) -> float:
    return OWN_UNIT_SECONDS if _own_unit(unit) else UNIT_SECONDS.get(unit, 0.0)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Units of work as ``unit_of`` says, handed out whole in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return ByUnit(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the items longest unit first, each unit's items together and in
    their order (the order every worker reports, which the scheduler follows)."""
    if not hasattr(config, "workerinput"):
        return  # not an xdist worker: the run is serial, in the files' order
    units = {item: unit_of(item.nodeid) for item in items}
    first_seen: dict[str, int] = {}
    for index, unit in enumerate(units.values()):
        first_seen.setdefault(unit, index)
    items.sort(key=lambda item: (-_seconds(units[item]), first_seen[units[item]]))
