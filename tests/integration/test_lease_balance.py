"""Lease mode with real processes on SQLite and PostgreSQL: how fast shards find a home.

``spec/lease-protocol.md`` promises that a group balances within one taker round plus one
lease timeout, however many shards move. Four worker processes start at the same instant
(a start file they all wait for) on 16 shards, which is when their compare-and-sets race
hardest; every run must end with each worker consuming 4 shards within that bound. A
SIGKILLed worker's shards must be consumed again within one lease timeout and one renew.

The processes stay up across runs: each run is a new consumer group in the same tables,
which spares a process start (an interpreter and SQLAlchemy) per run. ``make test`` runs 5
runs per database; ``make test-slow`` runs 20.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest
from postgres import create_schema

from loghub._clock import SystemClock
from loghub.coordination.lease import (
    LeaseCoordinator,
    renews_per_lease_timeout,
    taker_interval_lease_timeouts,
)
from loghub.coordination.lease_sql import SqlLeaseStore

SIG = "endpoint/project/logstore"
SHARDS = list(range(16))
WORKERS = 4
TIMEOUT_MS = 2_000
RENEW_MS = TIMEOUT_MS // renews_per_lease_timeout
BALANCE_BOUND_S = (taker_interval_lease_timeouts * TIMEOUT_MS + TIMEOUT_MS) / 1000
# The parent looks every POLL_S, and a process woken on time may still wait for a core on a
# busy machine: what the bound grants the watcher, not the protocol.
POLL_S = 0.02
WATCH_SLACK_S = 0.3
# The bounds are the protocol's, in lease time; the moments are timers in worker processes,
# which a loaded 2-core runner wakes late (0.4-0.6 s late in full runs: 3.31 s for a takeover
# bounded at 2.97 s, 6.69 s for a balance bounded at 6.3 s). One renew of scheduling is
# allowed on top; a worker that missed a whole round of the protocol still fails the bound.
SCHEDULING_SLACK_S = RENEW_MS / 1000


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def lease_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'leases.db'}"
    base_url: str = request.getfixturevalue("postgres_url")
    url: str = create_schema(base_url, f"balance_{uuid.uuid4().hex[:12]}")
    return url


def _wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.001)


def _worker_process(url: str, name: str, runs: int, directory: str) -> None:
    """One worker per run: register the store, wait for the start file, then run the protocol
    (sleeping until each ``next_tick_ms``) until the stop file appears, and leave."""
    clock = SystemClock()
    folder = Path(directory)
    for run in range(runs):
        store = SqlLeaseStore.open(url, f"group{run}", SIG, clock)
        coordinator = LeaseCoordinator(store, clock, name, lease_timeout_ms=TIMEOUT_MS)
        (folder / f"ready-{run}-{name}").touch()
        _wait_for(folder / f"go-{run}")
        decisions = coordinator.start(SHARDS)
        stop = folder / f"stop-{run}"
        while not stop.exists():
            wait_ms = decisions.next_tick_ms - clock.monotonic_ms()
            time.sleep(min(max(wait_ms, 0), 20) / 1000)
            decisions = coordinator.tick(SHARDS)
        coordinator.shutdown()
        store.close()


class _Workers:
    def __init__(self, url: str, runs: int, directory: Path) -> None:
        self.url = url
        self.runs = runs
        self.directory = directory
        self.names = [f"w{i}" for i in range(WORKERS)]
        context = multiprocessing.get_context("spawn")
        self.processes: dict[str, BaseProcess] = {
            name: context.Process(
                target=_worker_process, args=(url, name, runs, str(directory)), daemon=True
            )
            for name in self.names
        }

    def __enter__(self) -> _Workers:
        for process in self.processes.values():
            process.start()
        return self

    def __exit__(self, *_: object) -> None:
        for run in range(self.runs):
            (self.directory / f"go-{run}").touch()
            (self.directory / f"stop-{run}").touch()
        for process in self.processes.values():
            process.join(timeout=30)
            if process.is_alive():
                process.kill()

    def go(self, run: int) -> float:
        """Start run ``run`` once every worker is ready; returns the start time (monotonic)."""
        deadline = time.monotonic() + 60
        for name in self.names:
            while not (self.directory / f"ready-{run}-{name}").exists():
                assert time.monotonic() < deadline, f"{name} never got ready for run {run}"
                assert self.processes[name].is_alive(), f"{name} died"
                time.sleep(0.01)
        (self.directory / f"go-{run}").touch()
        return time.monotonic()

    def stop(self, run: int) -> None:
        (self.directory / f"stop-{run}").touch()


def _consumers(store: SqlLeaseStore) -> Counter[str]:
    """Who consumes each shard: the lease and consumer owner agree (no steal in progress)."""
    records = store.list_leases()
    owners = Counter(r.consumer_owner for r in records if r.lease_owner == r.consumer_owner)
    if len(records) != len(SHARDS):
        return Counter()
    return owners


def _seconds_to_balance(store: SqlLeaseStore, started_s: float, workers: int) -> float:
    while True:
        owners = _consumers(store)
        placed = owners.total() == len(SHARDS) and "" not in owners and len(owners) == workers
        if placed and max(owners.values()) - min(owners.values()) <= 1:
            return time.monotonic() - started_s
        elapsed_s = time.monotonic() - started_s
        if elapsed_s > 3 * BALANCE_BOUND_S:
            raise AssertionError(f"not balanced after {elapsed_s:.1f} s: {store.list_leases()}")
        time.sleep(POLL_S)


def _balance_runs(lease_url: str, tmp_path: Path, runs: int) -> list[float]:
    watcher = SqlLeaseStore.open(lease_url, "watch", SIG, SystemClock())  # creates the tables
    times_s = []
    try:
        with _Workers(lease_url, runs, tmp_path) as workers:
            for run in range(runs):
                store = SqlLeaseStore.open(lease_url, f"group{run}", SIG, SystemClock())
                try:
                    started_s = workers.go(run)
                    times_s.append(_seconds_to_balance(store, started_s, WORKERS))
                finally:
                    workers.stop(run)
                    store.close()
    finally:
        watcher.close()
    return times_s


def _check_runs(times_s: list[float]) -> None:
    slow = [
        round(t, 2) for t in times_s if t > BALANCE_BOUND_S + WATCH_SLACK_S + SCHEDULING_SLACK_S
    ]
    print(f"seconds to balance: {sorted(round(t, 2) for t in times_s)}")
    assert not slow, f"runs over {BALANCE_BOUND_S} s: {slow} (all: {times_s})"


def test_four_workers_started_together_balance_within_one_round_and_one_timeout(
    lease_url: str, tmp_path: Path
) -> None:
    _check_runs(_balance_runs(lease_url, tmp_path, runs=5))


@pytest.mark.slow
def test_twenty_runs_of_four_workers_started_together_all_balance_in_time(
    lease_url: str, tmp_path: Path
) -> None:
    _check_runs(_balance_runs(lease_url, tmp_path, runs=20))


@pytest.fixture
def balanced_group(lease_url: str, tmp_path: Path) -> Iterator[tuple[_Workers, SqlLeaseStore]]:
    watcher = SqlLeaseStore.open(lease_url, "group0", SIG, SystemClock())
    try:
        with _Workers(lease_url, 1, tmp_path) as workers:
            _seconds_to_balance(watcher, workers.go(0), WORKERS)
            yield workers, watcher
    finally:
        watcher.close()


def test_a_killed_workers_shards_are_consumed_again_within_one_timeout_and_one_renew(
    balanced_group: tuple[_Workers, SqlLeaseStore],
) -> None:
    workers, store = balanced_group
    victim = workers.names[0]
    pid = workers.processes[victim].pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_s = time.monotonic()
    workers.processes[victim].join(timeout=10)
    while True:
        owners = _consumers(store)
        if victim not in owners and owners.total() == len(SHARDS):
            moved_s = time.monotonic() - killed_s
            break
        assert time.monotonic() - killed_s < 5 * TIMEOUT_MS / 1000, store.list_leases()
        time.sleep(POLL_S)
    print(f"seconds for the killed worker's shards to move: {moved_s:.2f}")
    # The protocol's bound is one timeout and one renew (a survivor sees the victim's last
    # renew up to one renew late, and wakes when the lease it watches expires); a takeover
    # that waited for a taker round (a whole lease timeout or more) still fails.
    bound_s = (TIMEOUT_MS + RENEW_MS) / 1000 + WATCH_SLACK_S + SCHEDULING_SLACK_S
    assert moved_s <= bound_s
    balanced_s = _seconds_to_balance(store, killed_s, WORKERS - 1)
    assert balanced_s <= BALANCE_BOUND_S + WATCH_SLACK_S + SCHEDULING_SLACK_S
