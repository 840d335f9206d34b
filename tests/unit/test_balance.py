"""Balance: any two consumers differ by at most one, sticky, minimal, one round, deterministic."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from loghub.coordination.balance import loads, plan_moves, targets

NAMES = [f"c{i:02d}" for i in range(12)]


@st.composite
def situations(draw: st.DrawFn) -> tuple[list[str], dict[int, str | None]]:
    consumers = sorted(draw(st.sets(st.sampled_from(NAMES), min_size=1, max_size=8)))
    shard_ids = draw(st.sets(st.integers(0, 200), max_size=60))
    # holders include consumers that are gone (not in the list) and free shards
    candidates = [None, "gone", *consumers]
    holders = {s: draw(st.sampled_from(candidates)) for s in sorted(shard_ids)}
    return consumers, holders


def _apply(holders: dict[int, str | None], moves: dict[int, str]) -> dict[int, str | None]:
    return {**holders, **moves}


@given(situations())
def test_after_the_plan_every_shard_is_held_and_counts_differ_by_at_most_one(
    situation: tuple[list[str], dict[int, str | None]],
) -> None:
    consumers, holders = situation
    after = _apply(holders, plan_moves(consumers, holders))
    assert all(after[s] in consumers for s in after)
    counts = [len(shards) for shards in loads(consumers, after).values()]
    assert max(counts) - min(counts) <= 1
    assert loads(consumers, after) == {
        c: [s for s in sorted(after) if after[s] == c] for c in consumers
    }
    assert {c: len(s) for c, s in loads(consumers, after).items()} == targets(consumers, holders)


@given(situations())
def test_moves_are_minimal_and_sticky(situation: tuple[list[str], dict[int, str | None]]) -> None:
    consumers, holders = situation
    moves = plan_moves(consumers, holders)
    goal = targets(consumers, holders)
    before = loads(consumers, holders)
    for consumer in consumers:
        given_away = [s for s in moves if holders[s] == consumer]
        assert len(given_away) == max(0, len(before[consumer]) - goal[consumer])
        assert all(moves[s] != consumer for s in given_away)
    # a lower bound computed independently: the extra slots go to the most loaded
    base, extra = divmod(len(holders), len(consumers))
    counts = sorted((len(shards) for shards in before.values()), reverse=True)
    least = sum(max(0, n - base - (1 if i < extra else 0)) for i, n in enumerate(counts))
    assert sum(1 for s in moves if holders[s] in consumers) == least
    # no shard moves to the consumer that already holds it
    assert all(holders[s] != consumer for s, consumer in moves.items())


@given(situations())
def test_plans_are_deterministic(situation: tuple[list[str], dict[int, str | None]]) -> None:
    consumers, holders = situation
    shuffled = dict(reversed(list(holders.items())))
    assert plan_moves(consumers, holders) == plan_moves(list(consumers), shuffled)


@given(situations())
def test_a_balanced_assignment_plans_no_move(
    situation: tuple[list[str], dict[int, str | None]],
) -> None:
    consumers, holders = situation
    after = _apply(holders, plan_moves(consumers, holders))
    assert plan_moves(consumers, after) == {}


def test_every_needed_move_is_planned_in_one_round() -> None:
    holders: dict[int, str | None] = dict.fromkeys(range(12), "a")
    moves = plan_moves(["a", "b", "c"], holders)
    assert sorted(moves.values()) == ["b"] * 4 + ["c"] * 4


def test_the_most_loaded_give_first() -> None:
    holders: dict[int, str | None] = {0: "a", 1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "b"}
    # targets 3/2/2 (a keeps the extra one); a gives one, b gives one; c receives two
    moves = plan_moves(["a", "b", "c"], holders)
    assert sorted(moves.values()) == ["c", "c"]
    assert {holders[s] for s in moves} == {"a", "b"}


def test_three_consumers_on_eight_shards_get_three_three_two() -> None:
    holders: dict[int, str | None] = dict.fromkeys(range(8))
    after = _apply(holders, plan_moves(["a", "b", "c"], holders))
    assert sorted(len(s) for s in loads(["a", "b", "c"], after).values()) == [2, 3, 3]


def test_the_hosted_services_choice_of_shards_to_give_away() -> None:
    holders: dict[int, str | None] = dict.fromkeys(range(5), "a")
    assert plan_moves(["a", "b"], holders) == {1: "b", 3: "b"}


def test_no_consumers_means_no_plan() -> None:
    assert plan_moves([], {0: None}) == {}
    assert targets([], {0: None}) == {}
