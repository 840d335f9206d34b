"""The control plane against a real 3-member etcd cluster on loopback ports.

Compare-and-swap and fencing, node leases that end when a node stops refreshing them,
controller election, a paused controller whose writes are refused once another took over,
and calls that keep working through any one member's death, the raft leader's included.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd import EtcdCluster, running_etcd

from loghub.cluster.etcd_store import EtcdStore, Fence, parse_endpoints
from loghub.cluster.membership import (
    CONTROLLER_KEY,
    ControllerRole,
    NodeInfo,
    NodeMembership,
    kafka_broker_id,
    read_nodes,
)
from loghub.errors import ControlPlaneError, CoordinationError, FencedError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    with running_etcd(3) as cluster:
        yield cluster


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_endpoints_parse_and_refuse_nonsense() -> None:
    assert parse_endpoints("etcd://h1:2379,h2:2380,h3") == [
        ("h1", 2379), ("h2", 2380), ("h3", 2379)
    ]  # fmt: skip
    for bad in ("etcd://", "etcd://h1:x", "etcd://h1/path"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)


def test_compare_and_swap_applies_once_and_reports_a_stale_revision(etcd: EtcdCluster) -> None:
    async def scenario() -> None:
        async with EtcdStore(etcd.url) as store:
            assert await store.compare_and_swap("/t/cas", b"a", 0)
            first = await store.get("/t/cas")
            assert first is not None and first.value == b"a"
            assert not await store.compare_and_swap("/t/cas", b"b", 0)  # exists already
            assert await store.compare_and_swap("/t/cas", b"b", first.mod_revision)
            assert not await store.compare_and_swap("/t/cas", b"c", first.mod_revision)
            final = await store.get("/t/cas")
            assert final is not None and final.value == b"b"
            # the revision a swap reports is the one the key then has
            revision = await store.swap_revision("/t/cas", b"d", final.mod_revision)
            after = await store.get("/t/cas")
            assert after is not None and after.value == b"d" and revision == after.mod_revision
            assert await store.swap_revision("/t/cas", b"e", final.mod_revision) is None

    run(scenario())


def test_a_write_with_a_fence_that_no_longer_holds_is_refused(etcd: EtcdCluster) -> None:
    async def scenario() -> None:
        async with EtcdStore(etcd.url) as store:
            taken = await store.create("/t/role", b"one")
            assert taken is not None
            old = Fence("/t/role", taken.create_revision)
            assert await store.compare_and_swap("/t/fenced", b"1", 0, fence=old)
            await store.delete("/t/role")
            retaken = await store.create("/t/role", b"two")
            assert retaken is not None and retaken.create_revision > old.create_revision
            current = await store.get("/t/fenced")
            assert current is not None
            with pytest.raises(FencedError):
                await store.compare_and_swap("/t/fenced", b"2", current.mod_revision, fence=old)
            unchanged = await store.get("/t/fenced")
            assert unchanged is not None and unchanged.value == b"1"
            new = Fence("/t/role", retaken.create_revision)
            assert await store.compare_and_swap("/t/fenced", b"3", current.mod_revision, fence=new)

    run(scenario())


def test_a_node_key_lives_while_refreshed_and_goes_a_ttl_after_refreshes_stop(
    etcd: EtcdCluster,
) -> None:
    async def scenario() -> None:
        async with EtcdStore(etcd.url) as store:
            node = NodeMembership(store, NodeInfo("n-ttl", "127.0.0.1:1", rack="r1"), ttl_s=1)
            await node.start()
            await asyncio.sleep(2.5)  # refreshed every 1/3 s: still there after 2.5 TTLs
            nodes = await read_nodes(store)
            assert nodes["n-ttl"].rack == "r1" and node.alive
            # a second node with the same id is refused while the first lives
            twin = NodeMembership(store, NodeInfo("n-ttl", "127.0.0.1:2"), ttl_s=1)
            with pytest.raises(CoordinationError, match="in use"):
                await twin.start()
            assert node._task is not None
            node._task.cancel()  # the node stops refreshing, as a dead or paused one would
            stopped = time.monotonic()
            while "n-ttl" in await read_nodes(store):
                await asyncio.sleep(0.05)
                assert time.monotonic() - stopped < 5
            gone_after = time.monotonic() - stopped
            assert gone_after >= 0.5
            assert not node.alive  # it knows it too, on its own clock

    run(scenario())


def test_a_node_started_again_while_its_old_lease_lives_joins_once_that_lease_ends(
    etcd: EtcdCluster,
) -> None:
    """A supervisor restarts a killed node at once: its id is still registered under the
    dead process's lease for up to a TTL. The new process waits for that lease to end and
    joins, rather than exit (a live twin, above, is still refused)."""

    async def scenario() -> None:
        async with EtcdStore(etcd.url) as store:
            dead = NodeMembership(store, NodeInfo("n-again", "127.0.0.1:1"), ttl_s=2)
            await dead.start()
            assert dead._task is not None
            dead._task.cancel()  # stops refreshing without leaving, as a SIGKILL does
            died = time.monotonic()
            again = NodeMembership(store, NodeInfo("n-again", "127.0.0.1:1"), ttl_s=2)
            await again.start()
            joined_after_s = time.monotonic() - died
            assert again.alive and again.lease != dead.lease
            entry = await store.get(again.key)
            assert entry is not None and again.lease is not None
            assert entry.lease == again.lease.lease_id
            assert 0.5 < joined_after_s < 2 + 1.5, joined_after_s  # the TTL, and a poll
            await again.stop()

    run(scenario())


def test_a_planned_leave_removes_the_node_at_once(etcd: EtcdCluster) -> None:
    async def scenario() -> None:
        async with EtcdStore(etcd.url) as store:
            node = NodeMembership(store, NodeInfo("n-leave", "127.0.0.1:1"), ttl_s=5)
            await node.start()
            assert "n-leave" in await read_nodes(store)
            await node.stop()
            assert "n-leave" not in await read_nodes(store)

    run(scenario())


def _readline(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no output from the controller process in {timeout_s} s"
    return proc.stdout.readline().strip()


def _controller(etcd: EtcdCluster, node_id: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}"}
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "controller_process.py"), etcd.url,
         node_id, "1"],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def test_a_paused_controller_is_replaced_and_its_writes_are_refused(etcd: EtcdCluster) -> None:
    old = _controller(etcd, "c-old")
    new: subprocess.Popen[str] | None = None
    try:
        first = _readline(old, 20)
        assert first.startswith("controller "), first
        assert _readline(old, 10).startswith("wrote")
        os.kill(old.pid, signal.SIGSTOP)
        paused = time.monotonic()
        new = _controller(etcd, "c-new")
        line = _readline(new, 20)
        took_over_s = time.monotonic() - paused
        assert line.startswith("controller "), line
        assert int(line.split()[1]) > int(first.split()[1])  # a later epoch
        assert _readline(new, 10).startswith("wrote")
        os.kill(old.pid, signal.SIGCONT)
        # the old controller wakes believing it still leads; etcd refuses its next write
        outcomes = []
        while not outcomes or outcomes[-1] not in ("fenced",):
            outcomes.append(_readline(old, 10))
            assert len(outcomes) < 50, outcomes
        assert not any(o.startswith("wrote") for o in outcomes), outcomes
        assert old.wait(timeout=10) == 0
        assert took_over_s < 6, took_over_s
    finally:
        for proc in (old, new):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            if proc is not None and proc.stdout is not None:
                proc.stdout.close()


def test_controller_election_picks_one_and_the_next_after_it_leaves(etcd: EtcdCluster) -> None:
    async def scenario() -> None:
        async with EtcdStore(etcd.url) as store:
            a = NodeMembership(store, NodeInfo("e-a", "127.0.0.1:1"), ttl_s=2)
            b = NodeMembership(store, NodeInfo("e-b", "127.0.0.1:2"), ttl_s=2)
            await a.start()
            await b.start()
            role_a, role_b = ControllerRole(a, poll_s=0.05), ControllerRole(b, poll_s=0.05)
            fence_a = await role_a.campaign()
            waiting = asyncio.create_task(role_b.campaign())
            await asyncio.sleep(0.3)
            assert not waiting.done()  # one controller at a time
            current = await store.get(CONTROLLER_KEY)
            assert current is not None and current.value == b"e-a"
            await a.stop()  # a planned leave hands the role on at once
            fence_b = await asyncio.wait_for(waiting, 5)
            assert fence_b.create_revision > fence_a.create_revision
            await b.stop()

    run(scenario())


def test_calls_keep_working_when_any_member_dies_the_leader_included(etcd: EtcdCluster) -> None:
    async def scenario(cluster: EtcdCluster) -> list[float]:
        gaps = []
        async with EtcdStore(cluster.url, call_timeout_s=0.5, retry_budget_s=8.0) as store:
            for _trial in range(2):
                leader = cluster.leader()
                await store.put("/t/before", b"x")
                killed = time.monotonic()
                cluster.kill(leader)
                revision = await store.put("/t/after", b"y")  # retried on the live members
                gaps.append(time.monotonic() - killed)
                assert revision > 0
                assert (await store.get("/t/after")) is not None
                cluster.start(leader, "existing")  # from this thread: see _die_with_parent
                await asyncio.to_thread(cluster.wait_healthy)
        return gaps

    gaps = run(scenario(etcd))
    assert isinstance(gaps, list)
    print(f"write after killing the etcd leader: {[round(g, 2) for g in gaps]} s")
    assert max(gaps) < 8


def test_no_member_reachable_is_a_control_plane_error() -> None:
    async def scenario() -> None:
        async with EtcdStore("etcd://127.0.0.1:1", call_timeout_s=0.2, retry_budget_s=0.5) as store:
            with pytest.raises(ControlPlaneError):
                await store.get("/t/x")

    run(scenario())


def test_a_malformed_kafka_advertise_is_refused_before_anything_listens(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "loghub", "serve", "--data-dir", str(tmp_path), "--port", "1",
         "--kafka-port", "2", "--kafka-advertise", "no-port", "--cluster",
         "etcd://127.0.0.1:1", "--node-id", "n1"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )  # fmt: skip
    assert result.returncode == 1
    assert "--kafka-advertise must be host:port" in result.stdout + result.stderr


def test_node_records_carry_the_kafka_address_and_old_ones_still_decode() -> None:
    info = NodeInfo("n1", "127.0.0.1:8080", "r1", kafka="127.0.0.1:9092")
    assert NodeInfo.decode("n1", info.encode()) == info
    old = b'{"advertise": "127.0.0.1:8080", "rack": "r1", "draining": false}'
    assert NodeInfo.decode("n1", old) == NodeInfo("n1", "127.0.0.1:8080", "r1")
    # a decimal node id is its own broker id; any other id hashes into int32's positive half
    assert (kafka_broker_id("7"), kafka_broker_id(str(2**31 - 1))) == (7, 2**31 - 1)
    for node_id in ("n0", "n1", "node-a", str(2**31), "é"):
        assert 0 <= kafka_broker_id(node_id) < 2**31
        assert kafka_broker_id(node_id) == kafka_broker_id(node_id)
    assert len({kafka_broker_id(f"n{i}") for i in range(100)}) == 100


def test_a_node_whose_kafka_broker_id_a_live_node_has_is_refused(etcd: EtcdCluster) -> None:
    """Node ids whose broker ids collide: the second node with a Kafka listener may not
    start while the first lives, and leaves no record behind; without a listener it may."""
    clash = str(kafka_broker_id("k-hashed"))

    async def scenario() -> None:
        async with EtcdStore(etcd.url) as store:
            first = NodeMembership(store, NodeInfo("k-hashed", "127.0.0.1:1", kafka="h:1"))
            await first.start()
            second = NodeMembership(store, NodeInfo(clash, "127.0.0.1:2", kafka="h:2"))
            with pytest.raises(CoordinationError, match="same Kafka broker id"):
                await second.start()
            assert clash not in await read_nodes(store)
            plain = NodeMembership(store, NodeInfo(clash, "127.0.0.1:2"))
            await plain.start()
            await plain.stop()
            await first.stop()

    run(scenario())
