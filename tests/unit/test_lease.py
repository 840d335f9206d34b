"""The lease protocol's pure parts and one coordinator at a time, on a fake clock."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loghub.coordination.lease import (
    HeldLease,
    Lease,
    LeaseCoordinator,
    LeaseRecord,
    LeaseState,
    LeaseTaker,
    observe,
)
from loghub.errors import DatabaseError, IllegalTransition, LeaseLostError, ParameterInvalid
from loghub.testing.clock import FakeClock
from loghub.testing.lease_store import FaultyLeaseStore, MemoryLeaseStore

TIMEOUT_MS = 10_000
RENEW_MS = TIMEOUT_MS // 3


def _lease(shard_id: int, owner: str = "", counter: int = 1, seen_at_ms: int = 0) -> Lease:
    return Lease(LeaseRecord(shard_id, counter if owner else 0, owner, owner), seen_at_ms)


def _leases(*owners: str) -> dict[int, Lease]:
    return {shard_id: _lease(shard_id, owner) for shard_id, owner in enumerate(owners)}


def _owners(store: MemoryLeaseStore) -> Counter[str]:
    return Counter(record.lease_owner for record in store.list_leases())


class _Group:
    """Coordinators sharing one memory store and one fake clock."""

    def __init__(self, shards: int = 8) -> None:
        self.clock = FakeClock()
        self.store = MemoryLeaseStore(self.clock)
        self.shards = list(range(shards))
        self.workers: dict[str, LeaseCoordinator] = {}

    def start(self, name: str) -> LeaseCoordinator:
        worker = LeaseCoordinator(self.store, self.clock, name, lease_timeout_ms=TIMEOUT_MS)
        self.workers[name] = worker
        worker.start(self.shards)
        return worker

    def run(self, ms: int, *, skip: tuple[str, ...] = ()) -> None:
        """Advance time by ``ms`` in renew-sized steps, ticking every worker but ``skip``."""
        for _ in range(ms // 500):
            self.clock.advance(500)
            for name, worker in self.workers.items():
                if name not in skip:
                    worker.tick(self.shards)


# -- taker math --------------------------------------------------------------------------------


def test_target_is_ceil_of_consumable_shards_over_live_workers() -> None:
    taker = LeaseTaker("me", TIMEOUT_MS)
    leases = _leases("a", "a", "a", "b", "b", "", "", "")
    plan = taker.plan(leases, shard_ids=range(8), held=(), now_ms=0)
    assert plan.target == math.ceil(8 / 3)
    assert len(plan.take) == 3 and not plan.steal
    assert {lease.shard_id for lease in plan.take} == {5, 6, 7}


def test_shards_outside_the_consumable_list_are_neither_counted_nor_taken() -> None:
    taker = LeaseTaker("me", TIMEOUT_MS)
    leases = _leases("a", "a", "", "")
    plan = taker.plan(leases, shard_ids=[0, 1, 2], held=(), now_ms=0)
    assert plan.target == 1  # 3 shards: "a" holds the one place at the ceiling of 2
    assert [lease.shard_id for lease in plan.take] == [2]


def test_only_shards_modulo_workers_places_are_at_the_ceiling() -> None:
    """Expired leases of a dead worker: the first taker fills up to the ceiling, the next ones
    only to the floor, so nobody is left to steal (which would cost another lease timeout)."""
    dead = [_lease(s, "dead") for s in range(4)]
    owners = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    leases = {s: _lease(s, owner, seen_at_ms=TIMEOUT_MS) for s, owner in enumerate(owners)}
    leases |= {
        12 + lease.shard_id: Lease(replace(lease.record, shard_id=12 + lease.shard_id), 0)
        for lease in dead
    }
    for worker in ("a", "b", "c"):
        held = {s for s, lease in leases.items() if lease.lease_owner == worker}
        plan = LeaseTaker(worker, TIMEOUT_MS).plan(leases, range(16), held, TIMEOUT_MS + 1)
        assert not plan.steal
        for lease in plan.take:
            leases[lease.shard_id] = _lease(lease.shard_id, worker, seen_at_ms=TIMEOUT_MS)
    assert sorted(Counter(lease.lease_owner for lease in leases.values()).values()) == [5, 5, 6]


def test_free_and_expired_leases_are_taken_before_any_steal() -> None:
    taker = LeaseTaker("me", TIMEOUT_MS)
    leases = _leases("a", "a", "a", "a", "", "dead", "dead", "a")
    now_ms = TIMEOUT_MS + 1  # every counter was first seen at 0
    leases = {
        s: lease if lease.lease_owner != "a" else _lease(s, "a", seen_at_ms=now_ms)
        for s, lease in leases.items()
    }
    plan = taker.plan(leases, shard_ids=range(8), held=(), now_ms=now_ms)
    # "dead" holds only expired leases: not live. Live: a, me -> target 4.
    assert plan.target == 4
    assert {lease.shard_id for lease in plan.take} == {4, 5, 6}
    assert [lease.lease_owner for lease in plan.steal] == ["a"]


def test_two_thieves_seeing_the_same_table_steal_different_leases() -> None:
    """Targets and steals come from ``balance``: every worker that sees the same table
    computes the same moves, so thieves starting together do not race for one lease."""
    leases = _leases(*["a"] * 16)
    plans = [
        LeaseTaker(name, TIMEOUT_MS).plan(leases, range(16), (), 0, ["a", "b", "c", "d"])
        for name in ("b", "c", "d")
    ]
    stolen = [{lease.shard_id for lease in plan.steal} for plan in plans]
    assert [len(shards) for shards in stolen] == [4, 4, 4]
    assert len(stolen[0] | stolen[1] | stolen[2]) == 12


def test_no_steal_when_the_group_is_already_within_one() -> None:
    taker = LeaseTaker("me", TIMEOUT_MS)
    leases = _leases("me", "me", "me", "a", "a", "a", "a")
    plan = taker.plan(leases, shard_ids=range(7), held={0, 1, 2}, now_ms=0)
    assert not plan.take and not plan.steal


def test_one_steal_per_round_policy_takes_one_from_the_most_loaded() -> None:
    taker = LeaseTaker("me", TIMEOUT_MS, steal_max_per_round=1)
    leases = _leases(*["a"] * 10, *["b"] * 6)
    plan = taker.plan(leases, shard_ids=range(16), held=(), now_ms=0)
    assert [lease.lease_owner for lease in plan.steal] == ["a"]


def test_two_workers_with_32_each_and_six_new_ones_end_within_one_after_one_round() -> None:
    group = _Group(shards=64)
    for name in ("old0", "old1"):
        group.start(name)
    group.run(3 * TIMEOUT_MS)  # the old two settle at 32 each
    assert _owners(group.store) == {"old0": 32, "old1": 32}
    new = [f"new{i}" for i in range(6)]
    for name in new:  # they start together: each has registered before anyone's first round
        group.store.register_worker(name)
    for name in new:
        group.start(name)
    assert sorted(_owners(group.store).values()) == [8] * 8
    # Stolen leases are consumed one lease timeout (plus a renew) later, by their thieves.
    group.run(TIMEOUT_MS + RENEW_MS + 500)
    consumers = Counter(record.consumer_owner for record in group.store.list_leases())
    assert sorted(consumers.values()) == [8] * 8


@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 64),
    st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=8, unique=True),
    st.data(),
)
def test_every_worker_taking_one_round_in_turn_balances_the_group(
    shard_count: int, workers: list[str], data: st.DataObject
) -> None:
    owner_choices = st.sampled_from(["", *workers])
    owners = data.draw(st.lists(owner_choices, min_size=shard_count, max_size=shard_count))
    order = data.draw(st.permutations(workers))
    for worker in order:
        leases = _leases(*owners)
        held = {s for s, owner in enumerate(owners) if owner == worker}
        plan = LeaseTaker(worker, TIMEOUT_MS).plan(leases, range(shard_count), held, 0, workers)
        for lease in (*plan.take, *plan.steal):
            owners[lease.shard_id] = worker
    counts = Counter({worker: 0 for worker in workers}) + Counter(owners)
    del counts[""]
    assert "" not in owners
    assert max(counts.values()) - min(counts[w] for w in workers) <= 1, (owners, order)


# -- expiry by local observation ---------------------------------------------------------------


def test_expiry_counts_from_when_this_worker_first_saw_the_counter() -> None:
    first = observe({}, [LeaseRecord(0, 7, "a", "a")], seen_at_ms=5_000)
    assert first[0].counter_seen_at_ms == 5_000
    # However old the row is, a counter seen for the first time now is not expired.
    assert not first[0].is_expired(5_000 + TIMEOUT_MS, TIMEOUT_MS)
    assert first[0].is_expired(5_001 + TIMEOUT_MS, TIMEOUT_MS)
    same = observe(first, [LeaseRecord(0, 7, "a", "a")], seen_at_ms=9_000)
    assert same[0].counter_seen_at_ms == 5_000
    moved = observe(same, [LeaseRecord(0, 8, "a", "a")], seen_at_ms=12_000)
    assert moved[0].counter_seen_at_ms == 12_000
    assert not moved[0].is_expired(12_000 + TIMEOUT_MS, TIMEOUT_MS)


def test_free_leases_never_expire() -> None:
    assert not _lease(0).is_expired(10**9, TIMEOUT_MS)


class _WallClockForbidden(FakeClock):
    def wall_ms(self) -> int:
        raise AssertionError("the protocol read the wall clock")


def test_the_coordinator_never_reads_the_wall_clock() -> None:
    store_clock = FakeClock()
    clock = _WallClockForbidden()
    store = MemoryLeaseStore(store_clock)
    a = LeaseCoordinator(store, clock, "a", lease_timeout_ms=TIMEOUT_MS)
    b = LeaseCoordinator(store, clock, "b", lease_timeout_ms=TIMEOUT_MS)
    a.start(range(4))
    b.start(range(4))
    store_clock.advance(10**9)  # the store's wall clock runs wild: changes nothing
    for _ in range(10 * TIMEOUT_MS // 500):
        clock.advance(500)
        a.tick(range(4))  # b has died: a takes its leases once they expire on a's clock
    assert _owners(store) == {"a": 4}


def test_a_crashed_workers_leases_are_taken_after_they_expire_and_consumed_at_once() -> None:
    group = _Group(shards=4)
    a = group.start("a")
    group.start("b")
    group.run(3 * TIMEOUT_MS)
    assert _owners(group.store) == {"a": 2, "b": 2}
    crashed_at_ms = group.clock.monotonic_ms()
    last_renew_ms = crashed_at_ms - RENEW_MS  # b renewed within its last renew interval
    del group.workers["b"]
    while _owners(group.store)["a"] < 4:
        group.run(500)
        assert group.clock.monotonic_ms() - crashed_at_ms <= 3 * TIMEOUT_MS + 2 * RENEW_MS
    taken_at_ms = group.clock.monotonic_ms()
    assert taken_at_ms - last_renew_ms > TIMEOUT_MS
    decisions = a.tick(group.shards)
    assert decisions.consuming == (0, 1, 2, 3) and not decisions.waiting


# -- renewer, handover and fencing -------------------------------------------------------------


def _steal_setup() -> tuple[_Group, LeaseCoordinator, LeaseCoordinator, int]:
    """``old`` holds and consumes all 4 shards; ``thief`` joins and steals 2."""
    group = _Group(shards=4)
    old = group.start("old")
    assert old.tick(group.shards).consuming == (0, 1, 2, 3)
    thief = group.start("thief")
    stolen = thief.tick(group.shards).waiting
    assert len(stolen) == 2
    return group, old, thief, stolen[0]


def test_a_renew_that_loses_the_compare_and_set_stops_the_shard() -> None:
    group, old, thief, shard = _steal_setup()
    assert old.may_consume(shard)  # it does not know yet
    group.clock.advance(RENEW_MS)
    decisions = old.tick(group.shards)
    assert shard in decisions.stop
    assert not old.may_consume(shard)
    assert old.statistics().lost == 2


def test_the_old_holder_writes_its_last_checkpoint_after_losing_the_lease() -> None:
    group, old, thief, shard = _steal_setup()
    group.clock.advance(RENEW_MS)
    old.tick(group.shards)
    old.checkpoint(shard, "final")  # still consumer_owner: allowed
    assert thief.read_checkpoint(shard) == "final"


def test_a_stolen_shard_is_not_consumed_before_one_lease_timeout() -> None:
    group, old, thief, shard = _steal_setup()
    for _ in range(TIMEOUT_MS // 500 - 1):
        group.clock.advance(500)
        assert shard not in thief.tick(group.shards).consuming
        assert not thief.may_consume(shard)
        old.tick(group.shards)
    consumer = group.store.get_lease(shard)
    assert consumer is not None and consumer.consumer_owner == "old"
    started: list[int] = []
    for _ in range(RENEW_MS // 500 + 2):
        group.clock.advance(500)
        started += thief.tick(group.shards).start
    assert shard in started and thief.may_consume(shard)
    with pytest.raises(LeaseLostError):
        old.checkpoint(shard, "too late")


def test_checkpoint_is_refused_unless_this_worker_is_consumer_owner() -> None:
    group = _Group(shards=2)
    a = group.start("a")
    b = LeaseCoordinator(group.store, group.clock, "b", lease_timeout_ms=TIMEOUT_MS)
    a.checkpoint(0, "10")
    before = group.store.get_lease(0)
    with pytest.raises(LeaseLostError):
        b.checkpoint(0, "99")
    assert group.store.get_lease(0) == before
    assert a.read_checkpoint(0) == "10"


def test_a_paused_holder_stops_at_its_deadline_without_a_tick() -> None:
    group = _Group(shards=2)
    a = group.start("a")
    assert a.may_consume(0)
    group.clock.advance(TIMEOUT_MS - 1)
    assert a.may_consume(0)
    group.clock.advance(1)
    assert not a.may_consume(0)


def test_failed_renews_keep_the_lease_until_the_deadline_then_a_winning_renew_resumes() -> None:
    clock = FakeClock()
    inner = MemoryLeaseStore(clock)
    faulty = FaultyLeaseStore(inner, __import__("random").Random(1))
    a = LeaseCoordinator(faulty, clock, "a", lease_timeout_ms=TIMEOUT_MS)
    a.start([0])
    faulty.set_failure_probability(1.0, ["compare_and_set"])
    clock.advance(TIMEOUT_MS)
    assert a.tick([0]).stop == (0,)
    assert a.statistics().store_errors >= 1
    faulty.set_failure_probability(0.0)
    clock.advance(RENEW_MS)
    assert a.tick([0]).start == (0,)  # nobody took it: the same counter still wins


def test_fail_nth_call_fails_exactly_that_call() -> None:
    clock = FakeClock()
    faulty = FaultyLeaseStore(MemoryLeaseStore(clock), __import__("random").Random(1))
    faulty.fail_nth_call("list_leases", 2)
    faulty.list_leases()
    with pytest.raises(DatabaseError):
        faulty.list_leases()
    faulty.list_leases()
    assert faulty.failures["list_leases"] == 1


def test_a_free_lease_still_named_as_someone_elses_consumer_waits() -> None:
    group = _Group(shards=1)
    group.store.create_leases([0])
    assert group.store.compare_and_set(0, 0, "thief", "holder")
    assert group.store.compare_and_set(0, 1, "", None)  # the thief left before consuming
    a = group.start("a")
    decisions = a.tick(group.shards)
    assert decisions.waiting == (0,) and not decisions.consuming


def test_a_clean_leave_releases_leases_for_others_to_consume_at_once() -> None:
    group = _Group(shards=4)
    a = group.start("a")
    b = group.start("b")
    group.run(3 * TIMEOUT_MS)
    a.shutdown()
    del group.workers["a"]
    group.run(2 * TIMEOUT_MS + RENEW_MS)
    assert b.tick(group.shards).consuming == (0, 1, 2, 3)
    assert group.store.recent_workers(TIMEOUT_MS) == ["b"]


def test_a_restarted_worker_keeps_its_shards() -> None:
    group = _Group(shards=4)
    group.start("a")
    group.start("b")
    group.run(3 * TIMEOUT_MS)
    before = {r.shard_id for r in group.store.list_leases() if r.lease_owner == "a"}
    restarted = LeaseCoordinator(group.store, group.clock, "a", lease_timeout_ms=TIMEOUT_MS)
    assert set(restarted.start(group.shards).consuming) == before


def test_a_shard_dropped_from_the_list_is_stopped_and_released() -> None:
    group = _Group(shards=3)
    a = group.start("a")
    decisions = a.tick([0, 1])
    assert decisions.stop == (2,)
    record = group.store.get_lease(2)
    assert record is not None and record.lease_owner == "" and record.consumer_owner == ""


def test_new_shards_get_free_leases() -> None:
    group = _Group(shards=2)
    a = group.start("a")
    group.clock.advance(2 * TIMEOUT_MS)
    decisions = a.tick([0, 1, 5])
    assert decisions.start == (5,)
    assert [r.shard_id for r in group.store.list_leases()] == [0, 1, 5]


def test_limits_are_enforced() -> None:
    clock = FakeClock()
    store = MemoryLeaseStore(clock)
    with pytest.raises(ParameterInvalid):
        LeaseCoordinator(store, clock, "x" * 129)
    with pytest.raises(ParameterInvalid):
        LeaseCoordinator(store, clock, "a", lease_timeout_ms=10)
    a = LeaseCoordinator(store, clock, "a")
    with pytest.raises(ParameterInvalid):
        a.start(range(5000))
    with pytest.raises(ParameterInvalid):
        a.checkpoint(0, "x" * 2000)


def test_a_consuming_lease_never_goes_back_to_waiting() -> None:
    held = HeldLease(0, 1, LeaseState.CONSUMING, 0, 0)
    with pytest.raises(IllegalTransition):
        held.transition_to(LeaseState.WAITING)
    with pytest.raises(IllegalTransition):
        held.transition_to(LeaseState.CONSUMING)


# -- no idle waits -----------------------------------------------------------------------------


def _tick_by_decisions(worker: LeaseCoordinator, clock: FakeClock, shards: list[int]) -> None:
    """One step of a worker that sleeps exactly until ``next_tick_ms``, as the library does."""
    decisions = worker.tick(shards)
    assert decisions.next_tick_ms > clock.monotonic_ms(), "nothing left due after a tick"
    clock.advance(decisions.next_tick_ms - clock.monotonic_ms())


def test_a_killed_workers_shards_move_within_one_lease_timeout_and_one_renew() -> None:
    group = _Group(shards=8)
    a = group.start("a")
    b = group.start("b")
    group.run(3 * TIMEOUT_MS)
    assert _owners(group.store) == {"a": 4, "b": 4}
    b.tick(group.shards)  # b's last renew: it dies right after
    killed_at_ms = group.clock.monotonic_ms()
    del group.workers["b"]
    while _owners(group.store)["a"] < 8:
        assert group.clock.monotonic_ms() - killed_at_ms <= TIMEOUT_MS + RENEW_MS
        _tick_by_decisions(a, group.clock, group.shards)
    assert a.tick(group.shards).consuming == tuple(range(8))


def test_children_of_a_finished_parent_are_taken_at_the_tick_that_lists_them() -> None:
    group = _Group(shards=2)
    a = group.start("a")
    group.start("b")
    group.run(TIMEOUT_MS)
    decisions = a.tick([0, 1])
    parent = decisions.consuming[0]
    # The parent is finished: the caller drops it and lists its two children instead.
    children = [5, 6]
    shards = [s for s in (0, 1) if s != parent] + children
    decisions = a.tick(shards)  # no time has passed: no renew, no taker round is due
    assert set(children) <= set(decisions.start)
    assert parent in decisions.stop


class _RivalFirstStore(MemoryLeaseStore):
    """Another worker ("x") wins the lease that this store's first compare-and-set is for."""

    raced = False

    def compare_and_set(
        self, shard_id: int, seen_counter: int, lease_owner: str, consumer_owner: str | None
    ) -> bool:
        if not self.raced:
            self.raced = True
            assert super().compare_and_set(shard_id, seen_counter, "x", "x")
        return super().compare_and_set(shard_id, seen_counter, lease_owner, consumer_owner)


def test_a_taker_that_loses_a_race_plans_again_at_once() -> None:
    clock = FakeClock()
    store = _RivalFirstStore(clock)
    store.register_worker("x")
    b = LeaseCoordinator(store, clock, "b", lease_timeout_ms=TIMEOUT_MS)
    decisions = b.start(range(4))
    assert len(decisions.consuming) == 2  # not 1 until the next taker round
    assert _owners(store) == {"b": 2, "x": 1, "": 1}
