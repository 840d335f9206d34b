"""The metadata store on etcd, as two nodes of a cluster use it: two stores on one real
3-member etcd cluster, changing the same records at the same time.

What is proved: a change made through one store is in that store's cache when the call
returns and in the other's within a short bound; concurrent changes of one record are
serialised by compare-and-swap (one create wins, one split wins, and an update racing a
split loses neither); a checkpoint is refused once the group is gone or its writer's fence
no longer holds; and a store whose watch broke (its member restarted) catches up.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import aetcd.exceptions  # type: ignore[import-untyped]
import pytest
from etcd import EtcdCluster, running_etcd

from loghub.cluster.etcd_metadata import EtcdMetadataStore
from loghub.cluster.etcd_store import Compare, Delete, EtcdStore, Fence, Put, read_page_keys
from loghub.cluster.group_coordinators import ASSIGNMENTS_PREFIX, assignment_key
from loghub.errors import (
    ConsumerGroupNotExist,
    ControlPlaneError,
    FencedError,
    LogHubError,
    LogStoreAlreadyExist,
    ShardReadOnly,
)
from loghub.metadata import Checkpoint, ConsumerGroupDef, LogstoreSpec
from loghub.testing import FakeClock

# Generous for a shared 2-core machine; measured at a few milliseconds on loopback.
SEEN_WITHIN_S = 2.0


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    with running_etcd(3) as cluster:
        yield cluster


@pytest.fixture
def nodes(etcd: EtcdCluster) -> Iterator[tuple[EtcdMetadataStore, EtcdMetadataStore]]:
    """Two stores on one prefix: what two LogHub nodes of one cluster hold."""
    prefix = f"/loghub-test/{uuid.uuid4().hex[:12]}/meta/"
    a = EtcdMetadataStore.open(etcd.url, FakeClock(), prefix)
    b = EtcdMetadataStore.open(etcd.url, FakeClock(), prefix)
    yield a, b
    a.close()
    b.close()


class RecordingSealer:
    def __init__(self) -> None:
        self.sealed: dict[int, int] = {}

    def seal(self, shard_id: int) -> int:
        self.sealed[shard_id] = 100 + shard_id
        return self.sealed[shard_id]

    def unseal(self, shard_id: int) -> None:
        del self.sealed[shard_id]


def seen_within(check: Callable[[], object], bound_s: float = SEEN_WITHIN_S) -> float:
    """Seconds until ``check`` stops raising (LogHubError or AssertionError); fails after
    ``bound_s``."""
    start = time.monotonic()
    while True:
        try:
            check()
            return time.monotonic() - start
        except (LogHubError, AssertionError):
            if time.monotonic() - start > bound_s:
                raise
            time.sleep(0.002)


def race(*calls: Callable[[], Any]) -> list[Any]:
    """Runs the calls at once, one thread each; their results or LogHubErrors, in order."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = calls[index]()
        except LogHubError as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return outcomes


def test_a_change_is_read_at_once_by_its_writer_and_soon_by_another_node(
    nodes: tuple[EtcdMetadataStore, EtcdMetadataStore],
) -> None:
    a, b = nodes
    a.create_project("proj")
    logstore = a.create_logstore("proj", LogstoreSpec("events", shard_count=2))
    assert a.get_logstore("proj", "events") == logstore  # no waiting: read-your-writes
    delay_s = seen_within(lambda: b.get_logstore("proj", "events"))
    assert b.get_logstore("proj", "events") == logstore
    assert b.list_shards("proj", "events") == a.list_shards("proj", "events")

    _, left, right = b.split_shard("proj", "events", 0, 2**126, RecordingSealer())
    assert b.shard_for_key("proj", "events", 2**125) == left
    a.wait_for_writes()  # then the split made on the other node is in a's cache: no polling
    assert a.shard_for_key("proj", "events", 2**125) == left
    assert a.list_shards("proj", "events") == b.list_shards("proj", "events")

    a.delete_project("proj")
    seen_within(lambda: b.list_projects() == ([], 0) or _fail())
    b.create_project("proj")  # the name is free again on the other node
    print(f"a new logstore was seen by the other node after {delay_s * 1e6:.0f} µs")


def test_a_record_made_elsewhere_is_found_before_this_nodes_watch_delivers_it(
    nodes: tuple[EtcdMetadataStore, EtcdMetadataStore],
) -> None:
    """A miss is answered only from a cache as new as etcd: node b, whose watch runs late,
    still finds the project, logstore, shard and group node a has just made (a group made
    through one node, then a heartbeat forwarded to its coordinator on another)."""
    a, b = nodes
    real_apply = b._apply
    loop = b._loop

    def late_apply(kind: str, entry: Any) -> None:  # every event reaches b 0.5 s late
        loop.call_later(0.5, real_apply, kind, entry)

    b._apply = late_apply  # type: ignore[method-assign]
    a.create_project("late")
    a.create_logstore("late", LogstoreSpec("events", shard_count=1))
    _, left, right = a.split_shard("late", "events", 0, 2**127, RecordingSealer())
    a.consumer_groups("late", "events").create("late", "events", ConsumerGroupDef("g1", 30, True))
    assert b.get_project("late").name == "late"
    assert b.get_shard("late", "events", right.shard_id) == right
    assert b.consumer_groups("late", "events").get("late", "events", "g1").ordered
    with pytest.raises(ConsumerGroupNotExist):  # a true miss is still one
        b.consumer_groups("late", "events").get("late", "events", "nobody")
    other = a.create_logstore("late", LogstoreSpec("other", shard_count=1))
    assert b.shard_for_key("late", "other", 0).shard_id == 0  # a PutLogs with a hash key
    assert b.get_logstore("late", "other") == other


def test_deleted_logstores_are_remembered_for_every_node(
    nodes: tuple[EtcdMetadataStore, EtcdMetadataStore],
) -> None:
    """The storage keys of deleted logstores stay known to every node (also one opened
    later), so each can remove its own data; a logstore made again is not among them."""
    a, b = nodes
    a.create_project("gone")
    first = a.create_logstore("gone", LogstoreSpec("one", shard_count=1))
    second = a.create_logstore("gone", LogstoreSpec("two", shard_count=1))
    a.delete_logstore("gone", "one")
    again = a.create_logstore("gone", LogstoreSpec("one", shard_count=1))
    assert first.storage_key in a.deleted_storage_keys()  # read-your-writes
    a.delete_project("gone")
    keys = {first.storage_key, second.storage_key, again.storage_key}
    seen_within(lambda: keys <= b.deleted_storage_keys() or _fail())
    assert again.storage_key != first.storage_key


def test_concurrent_creates_of_one_logstore_on_two_nodes_make_exactly_one(
    nodes: tuple[EtcdMetadataStore, EtcdMetadataStore],
) -> None:
    a, b = nodes
    a.create_project("proj")
    seen_within(lambda: b.get_project("proj"))
    for round_ in range(8):
        _race_creates(a, b, f"events-{round_}")


def _race_creates(a: EtcdMetadataStore, b: EtcdMetadataStore, name: str) -> None:
    outcomes = race(
        lambda: a.create_logstore("proj", LogstoreSpec(name, shard_count=2)),
        lambda: b.create_logstore("proj", LogstoreSpec(name, shard_count=3)),
    )
    winners = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(winners) == 1, outcomes
    assert sum(isinstance(o, LogStoreAlreadyExist) for o in outcomes) == 1, outcomes
    (winner,) = winners
    for node in (a, b):
        seen_within(lambda node=node: node.get_logstore("proj", name) == winner or _fail())
        assert len(node.list_shards("proj", name)) == winner.shard_count


def test_concurrent_splits_of_one_shard_on_two_nodes_make_exactly_one(
    nodes: tuple[EtcdMetadataStore, EtcdMetadataStore],
) -> None:
    a, b = nodes
    a.create_project("proj")
    for round_ in range(5):
        _race_splits(a, b, f"events-{round_}")


def _race_splits(a: EtcdMetadataStore, b: EtcdMetadataStore, name: str) -> None:
    a.create_logstore("proj", LogstoreSpec(name, shard_count=1))
    seen_within(lambda: b.get_logstore("proj", name))
    sealers = (RecordingSealer(), RecordingSealer())
    outcomes = race(
        lambda: a.split_shard("proj", name, 0, 2**126, sealers[0]),
        lambda: b.split_shard("proj", name, 0, 2**127, sealers[1]),
    )
    winners = [i for i, o in enumerate(outcomes) if not isinstance(o, Exception)]
    assert len(winners) == 1, outcomes
    (loser,) = {0, 1} - set(winners)
    assert isinstance(outcomes[loser], ShardReadOnly), outcomes
    assert sealers[loser].sealed == {}, "the refused split undid its seal"
    assert sealers[winners[0]].sealed == {0: 100}
    for node in (a, b):
        seen_within(lambda node=node: len(node.list_shards("proj", name)) == 3 or _fail())
        assert node.list_shards("proj", name)[0].children == (1, 2)


def test_an_update_racing_splits_on_another_node_loses_neither(
    nodes: tuple[EtcdMetadataStore, EtcdMetadataStore],
) -> None:
    a, b = nodes
    a.create_project("proj")
    a.create_logstore("proj", LogstoreSpec("events", shard_count=1))
    seen_within(lambda: b.get_logstore("proj", "events"))
    splits = 6

    def updates() -> None:
        for ttl_days in range(1, 13):
            a.update_logstore("proj", "events", {"ttl_days": ttl_days})

    def split_rightmost() -> None:
        sealer = RecordingSealer()
        for _ in range(splits):
            right = b.list_shards("proj", "events")[-1]
            middle = (right.begin_key + right.end_key) // 2
            b.split_shard("proj", "events", right.shard_id, middle, sealer)

    outcomes = race(updates, split_rightmost)
    assert outcomes == [None, None]
    for node in (a, b):
        seen_within(lambda node=node: node.get_logstore("proj", "events").ttl_days == 12 or _fail())
        seen_within(lambda node=node: len(node.list_shards("proj", "events")) == 1 + 2 * splits
                    or _fail())  # fmt: skip
        assert node.get_logstore("proj", "events").shard_count == 1 + splits


def test_a_checkpoint_is_refused_when_its_group_is_gone_or_its_fence_moved(
    etcd: EtcdCluster, nodes: tuple[EtcdMetadataStore, EtcdMetadataStore]
) -> None:
    a, b = nodes
    a.create_project("proj")
    a.create_logstore("proj", LogstoreSpec("events", shard_count=2))
    groups_a = a.consumer_groups("proj", "events")
    groups_a.create("proj", "events", ConsumerGroupDef("cg1", 60, False))
    fence_key = f"/loghub-test/{uuid.uuid4().hex[:12]}/coordinator"
    coordinator = _run(etcd, lambda store: store.create(fence_key, b"a"))
    fence = Fence(fence_key, coordinator.create_revision)
    groups_a.save_checkpoint("proj", "events", "cg1", Checkpoint(0, "MTA=", "c1", 1), fence)
    seen_within(lambda: b.consumer_groups("proj", "events").checkpoints("proj", "events", "cg1")
                == {0: Checkpoint(0, "MTA=", "c1", 1)} or _fail())  # fmt: skip

    _run(etcd, lambda store: store.delete(fence_key))  # another node takes the role
    _run(etcd, lambda store: store.create(fence_key, b"b"))
    with pytest.raises(FencedError):
        groups_a.save_checkpoint("proj", "events", "cg1", Checkpoint(0, "MjA=", "c1", 2), fence)
    assert groups_a.checkpoints("proj", "events", "cg1")[0].cursor == "MTA="

    b.consumer_groups("proj", "events").delete("proj", "events", "cg1")
    with pytest.raises(ConsumerGroupNotExist):  # not written into a group made again later
        groups_a.save_checkpoint("proj", "events", "cg1", Checkpoint(1, "MTA=", "c1", 3))


def test_deleting_a_logstore_or_project_deletes_its_groups_saved_assignments(
    etcd: EtcdCluster, nodes: tuple[EtcdMetadataStore, EtcdMetadataStore]
) -> None:
    """A group made again under the same name must not restore the holders of the old one."""
    a, _b = nodes
    project = f"gone-{uuid.uuid4().hex[:8]}"
    a.create_project(project)
    for logstore in ("first", "second", "firstborn"):
        a.create_logstore(project, LogstoreSpec(logstore, shard_count=1))
        key = assignment_key((project, logstore, "cg"))
        _run(etcd, lambda store, key=key: store.put(key, b'{"owners": {"0": "c1"}}'))

    def left() -> list[str]:
        entries = _run(etcd, lambda store: store.get_prefix(f"{ASSIGNMENTS_PREFIX}{project}/"))
        return sorted(e.key.removeprefix(ASSIGNMENTS_PREFIX) for e in entries)

    a.delete_logstore(project, "first")
    assert left() == [f"{project}/firstborn/cg", f"{project}/second/cg"]
    a.delete_project(project)
    assert left() == []


def test_a_store_whose_watch_broke_catches_up(
    etcd: EtcdCluster, nodes: tuple[EtcdMetadataStore, EtcdMetadataStore]
) -> None:
    a, b = nodes
    a.create_project("proj")
    for index, member in enumerate(etcd.members):
        etcd.restart(member)  # whichever member a watch was on, it breaks once
        etcd.wait_healthy()
        b.create_logstore("proj", LogstoreSpec(f"events-{index}", shard_count=1))
        seen_within(lambda index=index: a.get_logstore("proj", f"events-{index}"), 10.0)
    assert a.list_logstores("proj") == b.list_logstores("proj")


def test_a_node_started_later_loads_a_catalogue_larger_than_one_read_page(
    etcd: EtcdCluster, nodes: tuple[EtcdMetadataStore, EtcdMetadataStore]
) -> None:
    a, _ = nodes
    names = [f"proj-{i:03d}" for i in range(read_page_keys + 6)]
    for name in names:
        a.create_project(name)
    a.create_logstore(names[-1], LogstoreSpec("events", shard_count=3))
    late = EtcdMetadataStore.open(etcd.url, FakeClock(), a._prefix)
    try:
        assert late.list_projects(size=500) == a.list_projects(size=500)
        assert late.list_shards(names[-1], "events") == a.list_shards(names[-1], "events")
    finally:
        late.close()


def test_a_transaction_whose_reply_was_lost_is_recognised_by_its_values(
    etcd: EtcdCluster,
) -> None:
    key = f"/loghub-test/{uuid.uuid4().hex[:12]}/lost"

    async def scenario() -> tuple[int | None, int | None]:
        async with EtcdStore(etcd.url) as store:
            real = store._client.transaction
            lost = {"replies": 2, "requests": 0}

            async def flaky(*args: Any, **kwargs: Any) -> Any:
                if lost["requests"] > 0:
                    lost["requests"] -= 1
                    raise aetcd.exceptions.ConnectionFailedError("request lost")
                reply = await real(*args, **kwargs)
                if lost["replies"] > 0 and reply[0]:
                    lost["replies"] -= 1
                    raise aetcd.exceptions.ConnectionFailedError("reply lost")
                return reply

            store._client.transaction = flaky
            create = [Compare(key, "create", "==", 0)]
            ours = await store.transact(create, [Put(key, b"ours")])
            assert await store.transact([], [Delete(key)]) is not None  # retried, no condition
            await store.put(key, b"theirs")
            lost["requests"] = 1  # retried, then refused: the key holds another's value
            refused = await store.transact(create, [Put(key, b"ours")])
            return ours, refused

    ours, refused = asyncio.run(scenario())
    assert ours is not None, "applied, reply lost, retry refused: still ours"
    assert refused is None, "the key holds another writer's value: not ours"


def test_opening_on_an_etcd_that_does_not_answer_is_a_control_plane_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: nothing answers there
        start = time.monotonic()
        with pytest.raises(ControlPlaneError):
            EtcdMetadataStore(
                f"etcd://127.0.0.1:{port}",
                FakeClock(),
                call_timeout_s=0.2,
                retry_budget_s=0.5,
                startup_wait_s=1.0,
            )
    assert time.monotonic() - start < 5
    assert "loghub-etcd-metadata" not in {t.name for t in threading.enumerate()}


def test_opening_waits_for_an_etcd_that_answers_late() -> None:
    """A node started while its etcd is down (restarting, electing, slow under load) comes
    up once etcd answers, within the startup wait, instead of exiting at the first call's
    retry budget."""
    with running_etcd(members=1) as etcd:
        member = etcd.members[0]
        etcd.kill(member)
        opened: list[EtcdMetadataStore | BaseException] = []

        def open_store() -> None:
            try:
                opened.append(
                    EtcdMetadataStore(
                        etcd.url,
                        FakeClock(),
                        call_timeout_s=0.3,
                        retry_budget_s=0.6,
                        startup_wait_s=30.0,
                    )  # fmt: skip
                )
            except BaseException as exc:  # noqa: BLE001 (reported below)
                opened.append(exc)

        thread = threading.Thread(target=open_store)
        thread.start()
        time.sleep(2.0)  # past the retry budget of one call: the old code had given up
        assert not opened, opened
        etcd.restart(member)
        thread.join(timeout=40)
        assert opened and isinstance(opened[0], EtcdMetadataStore), opened
        store = opened[0]
        try:
            store.create_project("late")
            assert store.get_project("late").name == "late"
        finally:
            store.close()


def _run(etcd: EtcdCluster, call: Callable[[EtcdStore], Any]) -> Any:
    async def scenario() -> Any:
        async with EtcdStore(etcd.url) as store:
            return await call(store)

    return asyncio.run(scenario())


def _fail() -> None:
    raise AssertionError("not yet")
