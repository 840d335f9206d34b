"""ConsumerGroup: every rule of spec/consumer-groups.md, one test per rule."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from loghub.coordination.group import (
    ConsumerGroup,
    ShardView,
    consumer_name_chars_max,
    consumers_per_group_max,
    timeout_ms_max,
)
from loghub.coordination.shard_state import ShardState
from loghub.errors import ParameterInvalid

S = ShardState
TIMEOUT_MS = 2000


def flat(count: int, finished: Iterable[int] = ()) -> list[ShardView]:
    done = set(finished)
    return [ShardView(i, (), i in done) for i in range(count)]


def settle(
    g: ConsumerGroup, held: dict[str, list[int]], shards: list[ShardView], now_ms: int
) -> dict[str, list[int]]:
    """A few rounds of consumers that let go at once and report exactly what they were given."""
    for step in range(6):
        for name in held:
            held[name] = g.heartbeat(name, held[name], shards, now_ms + step)
    return held


def group(ordered: bool = False, recovering: bool = False) -> ConsumerGroup:
    return ConsumerGroup("g", TIMEOUT_MS, ordered, now_ms=0, recovering=recovering)


def test_the_rebalance_trace_of_the_hosted_service() -> None:
    """sls-protocol.md 7.3: a alone with 5 shards, then b joins."""
    g, shards = group(), flat(5)
    assert g.heartbeat("a", [], shards, 0) == [0, 1, 2, 3, 4]
    assert g.heartbeat("b", [], shards, 100) == []  # a still holds everything
    assert g.heartbeat("a", [0, 1, 2, 3, 4], shards, 1000) == [0, 2, 4]  # release 1 and 3
    assert g.shard_states()[1] is S.TRANSFER
    assert g.can_checkpoint("a", 3), "the old holder writes its final checkpoint"
    assert not g.can_checkpoint("b", 3)
    assert g.heartbeat("b", [], shards, 1100) == [], "a still reports 1 and 3"
    assert g.heartbeat("a", [0, 2, 4], shards, 2000) == [0, 2, 4]
    assert g.heartbeat("b", [], shards, 2100) == [1, 3]
    assert g.heartbeat("b", [1, 3], shards, 3100) == [1, 3]
    assert g.can_checkpoint("b", 3) and not g.can_checkpoint("a", 3)


def test_a_shard_still_shutting_down_on_its_old_holder_is_not_handed_on() -> None:
    g, shards = group(), flat(4)
    g.heartbeat("a", [], shards, 0)
    g.heartbeat("b", [], shards, 10)
    assert g.heartbeat("a", [0, 1, 2, 3], shards, 20) == [0, 2]
    for now_ms in range(100, 1900, 200):  # a is slow to let go of 1 and 3
        assert g.heartbeat("b", [], shards, now_ms) == []
        assert g.heartbeat("a", [0, 1, 2, 3], shards, now_ms + 100) == [0, 2]
    g.heartbeat("a", [0, 2, 3], shards, 2000)  # 1 is released, 3 is not
    assert g.heartbeat("b", [], shards, 2010) == [1]
    g.heartbeat("a", [0, 2], shards, 2020)
    assert g.heartbeat("b", [1], shards, 2030) == [1, 3]


def test_a_shard_in_the_last_reply_is_claimed_until_the_consumer_reports_again() -> None:
    g, shards = group(), flat(2)
    assert g.heartbeat("a", [], shards, 0) == [0, 1]  # this reply may still be on its way
    g.heartbeat("b", [], shards, 10)  # balance: 1 goes to transfer a -> b
    assert g.shard_states()[1] is S.TRANSFER
    assert g.heartbeat("b", [], shards, 20) == [], "a may be about to start shard 1"
    assert g.heartbeat("a", [], shards, 30) == [0]  # the reply was lost: a never had 1
    assert g.heartbeat("b", [], shards, 40) == [1]


def test_a_granted_shard_not_listed_yet_is_kept_granted() -> None:
    g, shards = group(), flat(3)
    assert g.heartbeat("a", [], shards, 0) == [0, 1, 2]
    assert g.heartbeat("a", [0], shards, 1000) == [0, 1, 2]
    assert g.heartbeat("a", [0], shards, 1900) == [0, 1, 2]


def test_three_consumers_on_eight_shards_hold_three_three_two() -> None:
    g, shards = group(), flat(8)
    held = settle(g, {"a": [], "b": [], "c": []}, shards, 0)
    assert sorted(len(h) for h in held.values()) == [2, 3, 3]
    assert sorted(s for h in held.values() for s in h) == list(range(8))
    assert g.statistics().already_alloc == 8


def test_every_needed_move_happens_in_one_round() -> None:
    g, shards = group(), flat(12)
    assert g.heartbeat("a", [], shards, 0) == list(range(12))
    g.heartbeat("b", [], shards, 1)
    assert g.heartbeat("a", list(range(12)), shards, 2) == [0, 2, 4, 6, 8, 10]


def test_a_next_consumer_that_times_out_gives_the_shard_back_to_the_old_holder() -> None:
    g, shards = group(), flat(2)
    g.heartbeat("a", [], shards, 0)
    g.heartbeat("b", [], shards, 10)
    assert g.heartbeat("a", [0, 1], shards, 20) == [0]
    assert g.heartbeat("a", [0, 1], shards, 2011) == [0, 1], "b timed out: a keeps 1"
    assert g.expire(2011) == []
    assert g.shard_states() == {0: S.ALREADY_ALLOC, 1: S.ALREADY_ALLOC}


def test_a_holder_that_times_out_during_a_transfer_frees_the_shard() -> None:
    g, shards = group(), flat(2)
    g.heartbeat("a", [], shards, 0)
    g.heartbeat("b", [], shards, 10)
    assert g.shard_states()[1] is S.TRANSFER
    assert g.expire(2001) == ["a"]
    assert g.shard_states() == {0: S.NOT_ALLOC, 1: S.NOT_ALLOC}
    assert g.heartbeat("b", [], shards, 2002) == [0, 1]


def test_a_holder_that_times_out_loses_its_shards() -> None:
    g, shards = group(), flat(4)
    g.heartbeat("a", [], shards, 0)
    g.heartbeat("b", [], shards, 10)
    g.heartbeat("a", [0, 1, 2, 3], shards, 20)
    g.heartbeat("a", [0, 2], shards, 30)
    assert g.heartbeat("b", [], shards, 40) == [1, 3]
    assert g.heartbeat("b", [1, 3], shards, 2000) == [1, 3], "a is silent but not yet gone"
    assert g.heartbeat("b", [1, 3], shards, 2031) == [0, 1, 2, 3]
    assert list(g.assignments()) == ["b"]


def test_a_consumer_keeps_a_reported_shard_nobody_else_holds_or_reports() -> None:
    g, shards = group(), flat(3)
    assert g.heartbeat("a", [0, 1], shards, 0) == [0, 1, 2]
    g2 = group(recovering=True)
    g2.heartbeat("b", [1], shards, 0)
    assert g2.heartbeat("a", [0, 1], shards, 10) == [0], "b reports 1 too"
    assert g2.assignments() == {"a": [0], "b": [1]}


def test_a_reported_shard_two_consumers_claim_goes_to_neither() -> None:
    g = group(recovering=True)
    shards = flat(2)
    g.heartbeat("a", [0, 1], shards, 0)
    g.heartbeat("b", [1], shards, 10)
    assert g.shard_states()[1] is S.ALREADY_ALLOC, "a reported 1 first and was given it"
    g2 = group(recovering=True)
    g2.heartbeat("b", [1], shards, 0)
    g2.heartbeat("a", [1], shards, 0)
    assert g2.shard_states()[1] is S.ALREADY_ALLOC
    g3 = group(recovering=True)
    g3.heartbeat("a", [], shards, 0)
    g3.heartbeat("b", [], shards, 0)
    # both report 1 in the same round, before either could adopt it
    assert g3.heartbeat("a", [1], shards, 0) == [1]
    assert g3.heartbeat("b", [1], shards, 0) == []


def test_restart_recovery_adopts_reports_and_grants_nothing_new_for_one_timeout() -> None:
    g, shards = group(recovering=True), flat(6)
    assert g.statistics().recovering
    assert g.heartbeat("a", [0, 1], shards, 0) == [0, 1]
    assert g.heartbeat("c", [], shards, 100) == [], "recovering: nothing new is granted"
    assert g.heartbeat("b", [2, 3], shards, 500) == [2, 3]
    assert g.heartbeat("a", [0, 1], shards, 1000) == [0, 1]
    assert g.statistics().not_alloc == 2
    assert g.heartbeat("c", [], shards, 1999) == []
    assert g.heartbeat("c", [], shards, 2000) == [4, 5]
    assert not g.statistics().recovering


def test_without_recovery_a_new_group_grants_at_once() -> None:
    g = group()
    assert not g.statistics().recovering
    assert g.heartbeat("a", [], flat(2), 0) == [0, 1]


def split_lineage(parent_finished: bool) -> list[ShardView]:
    """Shard 0 split into 1 and 2; 1 and 3 merged into 4."""
    return [
        ShardView(0, (), parent_finished),
        ShardView(1, (0,), False),
        ShardView(2, (0,), False),
        ShardView(3, (), False),
        ShardView(4, (1, 3), False),
    ]


def test_ordered_children_wait_for_their_parents_and_start_without_a_restart() -> None:
    g = group(ordered=True)
    shards = [ShardView(0, (), False), ShardView(1, (0,), False), ShardView(2, (0,), False)]
    assert g.heartbeat("a", [], shards, 0) == [0]
    assert g.shard_states() == {0: S.ALREADY_ALLOC, 1: S.WAIT, 2: S.WAIT}
    assert g.heartbeat("a", [0], shards, 100) == [0]
    shards[0] = ShardView(0, (), True)  # the holder read the parent to its end
    assert g.heartbeat("a", [0], shards, 200) == [1, 2]
    assert g.shard_states()[0] is S.OVER


def test_ordered_merge_child_waits_for_both_parents_and_ancestors() -> None:
    g = group(ordered=True)
    lineage = split_lineage(parent_finished=False)
    g.heartbeat("a", [], lineage, 0)
    assert g.shard_states() == {
        0: S.ALREADY_ALLOC,
        1: S.WAIT,
        2: S.WAIT,
        3: S.ALREADY_ALLOC,
        4: S.WAIT,
    }
    lineage[3] = ShardView(3, (), True)
    g.heartbeat("a", [0, 3], lineage, 10)
    assert g.shard_states()[4] is S.WAIT, "its grandparent 0 is not over"
    lineage[0] = ShardView(0, (), True)
    assert g.heartbeat("a", [0, 3], lineage, 20) == [1, 2]
    assert g.shard_states()[4] is S.WAIT, "its parent 1 is not over"
    lineage[1] = ShardView(1, (0,), True)
    assert g.heartbeat("a", [1, 2], lineage, 30) == [2, 4]


def test_empty_read_only_parents_release_their_children_at_once() -> None:
    g = group(ordered=True)
    # 0 was split before anyone held it; empty, so finished from the start
    shards = [ShardView(0, (), True), ShardView(1, (0,), False), ShardView(2, (0,), False)]
    assert g.heartbeat("a", [], shards, 0) == [1, 2]
    assert g.shard_states()[0] is S.OVER


def test_a_deleted_parent_counts_as_over() -> None:
    g = group(ordered=True)
    assert g.heartbeat("a", [], [ShardView(5, (0,), False)], 0) == [5]


def test_unordered_children_are_consumable_at_once() -> None:
    g = group(ordered=False)
    assert g.heartbeat("a", [], split_lineage(parent_finished=False), 0) == [0, 1, 2, 3, 4]


def test_closed_shards_do_not_count_for_balance() -> None:
    g = group()
    held = settle(g, {"a": [], "b": []}, flat(8), 0)
    assert [len(h) for h in held.values()] == [4, 4]
    closing = flat(8, finished=held["a"][:3])  # three of a's shards are read to their end
    held = settle(g, held, closing, 100)
    assert [len(h) for h in held.values()] == [2, 3], "b gave one shard to a"
    assert g.statistics().over == 3


def test_waiting_shards_do_not_count_for_balance() -> None:
    g = group(ordered=True)
    shards = [ShardView(i, (), False) for i in range(4)]
    shards += [ShardView(10 + i, (i,), False) for i in range(4)]  # 4 waiting children
    held = settle(g, {"a": [], "b": []}, shards, 0)
    assert held == {"a": [0, 2], "b": [1, 3]}
    assert g.statistics().wait == 4


def test_order_true_to_false_frees_every_waiting_shard() -> None:
    g = group(ordered=True)
    g.heartbeat("a", [], split_lineage(parent_finished=False), 0)
    assert g.statistics().wait == 3
    g.update(10, ordered=False)
    assert g.statistics().wait == 0
    assert g.heartbeat("a", [0, 3], split_lineage(parent_finished=False), 20) == [0, 1, 2, 3, 4]


def test_order_false_to_true_applies_to_shards_that_appear_afterwards() -> None:
    g = group(ordered=False)
    shards = [ShardView(0, (), False), ShardView(1, (0,), False)]
    assert g.heartbeat("a", [], shards, 0) == [0, 1]
    g.update(10, ordered=True)
    shards += [ShardView(2, (0,), False)]
    assert g.heartbeat("a", [0, 1], shards, 20) == [0, 1]
    assert g.shard_states() == {0: S.ALREADY_ALLOC, 1: S.ALREADY_ALLOC, 2: S.WAIT}
    assert g.ordered


def test_an_over_shard_that_is_not_finished_any_more_is_consumable_again() -> None:
    g = group()
    assert g.heartbeat("a", [], flat(2, finished=[1]), 0) == [0]
    assert g.shard_states()[1] is S.OVER
    assert not g.can_checkpoint("a", 1)
    assert g.heartbeat("a", [0], flat(2), 10) == [0, 1]  # the checkpoint was moved back


def test_a_finished_shard_leaves_its_holders_reply() -> None:
    g = group()
    assert g.heartbeat("a", [], flat(2), 0) == [0, 1]
    assert g.heartbeat("a", [0, 1], flat(2, finished=[0]), 10) == [1]
    assert g.shard_states()[0] is S.OVER


def test_vanished_shards_are_dropped() -> None:
    g = group()
    g.heartbeat("a", [], flat(3), 0)
    assert g.heartbeat("a", [0, 1, 2], [ShardView(2, (), False)], 10) == [2]
    assert g.shard_states() == {2: S.ALREADY_ALLOC}
    assert not g.can_checkpoint("a", 0)


def test_only_the_holder_may_checkpoint() -> None:
    g, shards = group(), flat(2)
    g.heartbeat("a", [], shards, 0)
    assert g.can_checkpoint("a", 0)
    assert not g.can_checkpoint("b", 0)
    assert not g.can_checkpoint("a", 9)
    g.heartbeat("b", [], shards, 10)
    assert g.can_checkpoint("a", 1) and not g.can_checkpoint("b", 1), "transfer: the old holder"


def test_expire_removes_silent_consumers_only() -> None:
    g, shards = group(), flat(2)
    g.heartbeat("a", [], shards, 0)
    g.heartbeat("b", [], shards, 1000)
    assert g.expire(2000) == []
    assert g.expire(2001) == ["a"]
    assert list(g.assignments()) == ["b"]
    assert g.statistics().consumers == 1


def test_a_shorter_timeout_takes_effect_at_once() -> None:
    g, shards = group(), flat(1)
    g.heartbeat("a", [], shards, 0)
    g.update(600, timeout_ms=500)
    assert g.timeout_ms == 500
    assert g.assignments() == {}
    assert g.shard_states() == {0: S.NOT_ALLOC}


def test_statistics_count_consumers_and_states() -> None:
    g = group(ordered=True)
    g.heartbeat("a", [], split_lineage(parent_finished=True), 0)
    stats = g.statistics()
    assert (stats.consumers, stats.shards) == (1, 5)
    assert (stats.over, stats.already_alloc, stats.wait, stats.not_alloc, stats.transfer) == (
        (1, 3, 1, 0, 0)
    )


def test_limits_raise_parameter_invalid() -> None:
    g, shards = group(), flat(1)
    for i in range(consumers_per_group_max):
        g.heartbeat(f"c{i}", [], shards, 0)
    with pytest.raises(ParameterInvalid):
        g.heartbeat("one-too-many", [], shards, 0)
    assert g.heartbeat("c0", [], shards, 1) is not None, "known consumers still heartbeat"
    with pytest.raises(ParameterInvalid):
        g.heartbeat("x" * (consumer_name_chars_max + 1), [], shards, 1)
    with pytest.raises(ParameterInvalid):
        g.heartbeat("", [], shards, 1)
    with pytest.raises(ParameterInvalid):
        ConsumerGroup("g", 0, False, 0)
    with pytest.raises(ParameterInvalid):
        ConsumerGroup("g", timeout_ms_max + 1, False, 0)
    with pytest.raises(ParameterInvalid):
        g.update(1, timeout_ms=-5)


def test_a_consumer_that_reports_nothing_after_a_grant_has_left_and_its_shards_move_at_once() -> (
    None
):
    g = group()
    shards = flat(4)
    settle(g, {"a": [], "b": []}, shards, now_ms=0)
    assert len(g.assignments()["a"]) == 2
    # a stopped its shards and wrote their checkpoints: its leave reports nothing.
    assert g.heartbeat("a", [], shards, now_ms=10) == []
    assert "a" not in g.assignments()
    b_held = g.heartbeat("b", g.assignments()["b"], shards, now_ms=20)
    assert b_held == [0, 1, 2, 3]  # long before the timeout


# -- a saved assignment restored by a new coordinator (cluster mode) ----------------------------


def test_a_restored_assignment_keeps_every_holder_on_its_shards() -> None:
    old = group()
    held = settle(old, {"a": [], "b": [], "c": []}, flat(6), 0)
    new = ConsumerGroup("g", TIMEOUT_MS, False, now_ms=50_000)
    new.restore(old.owners(), flat(6), 50_000)
    # each consumer's next heartbeat, in any order, whatever it reports, keeps its shards
    assert new.heartbeat("c", held["c"], flat(6), 50_100) == held["c"]
    assert new.heartbeat("a", [], flat(6), 50_200) == held["a"]
    assert new.heartbeat("b", held["b"], flat(6), 50_300) == held["b"]
    assert new.owners() == old.owners()


def test_a_restored_holder_that_stays_silent_loses_its_shards_after_the_timeout() -> None:
    new = ConsumerGroup("g", TIMEOUT_MS, False, now_ms=10_000)
    new.restore({0: "a", 1: "a", 2: "b"}, flat(3), 10_000)
    assert new.can_checkpoint("a", 0) and new.owners() == {0: "a", 1: "a", 2: "b"}
    assert new.heartbeat("b", [2], flat(3), 10_000 + TIMEOUT_MS) == [2]
    assert new.heartbeat("b", [2], flat(3), 10_001 + TIMEOUT_MS) == [0, 1, 2]


def test_a_restored_assignment_gives_nothing_claimed_to_a_newcomer() -> None:
    new = ConsumerGroup("g", TIMEOUT_MS, False, now_ms=0)
    new.restore({0: "a", 1: "a"}, flat(2), 0)
    assert new.heartbeat("z", [], flat(2), 1) == [], "a's shards are claimed until it is gone"
    assert new.heartbeat("a", [0, 1], flat(2), 2) == [0]  # balancing moves one to z
    assert new.heartbeat("a", [0], flat(2), 3) == [0]
    assert new.heartbeat("z", [], flat(2), 4) == [1]


def test_a_restored_shard_that_is_gone_or_finished_is_not_held() -> None:
    new = ConsumerGroup("g", TIMEOUT_MS, False, now_ms=0)
    new.restore({0: "a", 1: "a", 7: "a"}, flat(2, finished=[1]), 0)
    assert new.heartbeat("a", [0, 1, 7], flat(2, finished=[1]), 1) == [0]
    assert new.shard_states() == {0: S.ALREADY_ALLOC, 1: S.OVER}
