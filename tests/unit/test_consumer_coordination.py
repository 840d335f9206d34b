"""Where shards come from: heartbeats (server mode) and leases (lease mode), driven with a
fake clock; then a whole ConsumerWorker over a fake LogHub, to prove its shutdown order."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from test_consumer_shard_consumer import FakeLogHub

from loghub.consumer import Checkpointer, ConsumerConfig, ConsumerProcessor, ConsumerWorker
from loghub.consumer.heartbeat import HeartbeatAssignment
from loghub.consumer.leases import LeaseAssignment
from loghub.errors import LeaseLostError, ServerBusy
from loghub.testing import FakeClock, MemoryLeaseStore
from loghub.wire.cursor import encode_cursor
from loghub.wire.proto import LogGroup


def config(**fields: Any) -> ConsumerConfig:
    settings = {"heartbeat_interval_ms": 1_000, "timeout_ms": 3_000} | fields
    return ConsumerConfig("127.0.0.1:1", "proj", "logs", "grp", "w1", **settings)


def heartbeats(hub: FakeLogHub, clock: FakeClock, **fields: Any) -> HeartbeatAssignment:
    assignment = HeartbeatAssignment(hub, config(**fields), clock, lambda: None)  # type: ignore[arg-type]
    assignment.start(background=False)
    return assignment


# -- server mode -------------------------------------------------------------------------------


def test_the_group_is_created_then_updated_with_the_workers_timeout_and_order() -> None:
    hub, clock = FakeLogHub(), FakeClock()
    heartbeats(hub, clock, timeout_ms=2_500, ordered=True)
    heartbeats(hub, clock, timeout_ms=4_000)
    assert hub.groups_created == [("create", 3, True), ("update", 4, False)]


def test_a_failed_heartbeat_keeps_the_shards_until_the_timeout_counted_from_its_send_time() -> None:
    clock = FakeClock()
    hub = FakeLogHub(clock)
    hub.grants = [0, 1]
    hub.heartbeat_ms = 400  # each heartbeat spends 400 ms on the way
    assignment = heartbeats(hub, clock)  # sent at 0, answered at 400
    assert assignment.assigned() == {0, 1} and assignment.may_consume(0)
    hub.heartbeat_failures = 100
    hub.heartbeat_ms = 0
    while clock.monotonic_ms() < 2_999:
        assert assignment.run_once() == 250, "retried four times per interval"
        assert assignment.assigned() == {0, 1}, "a brief failure gives nothing up"
        clock.advance(min(250, 2_999 - clock.monotonic_ms()))
    assert assignment.may_consume(0)
    clock.advance(1)  # 3 s after the send time of the last good heartbeat (not its reply)
    assert assignment.assigned() == frozenset() and not assignment.may_consume(0)
    assignment.run_once()
    assert assignment.statistics().self_fenced == 1
    hub.heartbeat_failures = 0
    assignment.run_once()
    assert assignment.assigned() == {0, 1} and assignment.may_consume(0)


def test_a_shard_stays_in_the_report_until_the_worker_has_let_go() -> None:
    hub, clock = FakeLogHub(), FakeClock()
    hub.grants = [0, 1]
    assignment = heartbeats(hub, clock)
    assignment.set_held({0, 1})
    hub.grants = [0]  # the server wants 1 back
    assignment.run_once()
    assert assignment.assigned() == {0}
    assignment.run_once()
    assert hub.reports[-1] == [0, 1], "still stopping: still reported"
    assignment.set_held({0})
    assignment.run_once()
    assert hub.reports[-1] == [0]


def test_a_granted_shard_is_reported_before_its_consumer_exists() -> None:
    hub, clock = FakeLogHub(), FakeClock()
    hub.grants = [4]
    assignment = heartbeats(hub, clock)
    assignment.run_once()
    assert hub.reports == [[], [4]]


def test_checkpoints_are_fenced_and_a_refusal_means_the_shard_is_lost() -> None:
    hub, clock = FakeLogHub(), FakeClock()
    assignment = heartbeats(hub, clock)
    assignment.write_checkpoint(2, "MQ==")
    assert hub.checkpoint_calls == [(2, "MQ==", "w1", False)]
    assert assignment.read_checkpoint(2) == "MQ==" and assignment.read_checkpoint(3) == ""
    hub.fenced.add(2)
    with pytest.raises(LeaseLostError):
        assignment.write_checkpoint(2, "Mg==")


def test_a_finished_shard_is_not_started_again_from_a_reply_older_than_its_end() -> None:
    hub, clock = FakeLogHub(), FakeClock()
    hub.grants = [0, 1]
    assignment = heartbeats(hub, clock)
    assignment.mark_finished(0)
    assert assignment.assigned() == {1}
    clock.advance(1)
    hub.grants = [1]  # the server saw the end checkpoint
    assignment.run_once()
    assert assignment.assigned() == {1}
    hub.grants = [0, 1]  # an operator moved the checkpoint back: consumable again
    assignment.run_once()
    assert assignment.assigned() == {0, 1}


def test_read_only_shards_get_their_end_even_from_a_server_that_does_not_list_it() -> None:
    hub, clock = FakeLogHub(), FakeClock()
    hub.add_shard(0, logs=4)
    hub.close_shard(0, report_end=False)  # as the hosted service lists it
    assignment = heartbeats(hub, clock)
    assert assignment.shards()[0].end_cursor == encode_cursor(4)


# -- lease mode --------------------------------------------------------------------------------


def leases(hub: FakeLogHub, clock: FakeClock, store: MemoryLeaseStore, **fields: Any
           ) -> LeaseAssignment:  # fmt: skip
    settings = {"coordination": "lease", "lease_url": "sqlite://", "timeout_ms": 2_000} | fields
    assignment = LeaseAssignment(hub, config(**settings), clock, lambda: None, store)  # type: ignore[arg-type]
    assignment.start(background=False)
    return assignment


def split_hub() -> FakeLogHub:
    """Shard 0 (3 groups) split into 1 and 2."""
    hub = FakeLogHub()
    hub.add_shard(0, logs=3)
    hub.close_shard(0)
    hub.add_shard(1, parents=(0,))
    hub.add_shard(2, parents=(0,))
    return hub


def test_ordered_children_are_taken_only_once_their_parent_is_read_to_its_end() -> None:
    hub, clock = split_hub(), FakeClock()
    store = MemoryLeaseStore(clock)
    assignment = leases(hub, clock, store, ordered=True)
    assert assignment.assigned() == {0}
    assignment.write_checkpoint(0, encode_cursor(3))
    assignment.mark_finished(0)
    assert assignment.assigned() == frozenset()
    assignment.run_once()
    assert store.get_lease(0) is not None and store.get_lease(0).lease_owner == ""  # type: ignore[union-attr]
    clock.advance(4_000)  # the next taker round
    assignment.run_once()
    assert assignment.assigned() == {1, 2}


def test_unordered_children_are_taken_at_once() -> None:
    hub, clock = split_hub(), FakeClock()
    assignment = leases(hub, clock, MemoryLeaseStore(clock), ordered=False)
    assert assignment.assigned() == {0, 1, 2}


def test_a_shard_may_be_consumed_only_within_a_lease_timeout_of_its_last_renew() -> None:
    hub, clock = split_hub(), FakeClock()
    assignment = leases(hub, clock, MemoryLeaseStore(clock))
    assert assignment.may_consume(1)
    clock.advance(1_999)
    assert assignment.may_consume(1)
    clock.advance(1)  # the renewer never ran: somebody may now take the lease
    assert not assignment.may_consume(1)
    assignment.run_once()
    assert assignment.may_consume(1)


def test_a_checkpoint_of_a_shard_now_consumed_elsewhere_is_refused() -> None:
    hub, clock = split_hub(), FakeClock()
    store = MemoryLeaseStore(clock)
    assignment = leases(hub, clock, store)
    record = store.get_lease(1)
    assert record is not None
    store.compare_and_set(1, record.lease_counter, "w2", "w2")
    with pytest.raises(LeaseLostError):
        assignment.write_checkpoint(1, "MQ==")


def test_shutdown_releases_every_lease() -> None:
    hub, clock = split_hub(), FakeClock()
    store = MemoryLeaseStore(clock)
    leases(hub, clock, store).shutdown()
    assert all(record.lease_owner == "" for record in store.list_leases())


# -- the whole worker ----------------------------------------------------------------------------


class Saver(ConsumerProcessor):
    seen: list[int] = []
    lock = threading.Lock()

    def process(self, log_groups: Sequence[LogGroup], checkpointer: Checkpointer) -> None:
        with self.lock:
            self.seen.extend(int(g.Logs[0].Contents[0].Value) for g in log_groups)
        checkpointer.save()


def wait_for(condition: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_worker_writes_every_checkpoint_before_it_stops_heartbeating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub = FakeLogHub()
    for shard_id in range(3):
        hub.add_shard(shard_id, logs=5)
    hub.grants = [0, 1, 2]
    Saver.seen = []
    stop_heartbeating = HeartbeatAssignment.shutdown

    def recorded_shutdown(self: HeartbeatAssignment) -> None:
        hub.events.append("heartbeats stop")
        stop_heartbeating(self)

    monkeypatch.setattr(HeartbeatAssignment, "shutdown", recorded_shutdown)
    settings = {"heartbeat_interval_ms": 100, "timeout_ms": 1_000, "fetch_interval_ms": 10}
    worker = ConsumerWorker(Saver, config(**settings), client=hub)  # type: ignore[arg-type]
    worker.start()
    try:
        wait_for(lambda: len(Saver.seen) == 15)
        hub.grants = [0, 2]  # the server wants shard 1 back
        wait_for(lambda: hub.reports[-1] == [0, 2])
        saved = hub.events.index("checkpoint 1 5")
        assert saved < hub.events.index("heartbeat [0, 2]"), "reported until saved"
        assert worker.statistics().shards == (0, 2)
    finally:
        worker.shutdown()
    assert not worker.is_alive()
    assert hub.checkpoints == {s: encode_cursor(5) for s in range(3)}
    stopped = hub.events.index("heartbeats stop")
    assert {"checkpoint 0 5", "checkpoint 2 5"} <= set(hub.events[:stopped])
    # Only the leave follows: one heartbeat that reports no shard, after every checkpoint.
    assert [e for e in hub.events[stopped:] if e.startswith("heartbeat [")] == ["heartbeat []"]


# -- a server that cannot serve the group yet ----------------------------------------------------


class BusyLogHub(FakeLogHub):
    """Refuses to create the group ``busy`` times with a 503, as a cluster without a
    coordinator does (no node can take the group while etcd is out of reach)."""

    def __init__(self, busy: int, clock: FakeClock | None = None) -> None:
        super().__init__(clock)
        self.busy = busy

    def create_consumer_group(
        self, project: str, logstore: str, group: str, timeout_s: int, ordered: bool = False
    ) -> None:
        if self.busy:
            self.busy -= 1
            raise ServerBusy("no node can coordinate consumer group grp right now; try again")
        super().create_consumer_group(project, logstore, group, timeout_s, ordered)


def test_a_group_that_cannot_be_joined_yet_is_retried_with_backoff_not_given_up() -> None:
    clock = FakeClock()
    hub = BusyLogHub(busy=7, clock=clock)
    hub.grants = [0, 1]
    assignment = heartbeats(hub, clock)  # start does not raise
    assert assignment.assigned() == frozenset() and hub.reports == []
    delays = []
    while not hub.groups_created:
        delays.append(assignment.run_once())
        clock.advance(delays[-1])
    # a quarter interval, doubled each time, capped at join_backoff_max_ms
    assert delays == [500, 1_000, 2_000, 4_000, 5_000, 5_000, 1_000]
    assert hub.groups_created == [("create", 3, False)]
    assert assignment.assigned() == {0, 1}, "the first heartbeat after joining takes shards"
    assert assignment.statistics().heartbeat_failures == 7


def test_a_worker_started_while_no_coordinator_can_be_chosen_keeps_trying_and_then_consumes() -> (
    None
):
    hub = BusyLogHub(busy=3)
    for shard_id in range(2):
        hub.add_shard(shard_id, logs=4)
    hub.grants = [0, 1]
    Saver.seen = []
    settings = {"heartbeat_interval_ms": 100, "timeout_ms": 1_000, "fetch_interval_ms": 10}
    worker = ConsumerWorker(Saver, config(**settings), client=hub)  # type: ignore[arg-type]
    worker.start()
    try:
        wait_for(lambda: len(Saver.seen) == 8)
        assert worker.is_alive() and hub.busy == 0
    finally:
        worker.shutdown()
    assert hub.checkpoints == {s: encode_cursor(4) for s in range(2)}
