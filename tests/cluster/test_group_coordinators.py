"""Group coordinators on a real 3-member etcd: one holder per group key under its node's
lease, a saved assignment that a new coordinator loads, and a deposed coordinator whose
assignment writes etcd refuses, however alive it believes itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from etcd import EtcdCluster, running_etcd

from loghub.cluster.etcd_store import EtcdStore
from loghub.cluster.group_coordinators import (
    GroupAssignment,
    GroupCoordinators,
    GroupKey,
    assignment_key,
    coordinator_key,
)
from loghub.cluster.membership import NodeInfo, NodeMembership
from loghub.errors import FencedError

GROUP: GroupKey = ("p", "logs", "g")


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    with running_etcd(3) as cluster:
        yield cluster


async def node(store: EtcdStore, name: str, frozen_clock: bool = False) -> NodeMembership:
    """A node's membership; with ``frozen_clock`` the node never sees time pass, as a
    process paused (SIGSTOP) between two instructions: it still believes its lease alive."""
    clock = (lambda: 0.0) if frozen_clock else time.monotonic
    membership = NodeMembership(store, NodeInfo(name, f"127.0.0.1:{9100 + int(name[1:])}"),
                                ttl_s=1, monotonic=clock)  # fmt: skip
    await membership.start()
    return membership


def test_a_deposed_coordinator_cannot_save_and_its_successor_restores_the_assignment(
    etcd: EtcdCluster,
) -> None:
    async def scenario() -> None:
        async with EtcdStore(etcd.url) as store:
            for key in (coordinator_key(GROUP), assignment_key(GROUP)):
                await store.delete(key)
            first_node = await node(store, "n1", frozen_clock=True)
            second_node = await node(store, "n2")
            lost: list[GroupKey] = []
            first = GroupCoordinators(store, lambda: first_node)
            second = GroupCoordinators(store, lambda: second_node, on_lost=lost.append)
            assert await first.take(GROUP) is not None
            assert await second.take(GROUP) is None, "one holder per group"
            assert second.holders[GROUP] == "n1"
            assert await first.load_assignment(GROUP) == GroupAssignment()
            assert await first.save_assignment(GROUP, {0: "a", 1: "b"}) == 1
            assert await first.save_assignment(GROUP, {0: "a", 1: "a"}) == 2

            assert first_node._task is not None
            first_node._task.cancel()  # n1 stops refreshing its lease: it is paused
            deadline = time.monotonic() + 10
            while await second.take(GROUP) is None:
                assert time.monotonic() < deadline, "the group was never taken over"
                await asyncio.sleep(0.05)
            assert first.fence(GROUP) is not None, "n1's clock says it still holds the group"

            restored = await second.load_assignment(GROUP)
            assert (restored.owners, restored.generation, restored.coordinator) == (
                {0: "a", 1: "a"}, 2, "n1"
            )  # fmt: skip
            with pytest.raises(FencedError):  # etcd refuses the write, not n1's own clock
                await first.save_assignment(GROUP, {0: "b", 1: "b"})
            assert await second.save_assignment(GROUP, {0: "a", 1: "c"}) == 3
            entry = await store.get(assignment_key(GROUP))
            assert entry is not None
            saved = GroupAssignment.decode(entry.value, entry.mod_revision)
            assert (saved.owners, saved.generation, saved.coordinator) == (
                {0: "a", 1: "c"}, 3, "n2"
            )  # fmt: skip

            await second.release(GROUP)
            assert await store.get(coordinator_key(GROUP)) is None
            assert lost == [GROUP], "the node that gave the group up is told"
            await second_node.stop()

    asyncio.run(scenario())


def test_a_coordinator_whose_lease_ends_loses_its_groups_with_it(etcd: EtcdCluster) -> None:
    async def scenario() -> None:
        async with EtcdStore(etcd.url) as store:
            await store.delete(coordinator_key(GROUP))
            membership = await node(store, "n3")
            lost: list[GroupKey] = []
            coordinators = GroupCoordinators(store, lambda: membership, on_lost=lost.append)
            await coordinators.start()
            try:
                assert await coordinators.take(GROUP) is not None
                await membership.stop()  # revokes the lease: etcd deletes the key
                deadline = time.monotonic() + 5
                while not lost:
                    assert time.monotonic() < deadline, "the loss was never noticed"
                    await asyncio.sleep(0.02)
                assert lost == [GROUP] and coordinators.fence(GROUP) is None
                assert await store.get(coordinator_key(GROUP)) is None
            finally:
                await coordinators.stop()

    asyncio.run(scenario())
