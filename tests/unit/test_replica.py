"""The replica rules, scenario by scenario: Kafka's KIP-101, KIP-279 and KIP-966 failures
replayed step by step on the pure functions, and each rule on its own."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from loghub.coordination.replica import (
    UNDEFINED_EPOCH,
    EpochCache,
    EpochEndOffset,
    LeaderState,
    Record,
    ReplicaLog,
    ReplicaRole,
    advance_high_watermark,
    append_as_leader,
    become_follower,
    become_leader,
    clean_election,
    compare_and_swap,
    crash,
    fetch_request,
    follow_fetch_response,
    fsync,
    handle_fetch,
    is_acknowledged,
    isr_change,
    isr_changed,
    next_role,
    propose_isr,
    readable_records,
    truncate,
    unclean_election_may_lose_acknowledged_data,
)
from loghub.errors import FencedError, IllegalTransition, NotEnoughReplicasError
from loghub.metadata.cluster_store import ShardLeadership
from loghub.testing.replica_sim import HighWatermarkTruncation

MIN_ISR = 2
LAG_MS = 100


def _write(
    log: ReplicaLog, leader: LeaderState, *payloads: bytes, min_isr: int = MIN_ISR
) -> tuple[ReplicaLog, int]:
    """Appended and fsynced by the leader; returns the end offset the ack waits for."""
    log, end_offset = append_as_leader(log, leader, list(payloads), min_isr)
    return fsync(log), end_offset


def _fetch(
    leader_log: ReplicaLog,
    leader: LeaderState,
    follower_log: ReplicaLog,
    follower_id: str,
    now_ms: int = 0,
) -> tuple[ReplicaLog, LeaderState, ReplicaLog]:
    """One fetch and its answer; the follower fsyncs what it got."""
    request = fetch_request(follower_log, follower_id, leader.leader_epoch)
    leader_log, leader, response = handle_fetch(leader_log, leader, request, now_ms)
    follower_log = fsync(follow_fetch_response(follower_log, request, response))
    return leader_log, leader, follower_log


def _payloads(log: ReplicaLog) -> list[bytes]:
    return [record.payload for record in log.records]


# -- the epoch cache ---------------------------------------------------------------------


def test_end_offset_for_epoch_answers_as_kafkas_offset_for_leader_epoch() -> None:
    cache = EpochCache(((1, 0), (3, 10), (6, 25)))
    log_end = 40
    assert cache.end_offset_for_epoch(6, log_end) == EpochEndOffset(6, 40)  # latest: log end
    assert cache.end_offset_for_epoch(3, log_end) == EpochEndOffset(3, 25)  # next one starts
    assert cache.end_offset_for_epoch(4, log_end) == EpochEndOffset(3, 25)  # unknown: floor
    assert cache.end_offset_for_epoch(0, log_end) == EpochEndOffset(0, 0)  # older than all
    undefined = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH)
    assert cache.end_offset_for_epoch(7, log_end) == undefined  # newer than all
    assert EpochCache().end_offset_for_epoch(0, 0) == undefined


def test_an_epoch_that_appended_nothing_gives_way() -> None:
    cache = EpochCache(((1, 0), (3, 10)))
    assert cache.assign(4, 10).entries == ((1, 0), (4, 10))  # epoch 3 never appended
    assert cache.assign(3, 12) is cache  # the latest epoch goes on
    assert cache.truncate_from_end(10).entries == ((1, 0),)
    assert cache.truncate_from_end(11) is cache


def test_a_crash_loses_only_the_unfsynced_tail() -> None:
    record = ShardLeadership("a", 0, ("a",), 0)
    log, leader = become_leader(ReplicaLog(), record, "a", 0)
    log, _ = _write(log, leader, b"m1", b"m2", min_isr=1)
    log, _ = append_as_leader(log, leader, [b"m3"], 1)
    after = crash(log)
    assert _payloads(after) == [b"m1", b"m2"] and after.fsynced_end_offset == 2
    assert crash(after) == after


# -- KIP-101 ---------------------------------------------------------------------------------


def test_kip_101_a_restarted_follower_cut_at_its_high_watermark_loses_an_acked_write() -> None:
    """KIP-101, scenario 1. The follower learns the high watermark one fetch late, so it lags
    the leader's. Cut there on restart, the follower drops an acknowledged write, and the
    leader dies before it fetches again: elected from the ISR, it no longer has the write.
    Cut by lineage (only where the leader's answer says), it keeps it."""
    record = ShardLeadership("a", 0, ("a", "b"), 0)
    a_log, a = become_leader(ReplicaLog(), record, "a", 0)
    b_log = ReplicaLog()
    a_log, _ = _write(a_log, a, b"m1")
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")  # b has m1
    a_log, m2_end = _write(a_log, a, b"m2")
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")  # b has m2, the leader's HW is 1
    request = fetch_request(b_log, "b", a.leader_epoch)  # b reports m2 fsynced...
    a_log, a, _lost_response = handle_fetch(a_log, a, request, 0)  # ...its answer is lost
    assert is_acknowledged(a_log, a, m2_end, MIN_ISR)  # m2 is acknowledged
    assert (a_log.high_watermark, b_log.high_watermark) == (2, 1)

    b_log = crash(b_log)  # b restarts, keeps everything it fsynced
    cut_at_hw = become_follower(b_log, HighWatermarkTruncation())
    by_lineage = become_follower(b_log)
    assert _payloads(cut_at_hw) == [b"m1"] and _payloads(by_lineage) == [b"m1", b"m2"]

    elected = clean_election(record, live=["b"])  # a dies; b is the live ISR member
    assert elected is not None and elected.leader == "b"
    for log, payloads in ((cut_at_hw, [b"m1"]), (by_lineage, [b"m1", b"m2"])):
        new_log, _ = become_leader(log, elected, "b", 0)
        assert _payloads(new_log) == payloads  # pre-KIP-101: acknowledged m2 is gone


def test_kip_101_logs_do_not_diverge_when_both_replicas_restart() -> None:
    """KIP-101, scenario 2. The leader has m2 that the follower fetched but had not
    fsynced; both lose power. The follower comes back first, is elected and writes m3 at
    offset 1. The old leader, following it, must end with m3 at offset 1, not m2. Here the
    high watermark never counted the follower's unfsynced m2, and the old leader finds the
    divergence by its epochs alone; Kafka's HW (which counted it) would have kept m2."""
    record = ShardLeadership("a", 0, ("a", "b"), 0)
    a_log, a = become_leader(ReplicaLog(), record, "a", 0)
    b_log = ReplicaLog()
    a_log, _ = _write(a_log, a, b"m1")
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")
    a_log, m2_end = _write(a_log, a, b"m2")
    request = fetch_request(b_log, "b", a.leader_epoch)
    a_log, a, response = handle_fetch(a_log, a, request, 0)
    b_log = follow_fetch_response(b_log, request, response)  # m2 appended, not fsynced
    request = fetch_request(b_log, "b", a.leader_epoch)  # fetches before its fsync
    a_log, a, _ = handle_fetch(a_log, a, request, 0)
    assert a_log.high_watermark == 1 and not is_acknowledged(a_log, a, m2_end, MIN_ISR)

    a_log, b_log = crash(a_log), crash(b_log)  # power loss
    assert _payloads(a_log) == [b"m1", b"m2"] and _payloads(b_log) == [b"m1"]
    elected = clean_election(record, live=["b"])
    assert elected is not None
    b_log, b = become_leader(b_log, elected, "b", 0)
    b_log, _ = _write(b_log, b, b"m3", min_isr=1)

    a_log = become_follower(a_log)
    request = fetch_request(a_log, "a", b.leader_epoch)
    b_log, b, response = handle_fetch(b_log, b, request, 0)
    assert response.diverging == EpochEndOffset(0, 1)  # epoch 0 ends at 1 on the leader
    a_log = follow_fetch_response(a_log, request, response)
    assert _payloads(a_log) == [b"m1"]
    b_log, b, a_log = _fetch(b_log, b, a_log, "a")
    assert a_log.records == b_log.records and _payloads(a_log) == [b"m1", b"m3"]

    kafka_hw_log = ReplicaLog(  # the old leader as Kafka left it: HW 2, counting b's m2
        (Record(0, b"m1"), Record(0, b"m2")), EpochCache(((0, 0),)), 2, high_watermark=2
    )
    kept = become_follower(kafka_hw_log, HighWatermarkTruncation())
    assert kept.records[1] != b_log.records[1]  # m2 where the leader has m3: diverged


# -- KIP-279 -----------------------------------------------------------------------------------


def test_kip_279_fast_double_failover_truncates_by_lineage() -> None:
    """KIP-279. Leader a writes m2 that nobody fetches and restarts; b is elected (epoch 1),
    writes m3 that nobody fetches, and dies at once; a is elected again (epoch 2) and
    writes m4. a never saw epoch 1, so when b comes back and asks where epoch 1 ends, a
    answers with the epoch it does know (0, ending at 2). b cuts where its own epoch 0 ends
    (1), not at 2 as KIP-101's first answer (an offset with no epoch) would have it: that
    would keep m3 at offset 1, where a has m2."""
    record0 = ShardLeadership("a", 0, ("a", "b", "c"), 0)
    a_log, a = become_leader(ReplicaLog(), record0, "a", 0)
    b_log, c_log = ReplicaLog(), ReplicaLog()
    a_log, _ = _write(a_log, a, b"m1")
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")
    a_log, a, c_log = _fetch(a_log, a, c_log, "c")
    a_log, _ = _write(a_log, a, b"m2")  # fsynced by a only
    a_log = crash(a_log)  # a restarts in a new session: the controller elects again

    record1 = clean_election(record0, live=["b", "a", "c"])
    assert record1 is not None and record1.leader == "b" and record1.leader_epoch == 1
    b_log, b = become_leader(b_log, record1, "b", 0)
    b_log, _ = _write(b_log, b, b"m3")  # b dies before anyone fetches it
    record2 = clean_election(record1, live=["a", "c"])
    assert record2 is not None and record2.leader == "a" and record2.leader_epoch == 2
    a_log, a = become_leader(a_log, record2, "a", 0)
    a_log, _ = _write(a_log, a, b"m4")
    assert a_log.epochs.entries == ((0, 0), (2, 2))  # epoch 1 is not in a's lineage

    b_log = become_follower(crash(b_log))
    request = fetch_request(b_log, "b", a.leader_epoch)
    assert (request.fetch_offset, request.last_fetched_epoch) == (2, 1)
    a_log, a, response = handle_fetch(a_log, a, request, 0)
    assert response.diverging == EpochEndOffset(0, 2)
    kip_101_cut = truncate(b_log, response.diverging.end_offset)
    assert kip_101_cut.records[1] != a_log.records[1]  # the divergence KIP-279 fixed
    b_log = follow_fetch_response(b_log, request, response)
    assert _payloads(b_log) == [b"m1"]
    for _ in range(2):
        a_log, a, b_log = _fetch(a_log, a, b_log, "b")
        a_log, a, c_log = _fetch(a_log, a, c_log, "c")
    assert b_log.records == c_log.records == a_log.records
    assert _payloads(a_log) == [b"m1", b"m2", b"m4"]


def test_a_deposed_leader_that_never_appended_drops_its_empty_epoch() -> None:
    """A leader deposed before its first append keeps an epoch entry with no record; the
    new leader never heard of that epoch, so the first fetch diverges, cuts nothing, and
    removes the entry (as Kafka's truncateTo does), and the next fetch goes through."""
    record0 = ShardLeadership("a", 0, ("a", "b"), 0)
    a_log, a = become_leader(ReplicaLog(), record0, "a", 0)
    b_log = ReplicaLog()
    a_log, _ = _write(a_log, a, b"m1")
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")
    record1 = clean_election(record0, live=["b", "a"])
    assert record1 is not None
    b_log, b = become_leader(b_log, record1, "b", 0)  # epoch 1 at offset 1, nothing appended
    record2 = clean_election(record1, live=["a", "b"])
    assert record2 is not None and record2.leader == "a"
    a_log, a = become_leader(a_log, record2, "a", 0)
    a_log, _ = _write(a_log, a, b"m2")
    b_log = become_follower(b_log)
    assert b_log.epochs.entries == ((0, 0), (1, 1))
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")
    assert _payloads(b_log) == [b"m1"] and b_log.epochs.entries == ((0, 0),)
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")
    assert b_log.records == a_log.records


# -- KIP-966 -----------------------------------------------------------------------------------


def test_kip_966_the_last_replica_standing_loses_no_acknowledged_write() -> None:
    """KIP-966. The ISR shrinks to the leader alone, which then crashes uncleanly and loses
    its unflushed tail. In Kafka (no fsync) that tail could hold acknowledged writes and
    the replica comes back as leader without them. Here nothing is acknowledged before
    every ISR member fsynced it, so the tail held only unacknowledged writes; the replica
    comes back as a follower, is elected in a new epoch, and the others cut the tail away."""
    record0 = ShardLeadership("a", 0, ("a", "b", "c"), 0)
    a_log, a = become_leader(ReplicaLog(), record0, "a", 0)
    b_log, c_log = ReplicaLog(), ReplicaLog()
    a_log, acked_end = _write(a_log, a, b"m1", b"m2", b"m3")
    for _ in range(2):
        a_log, a, b_log = _fetch(a_log, a, b_log, "b", now_ms=10)
        a_log, a, c_log = _fetch(a_log, a, c_log, "c", now_ms=10)
    assert is_acknowledged(a_log, a, acked_end, MIN_ISR)
    a_log, m4_end = append_as_leader(a_log, a, [b"m4"], MIN_ISR)  # a has not fsynced it
    a_log, a, b_log = _fetch(a_log, a, b_log, "b", now_ms=20)  # b has, c is paused
    assert not is_acknowledged(a_log, a, m4_end, MIN_ISR)

    now_ms = 20 + LAG_MS + 1  # b pauses too: both lag
    isr = isr_change(a_log, a, now_ms, LAG_MS)
    assert isr == ("a",)
    record1 = compare_and_swap(record0, propose_isr(a, isr))
    a_log, a = isr_changed(a_log, a, record1)
    with pytest.raises(NotEnoughReplicasError):
        append_as_leader(a_log, a, [b"m5"], MIN_ISR)

    a_log = crash(a_log)  # unclean shutdown of the last replica standing
    assert _payloads(a_log) == [b"m1", b"m2", b"m3"]  # every acknowledged write is there
    with pytest.raises(IllegalTransition):
        next_role(ReplicaRole.OFFLINE, ReplicaRole.LEADER)
    role = next_role(ReplicaRole.OFFLINE, ReplicaRole.FOLLOWER)  # back as a follower
    assert clean_election(record1, live=["b", "c"]) is None  # b, c are not in the ISR
    record2 = clean_election(record1, live=["b", "c", "a"])  # a new session: a new epoch
    assert record2 is not None and record2.leader == "a" and record2.leader_epoch == 1
    next_role(role, ReplicaRole.LEADER)
    a_log, a = become_leader(a_log, record2, "a", now_ms)

    b_log = become_follower(b_log)
    for _ in range(3):
        a_log, a, b_log = _fetch(a_log, a, b_log, "b", now_ms)
        a_log, a, c_log = _fetch(a_log, a, c_log, "c", now_ms)
    assert _payloads(b_log) == _payloads(c_log) == [b"m1", b"m2", b"m3"]  # m4 cut from b
    assert isr_change(a_log, a, now_ms, LAG_MS) == ("a", "b", "c")  # they rejoin


# -- elections and the control plane -------------------------------------------------------------


def test_a_clean_election_picks_only_from_the_isr() -> None:
    record = ShardLeadership("a", 4, ("a", "b"), 9)
    elected = clean_election(record, live=["c", "b"])
    assert elected == ShardLeadership("b", 5, ("b",), 10)  # c is live but not in sync
    assert clean_election(record, live=["c"]) is None
    both = clean_election(record, live=["a", "b"])
    assert both == ShardLeadership("a", 5, ("a", "b"), 10)


def test_an_unclean_election_is_explicit_and_may_lose_acknowledged_writes() -> None:
    record0 = ShardLeadership("a", 0, ("a", "b"), 0)
    a_log, a = become_leader(ReplicaLog(), record0, "a", 0)
    b_log, c_log = ReplicaLog(), ReplicaLog()
    a_log, acked_end = _write(a_log, a, b"m1")
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")
    assert is_acknowledged(a_log, a, acked_end, MIN_ISR)
    # a and b are gone; only c, never in sync, is left
    assert clean_election(record0, live=["c"]) is None
    record1 = unclean_election_may_lose_acknowledged_data(record0, "c")
    assert record1 == ShardLeadership("c", 1, ("c",), 1)
    c_log, c = become_leader(c_log, record1, "c", 0)
    c_log, _ = _write(c_log, c, b"x1", min_isr=1)
    a_log = become_follower(a_log)
    for _ in range(2):
        c_log, c, a_log = _fetch(c_log, c, a_log, "a")
    assert _payloads(a_log) == [b"x1"]  # acknowledged m1 is lost, as the name says


def test_a_deposed_leaders_isr_change_and_its_followers_fetches_are_refused() -> None:
    record0 = ShardLeadership("a", 0, ("a", "b", "c"), 0)
    a_log, a = become_leader(ReplicaLog(), record0, "a", 0)
    record1 = clean_election(record0, live=["b", "c"])  # a paused past its lease
    assert record1 is not None
    current = compare_and_swap(record0, record1)
    proposal = propose_isr(a, ("a",))  # a wakes up and drops the "lagging" b and c
    with pytest.raises(FencedError):
        compare_and_swap(current, proposal)
    b_log, b = become_leader(ReplicaLog(), record1, "b", 0)
    with pytest.raises(FencedError):  # c knows epoch 1 and fetches from a by mistake
        handle_fetch(a_log, a, fetch_request(ReplicaLog(), "c", 1), 0)
    with pytest.raises(FencedError):  # a follower still at epoch 0 reaches the new leader
        handle_fetch(b_log, b, fetch_request(ReplicaLog(), "c", 0), 0)


# -- the leader's rules ----------------------------------------------------------------------------


def test_min_insync_replicas_refuses_writes_and_withholds_acks() -> None:
    record0 = ShardLeadership("a", 0, ("a", "b"), 0)
    a_log, a = become_leader(ReplicaLog(), record0, "a", 0)
    b_log = ReplicaLog()
    a_log, end = _write(a_log, a, b"m1")
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")
    assert is_acknowledged(a_log, a, end, MIN_ISR)
    record1 = compare_and_swap(record0, propose_isr(a, ("a",)))
    a_log, a = isr_changed(a_log, a, record1)
    assert a_log.high_watermark >= end and not is_acknowledged(a_log, a, end, MIN_ISR)
    with pytest.raises(NotEnoughReplicasError, match="min_insync_replicas=2"):
        append_as_leader(a_log, a, [b"m2"], MIN_ISR)


def test_the_high_watermark_counts_only_fsynced_ends_and_never_decreases() -> None:
    record = ShardLeadership("a", 0, ("a", "b"), 0)
    a_log, a = become_leader(ReplicaLog(), record, "a", 0)
    b_log = ReplicaLog()
    a_log, _ = append_as_leader(a_log, a, [b"m1", b"m2"], MIN_ISR)
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")
    late = fetch_request(b_log, "b", 0)  # this one is delayed on the way
    a_log, a, _ = handle_fetch(a_log, a, late, 0)
    assert a_log.high_watermark == 0  # b has fsynced both, a has fsynced nothing
    a_log = advance_high_watermark(fsync(a_log), a)
    assert a_log.high_watermark == 2
    early = fetch_request(ReplicaLog(), "b", 0)  # b's very first fetch arrives last
    a_log, a, _ = handle_fetch(a_log, a, early, 0)
    assert a_log.high_watermark == 2 and a.followers["b"].fsynced_end_offset == 0


def test_reads_stop_at_the_high_watermark() -> None:
    record = ShardLeadership("a", 0, ("a", "b"), 0)
    a_log, a = become_leader(ReplicaLog(), record, "a", 0)
    b_log = ReplicaLog()
    a_log, _ = _write(a_log, a, b"m1", b"m2")
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")
    a_log, a, b_log = _fetch(a_log, a, b_log, "b")
    a_log, _ = _write(a_log, a, b"m3")  # not on b yet
    assert a_log.high_watermark == 2 and a_log.log_end_offset == 3
    assert [r.payload for r in readable_records(a_log, 0, 10)] == [b"m1", b"m2"]
    assert readable_records(a_log, 2, 10) == () and readable_records(a_log, 5, 10) == ()
    assert b_log.high_watermark == 2  # min(leader's, own log end)


def test_the_isr_drops_a_lagging_follower_and_admits_one_past_the_epoch_start() -> None:
    """A new leader's high watermark may lag what the old leader acknowledged; a follower
    joins only once it also holds the new epoch's start, below which every acknowledged
    write lies."""
    log = ReplicaLog(tuple(Record(0, b"m%d" % i) for i in range(6)), EpochCache(((0, 0),)), 6, 3)
    record = ShardLeadership("b", 1, ("b", "c"), 5)  # b was elected with HW 3, LEO 6
    b_log, b = become_leader(log, record, "b", now_ms=1000)
    a_log = ReplicaLog(log.records[:4], EpochCache(((0, 0),)), 4, 3)  # not in the ISR
    b_log, b, a_log = _fetch(b_log, b, a_log, "a", now_ms=1000)
    assert b.followers["a"].fsynced_end_offset == 4  # past HW 3, short of the start 6
    assert isr_change(b_log, b, 1000, LAG_MS) is None
    b_log, b, a_log = _fetch(b_log, b, a_log, "a", now_ms=1000)
    assert isr_change(b_log, b, 1000, LAG_MS) == ("b", "c", "a")
    assert isr_change(b_log, b, 1000 + LAG_MS + 1, LAG_MS) == ("b",)  # c never fetched


def test_a_replica_comes_back_from_a_crash_only_as_a_follower() -> None:
    with pytest.raises(IllegalTransition):
        next_role(ReplicaRole.OFFLINE, ReplicaRole.LEADER)
    with pytest.raises(IllegalTransition):
        next_role(ReplicaRole.LEADER, ReplicaRole.LEADER)
    assert next_role(ReplicaRole.LEADER, ReplicaRole.FOLLOWER) is ReplicaRole.FOLLOWER


# -- a property: diverged logs converge by lineage without cutting shared records -----------------


_Diverged = tuple[list[Record], list[Record], list[Record], int, int | None]


@st.composite
def _diverged_logs(draw: st.DrawFn) -> _Diverged:
    """A shared history, then the leader's and the follower's own epochs (disjoint, the
    leader's newest at last), as failovers leave them: (shared, leader's, follower's, the
    leader's epoch, an epoch the follower led without appending or None)."""
    shared: list[Record] = []
    epoch = 0
    for _ in range(draw(st.integers(0, 3))):
        shared += [Record(epoch, b"s%d" % len(shared)) for _ in range(draw(st.integers(1, 3)))]
        epoch += draw(st.integers(1, 2))
    leader_own, follower_own = list(shared), list(shared)
    if shared:  # the last shared epoch may go on in one of them, the same records
        longer = draw(st.sampled_from([leader_own, follower_own]))
        for _ in range(draw(st.integers(0, 2))):
            longer.append(Record(shared[-1].leader_epoch, b"c%d" % len(longer)))
    later = list(range(epoch, epoch + draw(st.integers(0, 4))))
    owners = [draw(st.sampled_from("lf-")) for _ in later]
    for owner, own_epoch in zip(owners, later, strict=True):
        target = leader_own if owner == "l" else follower_own if owner == "f" else []
        payload = b"%s%d" % (owner.encode(), len(target))
        target += [Record(own_epoch, payload)] * draw(st.integers(1, 3))
    leader_epoch = (later[-1] if later else epoch) + 1
    empty = [e for e, o in zip(later, owners, strict=True) if o == "-"]
    follower_empty_epoch = draw(st.sampled_from([None, *empty]))  # led, never appended
    if follower_empty_epoch is not None and (
        not follower_own or follower_empty_epoch > follower_own[-1].leader_epoch
    ):
        return shared, leader_own, follower_own, leader_epoch, follower_empty_epoch
    return shared, leader_own, follower_own, leader_epoch, None


def _log_of(records: list[Record], empty_epoch: int | None = None) -> ReplicaLog:
    epochs = EpochCache()
    for offset, record in enumerate(records):
        epochs = epochs.assign(record.leader_epoch, offset)
    if empty_epoch is not None:
        epochs = epochs.assign(empty_epoch, len(records))
    return ReplicaLog(tuple(records), epochs, len(records), 0)


@settings(max_examples=examples(300), deadline=None)
@given(_diverged_logs())
def test_lineage_truncation_never_cuts_shared_records_and_converges(logs: _Diverged) -> None:
    shared, leader_records, follower_records, leader_epoch, empty_epoch = logs
    record = ShardLeadership("l", leader_epoch, ("l", "f"), 1)
    leader_log, leader = become_leader(_log_of(leader_records), record, "l", 0)
    follower_log = become_follower(_log_of(follower_records, empty_epoch))
    shortest = follower_log.log_end_offset
    for _ in range(10):
        leader_log, leader, follower_log = _fetch(leader_log, leader, follower_log, "f")
        shortest = min(shortest, follower_log.log_end_offset)
        if follower_log.records == leader_log.records:
            break
    assert follower_log.records == leader_log.records
    assert shortest >= len(shared)  # only what was never in the leader's lineage is cut
