"""ConsumerGroup's quiet heartbeat: a settled group answers without replanning, and the
shortcut gives exactly what the full round would have given."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

import loghub.coordination.group as group_module
from loghub.coordination.group import ConsumerGroup, ShardView

TIMEOUT_MS = 2000


def test_a_quiet_heartbeat_of_a_settled_group_plans_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shards = tuple(ShardView(i, (), False) for i in range(100))
    g = ConsumerGroup("g", TIMEOUT_MS, False, now_ms=0)
    held: dict[str, list[int]] = {f"c{i}": [] for i in range(10)}
    for step in range(6):
        for name in held:
            held[name] = g.heartbeat(name, held[name], shards, step)
    assert sorted(s for h in held.values() for s in h) == list(range(100))
    plans: list[object] = []
    real_plan_moves = group_module.plan_moves

    def counting_plan_moves(*args: object, **kwargs: object) -> dict[int, str]:
        plans.append(args)
        return real_plan_moves(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(group_module, "plan_moves", counting_plan_moves)
    version = g.version
    for name in held:
        assert g.heartbeat(name, held[name], shards, 10) == held[name]
    assert plans == [], "a settled group's heartbeat does not rebuild the assignment"
    assert g.version == version
    g.heartbeat("c0", held["c0"][1:], shards, 11)  # c0 lets one go: a real round again
    assert len(plans) == 1


# One step of a random history: (consumer, what it reports, ms to advance, shard finished).
_STEP = st.tuples(
    st.integers(0, 4),
    st.sampled_from(["reply", "reply", "reply", "nothing", "subset", "other"]),
    st.sampled_from([0, 1, 300, 2500]),
    st.one_of(st.none(), st.integers(0, 11)),
)


def _full_round_twin(g: ConsumerGroup) -> ConsumerGroup:
    """A copy of the group that has forgotten every quiet round, so that its next heartbeat
    runs the whole round: the reference the shortcut must agree with."""
    twin = copy.deepcopy(g)
    for entry in twin._consumers.values():
        entry.quiet_version = -1
    return twin


@settings(max_examples=examples(300), deadline=None)
@given(st.booleans(), st.lists(_STEP, min_size=1, max_size=60))
def test_a_quiet_heartbeat_answers_what_the_full_round_would(
    recovering: bool, steps: list[tuple[int, str, int, int | None]]
) -> None:
    g = ConsumerGroup("g", TIMEOUT_MS, False, now_ms=0, recovering=recovering)
    finished: set[int] = set()
    replies: dict[str, list[int]] = {}
    now_ms = 0
    for index, kind, advance_ms, finish in steps:
        name = f"c{index}"
        now_ms += advance_ms
        if finish is not None:
            finished.add(finish)
        shards = [ShardView(i, (), i in finished) for i in range(12)]
        last = replies.get(name, [])
        held = {
            "reply": last,
            "nothing": [],
            "subset": last[: len(last) // 2],
            "other": replies.get(f"c{(index + 1) % 5}", []),
        }[kind]
        twin = _full_round_twin(g)
        reply = g.heartbeat(name, held, shards, now_ms)
        assert reply == twin.heartbeat(name, held, shards, now_ms)
        assert g.shard_states() == twin.shard_states()
        assert g.assignments() == twin.assignments()
        replies[name] = reply
