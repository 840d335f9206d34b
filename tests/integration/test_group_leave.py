"""Server mode: a worker stopped with SIGTERM leaves, so its shards move at once.

Without a leave the server can only wait for the group's timeout before it hands a silent
worker's shards on. A worker that has stopped every shard and written its checkpoints sends
one heartbeat reporting no shard: the server drops it at once, and the other worker starts
the shards at its next heartbeat.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from loghub_consumer_worker import HEARTBEAT_INTERVAL_MS, SERVER_TIMEOUT_MS
from server_process import ServerProcess
from test_consumer_worker import PROJECT, Fleet, wait_for

from loghub.client import LogHubClient

SHARDS = 4
# A heartbeat interval for the survivor to ask again, and room for a busy machine; well under
# what the timeout costs (the leaver's last heartbeat may be an interval old when it exits).
MOVE_BOUND_S = HEARTBEAT_INTERVAL_MS / 1000 + 0.6
assert MOVE_BOUND_S < (SERVER_TIMEOUT_MS - HEARTBEAT_INTERVAL_MS) / 1000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("leave") / "data", keys={"ak": "sk"})
    process.start()
    try:
        with LogHubClient(process.endpoint, "ak", "sk") as client:
            client.create_project(PROJECT)
        yield process
    finally:
        process.stop()


def _started(fleet: Fleet, pid: int) -> dict[int, int]:
    """Shard -> the last time (monotonic ns) ``pid`` started it."""
    return {e["shard"]: e["t"] for e in fleet.events() if e["e"] == "start" and e["pid"] == pid}


def test_a_worker_stopped_with_sigterm_leaves_and_its_shards_move_at_once(
    server: ServerProcess, tmp_path: Path
) -> None:
    logstore = f"leave-{uuid.uuid4().hex[:8]}"
    with LogHubClient(server.endpoint, "ak", "sk") as client:
        client.create_logstore(PROJECT, logstore, shard_count=SHARDS)
    out = tmp_path / "events"
    out.mkdir()
    fleet = Fleet(server, logstore, "server", "", False, out)
    try:
        fleet.start("a")
        wait_for(lambda: len(fleet.events()) > 0, 30, "a to start its shards")
        fleet.start("b")
        pid_a, pid_b = fleet.procs["a"].pid, fleet.procs["b"].pid

        def b_holds_half() -> bool:
            return len(_started(fleet, pid_b)) == SHARDS // 2

        wait_for(b_holds_half, 30, "the group to balance")
        fleet.stop("a")  # SIGTERM; returns once a exited cleanly
        exited_ns = time.monotonic_ns()
        a_shards = set(_started(fleet, pid_a)) - set(_started(fleet, pid_b))

        def b_holds_all() -> bool:
            return len(_started(fleet, pid_b)) == SHARDS

        wait_for(b_holds_all, 30, "b to take a's shards")
        started = _started(fleet, pid_b)
        moved_s = (max(started[s] for s in a_shards) - exited_ns) / 1e9
        print(f"seconds from a's exit to b starting its shards: {moved_s:.2f}")
        assert moved_s <= MOVE_BOUND_S
    finally:
        fleet.close()
