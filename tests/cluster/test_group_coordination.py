"""Consumer groups on a 3-node cluster (real etcd members, real `loghub serve` nodes): each
group has one coordinator, the holder of its key in etcd; groups spread over the nodes; a
heartbeat through any node reaches the holder; when the holder is killed (SIGKILL) or
paused past its lease (SIGSTOP), another node takes the group over after the TTL and the
consumers keep their shards, checkpoints never go back, and the old holder changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from cluster_nodes import NODE_TTL_S, LogHubCluster, running_cluster
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.cluster.etcd_store import EtcdStore
from loghub.cluster.group_coordinators import (
    GroupAssignment,
    assignment_key,
    coordinator_key,
)
from loghub.cluster.status import set_drain
from loghub.coordination.placement import NodeSlot, group_coordinator, place
from loghub.errors import LogStoreNotExist, ServerBusy
from loghub.wire.cursor import encode_cursor
from loghub.wire.logs import make_log_group

PROJECT = "grouped"
SHARDS = 4
TIMEOUT_S = 20  # longer than a takeover (TTL + a request), so nobody times out meanwhile

T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LogHubCluster]:
    with running_cluster(tmp_path_factory.mktemp("groups"), 3) as running:
        with client(running.nodes[0]) as first:
            first.create_project(PROJECT)
        running.wait_placed()
        yield running


def client(node: ServerProcess) -> LogHubClient:
    return LogHubClient(node.endpoint, timeout_s=10)


def live(cluster: LogHubCluster) -> list[ServerProcess]:
    return [n for n in cluster.nodes if n.proc is not None and n.proc.poll() is None]


def etcd_read(cluster: LogHubCluster, key: str) -> bytes | None:
    async def read() -> bytes | None:
        async with EtcdStore(cluster.etcd.url) as store:
            entry = await store.get(key)
            return entry.value if entry is not None else None

    return asyncio.run(read())


def holder(cluster: LogHubCluster, logstore: str, group: str) -> str | None:
    value = etcd_read(cluster, coordinator_key((PROJECT, logstore, group)))
    return value.decode() if value is not None else None


def saved(cluster: LogHubCluster, logstore: str, group: str) -> GroupAssignment:
    value = etcd_read(cluster, assignment_key((PROJECT, logstore, group)))
    assert value is not None, "the assignment was saved"
    return GroupAssignment.decode(value, 0)


def node_of(cluster: LogHubCluster, node_id: str) -> ServerProcess:
    return cluster.nodes[int(node_id.removeprefix("n"))]


def retried(call: Callable[[], T], timeout_s: float = 15.0) -> tuple[T, float]:
    """``call`` until it stops answering 503 (a group changing coordinator); its answer and
    how long that took."""
    started = time.monotonic()
    while True:
        try:
            return call(), time.monotonic() - started
        except ServerBusy:
            assert time.monotonic() - started < timeout_s, "still busy"
            time.sleep(0.05)


def settle(
    via: LogHubClient, logstore: str, group: str, consumers: list[str]
) -> dict[str, list[int]]:
    """Heartbeats of consumers that take and let go at once, until every shard not read to
    its end (an empty one left by a move is) is held and a round changes nothing."""
    held: dict[str, list[int]] = {name: [] for name in consumers}
    for _round in range(20):
        for name in consumers:
            held[name] = via.heartbeat(PROJECT, logstore, group, name, held[name])
        shards = via.describe_consumer_group(PROJECT, logstore, group)["shards"]
        open_ids = sorted(s["shard"] for s in shards if s["state"] != "over")
        covered = sorted(s for ids in held.values() for s in ids) == open_ids
        if covered and all(
            via.heartbeat(PROJECT, logstore, group, n, held[n]) == held[n] for n in consumers
        ):
            return held
    raise AssertionError(f"the group did not settle: {held}")


def moves_left(cluster: LogHubCluster, via: LogHubClient) -> int:
    """How many writable shards the controller would still place or move, plus hand-overs
    under way: for each logstore, what ``coordination.placement.place`` (the controller's
    own rule, per logstore) makes of the live nodes, against the owners its record names."""
    status = cluster.status()
    slots = [
        NodeSlot(str(n["node"]), str(n["rack"]), bool(n["draining"]))  # type: ignore[index]
        for n in status["nodes"]  # type: ignore[attr-defined]
    ]
    left = len(status["handovers"])  # type: ignore[arg-type]
    for (project, logstore), record in cluster.placements().items():
        owners = record.owners
        try:
            shards = via.list_shards(project, logstore)
        except LogStoreNotExist:
            continue  # deleted: the controller forgets it
        current = {
            (project, logstore, s.shard_id): owners.get(s.shard_id, "")
            for s in shards
            if s.status == "readwrite"
        }
        target = place(list(current), slots, {k: v for k, v in current.items() if v})
        left += sum(1 for ref, owner in current.items() if target.get(ref) != owner)
    return left


def wait_balanced(cluster: LogHubCluster, timeout_s: float = 30.0) -> None:
    """Until the controller has nothing left to place or move. A node back from a pause has
    no shards, and the controller hands some over to it by succession: a shard written by id
    in the meantime turns read-only under the writer (ShardReadOnly), by design."""
    deadline = time.monotonic() + timeout_s
    with client(live(cluster)[0]) as via:
        while (left := moves_left(cluster, via)) != 0:
            assert time.monotonic() < deadline, f"{left} shards still to place or move"
            time.sleep(0.1)


def logstore_with_data(cluster: LogHubCluster, name: str) -> None:
    """A logstore of SHARDS shards, each written by id: made once the cluster is balanced,
    so that placing them moves nothing, and written once they are placed."""
    wait_balanced(cluster)
    with client(cluster.nodes[0]) as first:
        first.create_logstore(PROJECT, name, shard_count=SHARDS)
        cluster.wait_placed(SHARDS)
        wait_balanced(cluster)
        assert [s.shard_id for s in first.list_shards(PROJECT, name)] == list(range(SHARDS))
        for shard_id in range(SHARDS):
            for i in range(3):
                group = make_log_group([(1, {"shard": str(shard_id), "i": str(i)})])
                retried(lambda g=group, s=shard_id: first.put_log_group(PROJECT, name, g,
                                                                        shard_id=s))  # fmt: skip


def test_groups_spread_over_the_nodes_and_any_node_reaches_the_holder(
    cluster: LogHubCluster,
) -> None:
    logstore_with_data(cluster, "spread")
    nodes = live(cluster)
    groups = [f"g{i}" for i in range(9)]
    for index, group in enumerate(groups):
        with client(nodes[index % 3]) as via:
            via.create_consumer_group(PROJECT, "spread", group, TIMEOUT_S)
            via.heartbeat(PROJECT, "spread", group, "c", [])
    holders = {group: holder(cluster, "spread", group) for group in groups}
    slots = [NodeSlot(f"n{i}") for i in range(3)]
    assert holders == {g: group_coordinator(f"{PROJECT}/spread/{g}", slots) for g in groups}
    assert len(set(holders.values())) == 3, f"groups spread over every node: {holders}"

    # one group, its consumers' heartbeats sent through three different nodes: one state
    first, second, third = (client(n) for n in nodes)
    try:
        first.create_consumer_group(PROJECT, "spread", "shared", TIMEOUT_S)
        held = {"a": [], "b": []}  # type: dict[str, list[int]]
        for _round in range(10):
            held["a"] = first.heartbeat(PROJECT, "spread", "shared", "a", held["a"])
            held["b"] = second.heartbeat(PROJECT, "spread", "shared", "b", held["b"])
        assert sorted(held["a"] + held["b"]) == list(range(SHARDS))
        assert len(held["a"]) == len(held["b"]) == SHARDS // 2
        description = third.describe_consumer_group(PROJECT, "spread", "shared")
        assert description["consumers"] == ["a", "b"]
        owners = {s["shard"]: s["owner"] for s in description["shards"]}
        assert owners == {s: n for n in held for s in held[n]}
        assert saved(cluster, "spread", "shared").owners == owners
    finally:
        for c in (first, second, third):
            c.close()


def test_a_paused_holder_is_replaced_and_changes_nothing_when_it_wakes(
    cluster: LogHubCluster,
) -> None:
    logstore_with_data(cluster, "pause")
    with client(cluster.nodes[0]) as first:
        first.create_consumer_group(PROJECT, "pause", "gp", TIMEOUT_S)
        first.heartbeat(PROJECT, "pause", "gp", "a", [])
    paused_id = holder(cluster, "pause", "gp") or ""
    paused = node_of(cluster, paused_id)
    via = client(next(n for n in live(cluster) if n is not paused))
    direct = LogHubClient(paused.endpoint, timeout_s=10)
    try:
        held = settle(via, "pause", "gp", ["a", "b"])
        before = saved(cluster, "pause", "gp")
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            time.sleep(NODE_TTL_S + 0.5)
            reply, _ = retried(lambda: via.heartbeat(PROJECT, "pause", "gp", "a", held["a"]))
            assert set(reply) >= set(held["a"])
            new_holder = holder(cluster, "pause", "gp")
            assert new_holder not in (None, paused_id)
            restored = saved(cluster, "pause", "gp")
            # the paused node's own shards were succeeded meanwhile: their children are new
            assert {s: restored.owners[s] for s in range(SHARDS)} == before.owners
            # b leaves through the new holder, which saves the change under its own epoch
            via.heartbeat(PROJECT, "pause", "gp", "b", held["b"])
            via.heartbeat(PROJECT, "pause", "gp", "b", [])
            taken_over = saved(cluster, "pause", "gp")
            assert taken_over.coordinator == new_holder and taken_over.epoch > before.epoch
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        # the old holder, awake, is asked at once for a change (a letting go of everything):
        # it either refuses (it knows its lease ended) or passes the request on to the new
        # holder; it never saves an assignment of its own
        with contextlib.suppress(ServerBusy):
            direct.heartbeat(PROJECT, "pause", "gp", "a", [])
        now = saved(cluster, "pause", "gp")
        assert (now.epoch, now.coordinator) == (taken_over.epoch, taken_over.coordinator)
    finally:
        direct.close()
        via.close()


def test_a_drained_holder_hands_its_group_over_and_the_consumers_keep_their_shards(
    cluster: LogHubCluster,
) -> None:
    logstore_with_data(cluster, "drain")
    with client(cluster.nodes[0]) as first:
        first.create_consumer_group(PROJECT, "drain", "gd", TIMEOUT_S)
        first.heartbeat(PROJECT, "drain", "gd", "a", [])
    drained_id = holder(cluster, "drain", "gd") or ""
    drained = node_of(cluster, drained_id)
    via = client(next(n for n in live(cluster) if n is not drained))
    try:
        held = settle(via, "drain", "gd", ["a", "b"])
        asyncio.run(set_drain(cluster.etcd.url, drained_id, True))
        deadline = time.monotonic() + 10
        while holder(cluster, "drain", "gd") == drained_id:
            assert time.monotonic() < deadline, "the drained node kept the group"
            time.sleep(0.05)
        reply, _ = retried(lambda: via.heartbeat(PROJECT, "drain", "gd", "a", held["a"]))
        assert set(reply) >= set(held["a"])
        new_holder = holder(cluster, "drain", "gd")
        assert new_holder not in (None, drained_id)
        assert saved(cluster, "drain", "gd").coordinator == new_holder
    finally:
        via.close()
        asyncio.run(set_drain(cluster.etcd.url, drained_id, False))


def test_a_killed_holder_is_replaced_and_the_consumers_keep_their_shards(
    cluster: LogHubCluster,
) -> None:
    logstore_with_data(cluster, "kill")
    with client(cluster.nodes[0]) as first:
        first.create_consumer_group(PROJECT, "kill", "gk", TIMEOUT_S)
        first.heartbeat(PROJECT, "kill", "gk", "a", [])
    victim = node_of(cluster, holder(cluster, "kill", "gk") or "")
    via = client(next(n for n in live(cluster) if n is not victim))
    try:
        held = settle(via, "kill", "gk", ["a", "b"])
        for name, shards in held.items():
            for shard_id in shards:
                via.update_checkpoint(PROJECT, "kill", "gk", shard_id, encode_cursor(2),
                                      consumer=name, force=False)  # fmt: skip
        before = saved(cluster, "kill", "gk")
        victim.kill()  # SIGKILL
        # after the TTL another node holds the group, with the assignment it restored
        reply, took_s = retried(lambda: via.heartbeat(PROJECT, "kill", "gk", "a", held["a"]))
        assert took_s < NODE_TTL_S + 5
        assert set(reply) >= set(held["a"]), "a keeps its shards"
        assert set(via.heartbeat(PROJECT, "kill", "gk", "b", held["b"])) >= set(held["b"])
        new_holder = holder(cluster, "kill", "gk")
        assert new_holder is not None and node_of(cluster, new_holder) is not victim
        after = saved(cluster, "kill", "gk")
        # rewritten by the new holder only if it changed something (the victim's shards
        # succeeded by children that the consumers took)
        assert after.coordinator == new_holder or after == before
        described = via.describe_consumer_group(PROJECT, "kill", "gk")["shards"]
        owners = {s["shard"]: s["owner"] for s in described}
        assert {s: owners[s] for s in range(SHARDS)} == dict(before.owners)
        # checkpoints did not go back, and the holders may still move them (not forced)
        assert {s: via.get_checkpoints(PROJECT, "kill", "gk")[s] for s in range(SHARDS)} == {
            s: encode_cursor(2) for s in range(SHARDS)
        }
        for name, shards in held.items():
            for shard_id in shards:
                via.update_checkpoint(PROJECT, "kill", "gk", shard_id, encode_cursor(3),
                                      consumer=name, force=False)  # fmt: skip
        assert via.get_checkpoints(PROJECT, "kill", "gk")[held["a"][0]] == encode_cursor(3)
    finally:
        via.close()  # the victim stays dead: this is the module's last test


@pytest.mark.slow
def test_group_takeover_times_over_ten_holder_kills(tmp_path: Path) -> None:
    """Per trial: a group of two consumers settles, its holder is SIGKILLed, and the time
    until a heartbeat through another node is answered with the consumer's shards kept."""
    times = []
    with running_cluster(tmp_path, 3) as trial_cluster:
        with client(trial_cluster.nodes[0]) as first:
            first.create_project(PROJECT)
        logstore_with_data(trial_cluster, "trials")
        for trial in range(10):
            group = f"t{trial}"
            with client(live(trial_cluster)[0]) as first:
                first.create_consumer_group(PROJECT, "trials", group, TIMEOUT_S)
                first.heartbeat(PROJECT, "trials", group, "a", [])
            victim = node_of(trial_cluster, holder(trial_cluster, "trials", group) or "")
            with client(next(n for n in live(trial_cluster) if n is not victim)) as via:
                held = settle(via, "trials", group, ["a", "b"])
                victim.kill()
                reply, took_s = retried(
                    lambda via=via, group=group, held=held: via.heartbeat(
                        PROJECT, "trials", group, "a", held["a"]
                    )
                )
                assert set(reply) >= set(held["a"])
                times.append(took_s)
            trial_cluster.start_node(trial_cluster.nodes.index(victim))
            trial_cluster.wait_placed()
    times.sort()
    p50_s = statistics.median(times)
    print(f"group takeover after a holder SIGKILL (TTL {NODE_TTL_S} s): "
          f"p50 {p50_s:.2f} s, max {times[-1]:.2f} s over {len(times)}")  # fmt: skip
    assert times[-1] < NODE_TTL_S + 5
