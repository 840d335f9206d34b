"""The short chaos run of `make test`, and the checker it relies on.

The run (tests/chaos/driver.py) starts a real `loghub serve` on a small tmpfs, a producer,
two ordered consumer groups of worker processes (one coordinated by the server, one by
leases in a real PostgreSQL), and injects, for about half a minute, the faults the server
survives: SIGKILL and restart of the server, a flipped byte in a closed segment, SIGSTOP and
SIGCONT of the server and of a consumer past the group timeout, SIGKILL of consumers,
split, merge, PostgreSQL backends terminated, a full disk.
The long run (`make chaos`) adds a Spark stream and SIGKILLs it.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chaos"))

from checker import check_group  # noqa: E402
from driver import Options, report, run  # noqa: E402
from faults import SURVIVED, Fault  # noqa: E402

SHORT_RUN_S = 30.0
SEED = 20261125  # fixed, so the schedule is the same every run; LOGHUB_SEED replays another


@pytest.fixture
def chaos_database(postgres_url: str) -> Iterator[str]:
    """A database of its own on the session's PostgreSQL server: the run's break_postgres
    terminates every backend of its database, and only of its database."""
    url = make_url(postgres_url)
    name = f"chaos_{uuid.uuid4().hex[:12]}"
    server = {"host": url.host, "port": url.port, "user": url.username, "dbname": "postgres"}
    with psycopg.connect(**server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield url.set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(**server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.mark.postgres
def test_short_chaos_run_loses_no_acknowledged_log_and_keeps_key_order(
    chaos_database: str,
) -> None:
    seed = int(os.environ.get("LOGHUB_SEED", SEED))
    lines: list[str] = []
    result = run(
        Options(
            seconds=SHORT_RUN_S,
            faults=SURVIVED,
            seed=seed,
            catch_up_s=60,
            postgres_url=chaos_database,
        ),
        log=lines.append,
    )
    report(result, log=lines.append)
    text = "\n".join(lines)
    print(text)
    injected = {fault.kind for fault in result.faults}
    expected = set(SURVIVED) - (set() if result.disk_full_available else {"fill_disk"})
    assert expected <= injected, f"faults never injected: {expected - injected}\n{text}"
    assert result.acked > 500, text
    assert all(group.processed >= result.acked for group in result.groups), text
    assert result.lost == 0, text
    assert result.order_violations == 0, text


def _logs(pid: int, t: int, shard: int, first_seq: int, *logs: tuple[str, int]) -> dict[str, Any]:
    return {"e": "logs", "pid": pid, "t": t, "shard": shard,
            "logs": [[key, n, first_seq + i] for i, (key, n) in enumerate(logs)]}  # fmt: skip


def test_checker_tells_lost_reordered_and_unexplained_logs_from_explained_duplicates() -> None:
    acked = {("a", 0): 1, ("a", 1): 2, ("a", 2): 3, ("b", 0): 4, ("b", 1): 5}
    events = [
        _logs(10, 100, 0, 0, ("a", 0), ("a", 1)),
        {"e": "ckpt", "pid": 10, "t": 150, "shard": 0, "seq": 1},
        # (a, 1) again after pid 10 was killed, from its last durable checkpoint: explained
        _logs(11, 300, 0, 1, ("a", 1), ("a", 2)),
        # b's logs out of write order, and processed twice by a process never hit: unexplained
        _logs(11, 400, 1, 0, ("b", 1)),
        _logs(11, 410, 1, 0, ("b", 1)),
    ]
    kill = Fault("kill_consumer", started_ns=200, lifted_ns=200, pid=10)
    report = check_group("g", events, acked, failed=set(), faults=[kill])
    assert report.lost == [("b", 0)]
    assert report.redelivered_explained == 1
    assert len(report.unexplained) == 1 and "('b', 1)" in report.unexplained[0]
    assert report.order_violations == []  # b 0 was never processed: nothing to be out of order

    events.append(_logs(12, 500, 1, 5, ("b", 0)))
    report = check_group("g", events, acked, failed=set(), faults=[kill])
    assert report.lost == []
    assert len(report.order_violations) == 1 and "b: n=0" in report.order_violations[0]


def test_checker_explains_redelivery_after_a_pause_by_the_checkpoint_before_the_pause() -> None:
    """The successor starts from the checkpoint written before the pause; checkpoints it
    writes itself while the paused process sleeps do not make the redelivery unexplained."""
    acked = {("a", 0): 1, ("a", 1): 2}
    events = [
        {"e": "ckpt", "pid": 10, "t": 50, "shard": 0, "seq": 0},
        _logs(10, 100, 0, 0, ("a", 0), ("a", 1)),  # pid 10 paused at 200, before persisting
        _logs(11, 300, 0, 0, ("a", 0), ("a", 1)),
        {"e": "ckpt", "pid": 11, "t": 350, "shard": 0, "seq": 2},
    ]
    pause = Fault("pause_consumer", started_ns=200, lifted_ns=400, pid=10)
    report = check_group("g", events, acked, failed=set(), faults=[pause])
    assert report.redelivered_explained == 2
    assert report.unexplained == []
