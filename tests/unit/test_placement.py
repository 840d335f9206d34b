"""The controller's placement rule: every shard placed, counts even, few moves, racks spread."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from loghub.coordination.placement import (
    NodeSlot,
    ShardRef,
    group_coordinator,
    moves,
    place,
    place_replicas,
)


def shards_of(*logstores: tuple[str, int]) -> list[ShardRef]:
    return [("p", name, i) for name, count in logstores for i in range(count)]


def test_shards_spread_evenly_over_three_nodes() -> None:
    nodes = [NodeSlot("a"), NodeSlot("b"), NodeSlot("c")]
    placement = place(shards_of(("s", 10)), nodes, {})
    assert sorted(Counter(placement.values()).values()) == [3, 3, 4]


def test_a_dead_node_shards_go_to_the_others_and_nothing_else_moves() -> None:
    shards = shards_of(("s", 9))
    three = [NodeSlot("a"), NodeSlot("b"), NodeSlot("c")]
    before = place(shards, three, {})
    after = place(shards, three[:2], before)  # c's lease expired
    changed = moves(before, after)
    assert {old for old, _new in changed.values()} == {"c"}
    assert len(changed) == 3
    assert sorted(Counter(after.values()).values()) == [4, 5]


def test_a_joining_node_takes_only_its_share() -> None:
    shards = shards_of(("s", 12))
    before = place(shards, [NodeSlot("a"), NodeSlot("b")], {})
    after = place(shards, [NodeSlot("a"), NodeSlot("b"), NodeSlot("c")], before)
    changed = moves(before, after)
    assert len(changed) == 4 and all(new == "c" for _old, new in changed.values())


def test_a_draining_node_gives_up_every_shard() -> None:
    shards = shards_of(("s", 6))
    nodes = [NodeSlot("a"), NodeSlot("b"), NodeSlot("c")]
    before = place(shards, nodes, {})
    after = place(shards, [NodeSlot("a"), NodeSlot("b"), NodeSlot("c", draining=True)], before)
    assert "c" not in after.values() and len(after) == 6
    assert all(old == "c" for old, _new in moves(before, after).values())


def test_no_node_to_take_shards_places_nothing() -> None:
    assert place(shards_of(("s", 3)), [NodeSlot("a", draining=True)], {}) == {}


def test_racks_spread_each_logstore() -> None:
    nodes = [NodeSlot("a1", "r1"), NodeSlot("a2", "r1"), NodeSlot("b1", "r2"), NodeSlot("b2", "r2")]
    placement = place(shards_of(("x", 4), ("y", 2)), nodes, {})
    rack = {n.node_id: n.rack for n in nodes}
    for logstore, count in (("x", 4), ("y", 2)):
        per_rack = Counter(rack[placement[("p", logstore, i)]] for i in range(count))
        assert sorted(per_rack.values()) == [count // 2, count // 2], (logstore, per_rack)


node_ids = st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=8, unique=True)


@given(
    shard_count=st.integers(0, 60),
    before_ids=node_ids,
    after_ids=node_ids,
    racks=st.integers(1, 3),
    draining=st.sets(st.sampled_from("abcdefgh")),
)
def test_placement_rules_hold_for_any_change(
    shard_count: int, before_ids: list[str], after_ids: list[str], racks: int, draining: set[str]
) -> None:
    shards = shards_of(("s", shard_count // 2), ("t", shard_count - shard_count // 2))
    rack_of = {n: f"r{ord(n) % racks}" for n in "abcdefgh"}
    before = place(shards, [NodeSlot(n, rack_of[n]) for n in before_ids], {})
    nodes = [NodeSlot(n, rack_of[n], draining=n in draining) for n in after_ids]
    after = place(shards, nodes, before)
    takers = {n.node_id for n in nodes if not n.draining}
    if not takers:
        assert after == {}
        return
    # rule 1: every shard placed, only on nodes that take shards
    assert set(after) == set(shards) and set(after.values()) <= takers
    # rule 2: even counts
    counts = Counter({n: 0 for n in takers}) + Counter(after.values())
    counts.update({n: 0 for n in takers})
    assert max(counts.values()) - min(counts.values()) <= 1
    # rule 3: a shard on a node that may keep it and is not over its share stays
    floor = len(shards) // len(takers)
    kept_before = Counter(owner for owner in before.values() if owner in takers)
    for shard, owner in before.items():
        if owner in takers and kept_before[owner] <= floor:
            assert after[shard] == owner
    # and placing again changes nothing
    assert place(shards, nodes, after) == after


def test_groups_spread_over_the_nodes_and_a_join_moves_few_of_them() -> None:
    nodes = [NodeSlot(f"n{i}") for i in range(3)]
    groups = [f"p/logs/g{i}" for i in range(300)]
    chosen = {g: group_coordinator(g, nodes) for g in groups}
    assert all(80 <= count <= 120 for count in Counter(chosen.values()).values())
    joined = {g: group_coordinator(g, [*nodes, NodeSlot("n3")]) for g in groups}
    moved = [g for g in groups if joined[g] != chosen[g]]
    assert all(joined[g] == "n3" for g in moved), "a join only takes groups, to itself"
    assert 50 <= len(moved) <= 100


def test_a_draining_node_coordinates_no_new_group_and_no_node_means_none() -> None:
    nodes = [NodeSlot("n0", draining=True), NodeSlot("n1")]
    assert {group_coordinator(f"g{i}", nodes) for i in range(20)} == {"n1"}
    assert group_coordinator("g", [NodeSlot("n0", draining=True)]) is None
    assert group_coordinator("g", []) is None


# --- replica sets (``place_replicas``) ------------------------------------------------------


def test_replicas_go_to_distinct_nodes_on_distinct_racks_and_leaders_spread() -> None:
    nodes = [NodeSlot("a", "r1"), NodeSlot("b", "r1"), NodeSlot("c", "r2"), NodeSlot("d", "r3")]
    placed = place_replicas(shards_of(("s", 8)), nodes, {}, 3)
    racks = {n.node_id: n.rack for n in nodes}
    for replicas in placed.values():
        assert len(set(replicas)) == 3
        assert {racks[r] for r in replicas} == {"r1", "r2", "r3"}
    leaders = Counter(replicas[0] for replicas in placed.values())
    assert max(leaders.values()) - min(leaders.values()) <= 1 and len(leaders) == 4
    copies = Counter(r for replicas in placed.values() for r in replicas)
    assert copies["c"] == copies["d"] == 8  # the only nodes of their racks


def test_placed_replica_sets_stay_and_drainers_take_none() -> None:
    nodes = [NodeSlot("a"), NodeSlot("b"), NodeSlot("c"), NodeSlot("d", draining=True)]
    current = {("p", "s", 0): ("d", "a", "b")}
    placed = place_replicas(shards_of(("s", 3)), nodes, current, 3)
    assert ("p", "s", 0) not in placed  # moving a replica set is a reassignment
    assert all("d" not in replicas for replicas in placed.values())


def test_no_shard_is_placed_under_replicated() -> None:
    nodes = [NodeSlot("a"), NodeSlot("b"), NodeSlot("c", draining=True)]
    assert place_replicas(shards_of(("s", 2)), nodes, {}, 3) == {}
    assert len(place_replicas(shards_of(("s", 2)), nodes, {}, 2)) == 2
