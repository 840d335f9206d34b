"""The per-shard state machine: every move in the table is allowed, every other one raises."""

from __future__ import annotations

import itertools

import pytest

from loghub.coordination.shard_state import ENTRY_STATES, PREVIOUS_STATES, ShardSlot, ShardState
from loghub.errors import IllegalTransition

S = ShardState


def _slot_in(state: ShardState) -> ShardSlot:
    holder = "a" if state in (S.ALREADY_ALLOC, S.TRANSFER) else None
    following = "b" if state is S.TRANSFER else None
    return ShardSlot(7, state, holder, following)


def _arguments(state: ShardState) -> dict[str, str]:
    if state is S.ALREADY_ALLOC:
        return {"holder": "c"}
    if state is S.TRANSFER:
        return {"holder": "a", "next_consumer": "c"}
    return {}


def test_spec_transitions_are_allowed() -> None:
    spec = [
        (S.WAIT, S.NOT_ALLOC),  # 2
        (S.NOT_ALLOC, S.ALREADY_ALLOC),  # 3
        (S.ALREADY_ALLOC, S.NOT_ALLOC),  # 4
        (S.ALREADY_ALLOC, S.TRANSFER),  # 5
        (S.TRANSFER, S.ALREADY_ALLOC),  # 6
        (S.OVER, S.NOT_ALLOC),  # 7
        (S.ALREADY_ALLOC, S.OVER),  # 8
        (S.TRANSFER, S.NOT_ALLOC),  # 9
    ]
    for before, after in spec:
        slot = _slot_in(before)
        slot.transition_to(after, **_arguments(after))
        assert slot.state is after


@pytest.mark.parametrize(("before", "after"), list(itertools.product(S, S)))
def test_moves_outside_the_table_raise_illegal_transition(
    before: ShardState, after: ShardState
) -> None:
    slot = _slot_in(before)
    if before in PREVIOUS_STATES[after]:
        slot.transition_to(after, **_arguments(after))
        assert slot.state is after
    else:
        with pytest.raises(IllegalTransition):
            slot.transition_to(after, **_arguments(after))
        assert slot.state is before, "a refused move changes nothing"


def test_shards_enter_as_not_alloc_or_wait_only() -> None:
    assert {S.NOT_ALLOC, S.WAIT} == ENTRY_STATES
    assert ShardSlot.enter(1, S.WAIT).state is S.WAIT
    for state in set(S) - ENTRY_STATES:
        with pytest.raises(IllegalTransition):
            ShardSlot.enter(1, state)


def test_wait_is_never_reentered() -> None:
    assert PREVIOUS_STATES[S.WAIT] == frozenset()


def test_invariants_are_asserted() -> None:
    with pytest.raises(AssertionError):
        _slot_in(S.NOT_ALLOC).transition_to(S.ALREADY_ALLOC)  # no holder
    with pytest.raises(AssertionError):
        _slot_in(S.ALREADY_ALLOC).transition_to(S.TRANSFER, holder="a")  # no next consumer
    with pytest.raises(AssertionError):
        _slot_in(S.ALREADY_ALLOC).transition_to(S.TRANSFER, holder="a", next_consumer="a")
    with pytest.raises(AssertionError):
        _slot_in(S.ALREADY_ALLOC).transition_to(S.NOT_ALLOC, holder="a")  # free, yet held
    with pytest.raises(AssertionError):
        ShardSlot(1, S.OVER, holder="a")


def test_state_values_are_the_spec_names() -> None:
    assert [state.value for state in S] == [
        "not_alloc",
        "already_alloc",
        "transfer",
        "wait",
        "over",
    ]
