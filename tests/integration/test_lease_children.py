"""Lease mode: the children of a split start at once when their parent is finished.

The worker that reads a read-only parent to its end writes the end as its checkpoint, lists
the shards again at once and takes the children's new leases in the same moment, instead of
leaving them idle until the next taker round (every 2 x the lease timeout).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from loghub_consumer_worker import LEASE_TIMEOUT_MS
from server_process import ServerProcess
from test_consumer_worker import PROJECT, Fleet, wait_for

from loghub.client import LogHubClient
from loghub.coordination.lease import renews_per_lease_timeout
from loghub.wire.logs import make_log_group

RENEW_S = LEASE_TIMEOUT_MS // renews_per_lease_timeout / 1000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("children") / "data", keys={"ak": "sk"})
    process.start()
    try:
        with LogHubClient(process.endpoint, "ak", "sk") as client:
            client.create_project(PROJECT)
        yield process
    finally:
        process.stop()


def test_split_children_start_within_one_renew_of_their_parent_finishing(
    server: ServerProcess, tmp_path: Path
) -> None:
    logstore = f"children-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "events"
    out.mkdir()
    with LogHubClient(server.endpoint, "ak", "sk") as client:
        client.create_logstore(PROJECT, logstore, shard_count=1)
        for n in range(10):
            client.put_log_group(
                PROJECT, logstore, make_log_group([(1_700_000_000, {"key": "k", "n": str(n)})])
            )
        fleet = Fleet(server, logstore, "lease", f"sqlite:///{tmp_path / 'leases.db'}", True, out)
        try:
            fleet.start("a")
            wait_for(
                lambda: any(e["e"] == "start" and e["shard"] == 0 for e in fleet.events()),
                30,
                "the parent to start",
            )
            parent, left, right = client.split_shard(PROJECT, logstore, 0)
            children = {left.shard_id, right.shard_id}

            def children_started() -> bool:
                started = {e["shard"] for e in fleet.events() if e["e"] == "start"}
                return children <= started

            wait_for(children_started, 30, "the children to start")
        finally:
            fleet.close()
    events = fleet.events()
    finished_ns = max(e["t"] for e in events if e["shard"] == parent.shard_id)
    started_ns = max(e["t"] for e in events if e["e"] == "start" and e["shard"] in children)
    waited_s = (started_ns - finished_ns) / 1e9
    print(f"seconds from the parent's last event to both children started: {waited_s:.2f}")
    assert waited_s <= RENEW_S
