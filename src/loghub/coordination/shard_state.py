"""The server-side life cycle of one shard inside one consumer group.

A consumer group must never let two consumers read a shard at once, and in an ordered group
must not let a child start before its ancestors are fully read. Writing the life cycle down as
an explicit state machine, with the valid previous states of every state in one table, turns
a wrong move into an immediate ``IllegalTransition`` instead of a silent duplicate delivery.
The numbers are the transitions of ``spec/consumer-groups.md``::

                 ┌───────────────────── 7 reopened ───────────────────────┐
                 v                                                        │
  new ──1──> NOT_ALLOC ──────────3 granted──────────> ALREADY_ALLOC ──8──> OVER
   │           ^  ^  ^                                  │    │    ^      (read-only and
   │           │  │  └──────4 holder timed out──────────┘    │    │       read to the end)
   │           │  │                                          5    6
   1 ordered,  │  │                             holder has   │    │  holder let go: the next
   an ancestor │  │                             too many     v    │  consumer holds it; or the
   not over    │  └───────────9 holder timed out────────── TRANSFER   next timed out: back to
   v           │                                                       the old holder
  WAIT ───2────┘ every ancestor over

Besides the spec's diagram, this table also allows three moves the spec's rules imply:
``not_alloc → over`` and ``transfer → over`` (a read-only shard whose checkpoint reaches its
end is over whoever holds it, "even if it never held any data"), and ``transfer → transfer``
(a rebalance picks another next consumer before the hand-off happened; the shard was never
given to the first one, so nothing is lost).

Not thread-safe: a ``ShardSlot`` belongs to one ``ConsumerGroup``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from loghub.errors import IllegalTransition

__all__ = ["ENTRY_STATES", "PREVIOUS_STATES", "ShardSlot", "ShardState"]


class ShardState(Enum):
    NOT_ALLOC = "not_alloc"  # consumable, held by nobody
    ALREADY_ALLOC = "already_alloc"  # held and consumed by one consumer
    TRANSFER = "transfer"  # being handed from its holder to a named next consumer
    WAIT = "wait"  # ordered group: an ancestor still has unread data
    OVER = "over"  # read-only and fully consumed


#: The states a shard may enter the group in (transition 1).
ENTRY_STATES: frozenset[ShardState] = frozenset({ShardState.NOT_ALLOC, ShardState.WAIT})

#: For each state, the states a shard may come from.
PREVIOUS_STATES: dict[ShardState, frozenset[ShardState]] = {
    ShardState.NOT_ALLOC: frozenset(
        {ShardState.WAIT, ShardState.ALREADY_ALLOC, ShardState.TRANSFER, ShardState.OVER}
    ),
    ShardState.ALREADY_ALLOC: frozenset({ShardState.NOT_ALLOC, ShardState.TRANSFER}),
    ShardState.TRANSFER: frozenset({ShardState.ALREADY_ALLOC, ShardState.TRANSFER}),
    ShardState.WAIT: frozenset(),
    ShardState.OVER: frozenset(
        {ShardState.NOT_ALLOC, ShardState.ALREADY_ALLOC, ShardState.TRANSFER}
    ),
}


@dataclass
class ShardSlot:
    """One shard's state in one group, with who holds it and who receives it next.

    ``holder`` is set in ``already_alloc`` and ``transfer`` (in ``transfer`` it is the old
    holder, who must let go first); ``next_consumer`` only in ``transfer``.
    """

    shard_id: int
    state: ShardState
    holder: str | None = None
    next_consumer: str | None = None

    def __post_init__(self) -> None:
        self._check()

    @classmethod
    def enter(cls, shard_id: int, state: ShardState) -> ShardSlot:
        """A shard newly seen by the group (transition 1)."""
        if state not in ENTRY_STATES:
            raise IllegalTransition(f"shard {shard_id} cannot enter a group as {state.value}")
        return cls(shard_id, state)

    def transition_to(
        self, state: ShardState, *, holder: str | None = None, next_consumer: str | None = None
    ) -> None:
        """Move to ``state``; raises ``IllegalTransition`` when the table does not allow it."""
        if self.state not in PREVIOUS_STATES[state]:
            raise IllegalTransition(
                f"shard {self.shard_id}: {self.state.value} -> {state.value} is not allowed"
            )
        self.state = state
        self.holder = holder
        self.next_consumer = next_consumer
        self._check()

    def _check(self) -> None:
        if self.state is ShardState.ALREADY_ALLOC:
            assert self.holder is not None, f"shard {self.shard_id}: already_alloc needs a holder"
            assert self.next_consumer is None, f"shard {self.shard_id}: already_alloc, next set"
        elif self.state is ShardState.TRANSFER:
            assert self.holder is not None, f"shard {self.shard_id}: transfer needs a holder"
            assert self.next_consumer is not None, f"shard {self.shard_id}: transfer needs next"
            assert self.holder != self.next_consumer, f"shard {self.shard_id}: transfer to self"
        else:
            assert self.holder is None and self.next_consumer is None, (
                f"shard {self.shard_id}: {self.state.value} has no holder and no next consumer"
            )
