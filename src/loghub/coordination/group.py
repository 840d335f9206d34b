"""A server-side consumer group: heartbeats in, assignments out.

The official SDK's ``ConsumerWorker`` tells the server only which shards it holds; the server
answers which it should hold (``spec/consumer-groups.md``). Everything that keeps a shard
from being read by two consumers at once lives here, as a pure function of the heartbeats
and the time passed in, so that a deterministic simulation (``loghub.testing.group_sim``)
can drive it through crashes, pauses, lost heartbeats, splits and merges:

- A consumer *claims* a shard while it reports it, or while the last reply the server sent
  it lists it (the reply may still be on its way, so the consumer may be about to start
  it). A shard is given to a consumer, by a grant or at the end of a hand-off, only when no
  other live consumer claims it.
- A holder with too many shards has some moved to ``transfer``: its reply omits them (its cue
  to save its checkpoint and let go), and the next consumer receives them only once the
  holder no longer claims them.
- A consumer silent for longer than the timeout is gone. The SDK gives up its shards on its
  own once it has not heartbeated successfully for that long, measured from the send time, so
  it has stopped before the server hands its shards on.
- A consumer that reported shards and was granted some, and now reports none, has let go of
  them all (the SDK reports every shard granted until it has stopped it): it is leaving, so
  it is removed at once, as if silent for the timeout, and its shards go to the others at
  their next heartbeat. A consumer that heartbeats again afterwards joins anew. (An empty
  report after an empty one is a consumer that never received its grant: it keeps it.)
- After a server restart (``recovering=True``) the assignments are lost. For one timeout the
  group only adopts what consumers report, and grants nothing new: by then every live
  consumer has reported what it holds, or has given it up.
- In a cluster the assignment is saved before any reply that depends on it, so a new
  coordinator ``restore``s it instead: each holder keeps its shards, as if it had just
  heartbeated (and it has a full timeout to do so, or it loses them as usual).

Limits: ``consumers_per_group_max`` consumers, ``shards_per_group_max`` shards,
``consumer_name_chars_max`` characters of name, a timeout of 1 ms to ``timeout_ms_max``;
beyond them the call raises ``ParameterInvalid`` (a heartbeat refused so registers nothing).

Not thread-safe: the server serialises the calls for one group.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from loghub.coordination.balance import plan_moves
from loghub.coordination.shard_state import ShardSlot, ShardState
from loghub.errors import ParameterInvalid

__all__ = [
    "ConsumerGroup",
    "GroupStatistics",
    "ShardView",
    "consumer_name_chars_max",
    "consumers_per_group_max",
    "shards_per_group_max",
    "timeout_ms_max",
]

consumers_per_group_max = 1000
consumer_name_chars_max = 128
shards_per_group_max = 4096  # as many as a logstore may have (shard_ids_per_logstore_max)
timeout_ms_max = 86_400_000  # one day

# a tuple, not a set: `in` compares by identity first, without hashing the enum
_BALANCED = (ShardState.NOT_ALLOC, ShardState.ALREADY_ALLOC, ShardState.TRANSFER)


@dataclass(frozen=True)
class ShardView:
    """What the group needs to know of a shard, computed by the caller on each heartbeat.

    ``finished``: read-only and fully consumed by this group (its checkpoint is at its end,
    or there is no data after the checkpoint, or it is empty). A parent that is not in the
    shard list any more (deleted by retention) counts as over.
    """

    shard_id: int
    parents: tuple[int, ...]
    finished: bool


@dataclass(frozen=True)
class GroupStatistics:
    consumers: int
    shards: int
    not_alloc: int
    already_alloc: int
    transfer: int
    wait: int
    over: int
    recovering: bool


@dataclass
class _Consumer:
    last_seen_ms: int
    reported: frozenset[int] = frozenset()
    last_reply: frozenset[int] = frozenset()
    # the group's version after this consumer's last round, when that round changed nothing
    # (-1 otherwise), and whether it balanced: see ``ConsumerGroup.heartbeat``
    quiet_version: int = -1
    quiet_balancing: bool = False


class ConsumerGroup:
    """One consumer group of one logstore. See the module docstring for the rules."""

    def __init__(
        self, name: str, timeout_ms: int, ordered: bool, now_ms: int, recovering: bool = False
    ) -> None:
        _check_timeout(timeout_ms)
        self.name = name
        self._timeout_ms = timeout_ms
        self._ordered = ordered
        self._recovering_until_ms = now_ms + timeout_ms if recovering else now_ms
        self._now_ms = now_ms
        self._consumers: dict[str, _Consumer] = {}
        self._slots: dict[int, ShardSlot] = {}
        self._lineage: tuple[tuple[int, tuple[int, ...]], ...] = ()
        self._order: list[int] = []
        self._synced: tuple[ShardView, ...] | None = None
        self._version = 0
        # shard -> holder loaded by ``restore``, applied as the shards enter (``_sync``)
        self._restored: dict[int, str] = {}

    @property
    def version(self) -> int:
        """Changes whenever anything a heartbeat round reads may have changed: the consumers,
        what they report or were told, the shards' states, the shard set, the settings.
        Equal versions mean equal assignments, so a caller can skip recomputing its view."""
        return self._version

    @property
    def timeout_ms(self) -> int:
        return self._timeout_ms

    @property
    def ordered(self) -> bool:
        return self._ordered

    def update(
        self, now_ms: int, *, timeout_ms: int | None = None, ordered: bool | None = None
    ) -> None:
        """Change the timeout (a shorter one takes effect at once) or the order flag.

        Order true → false frees every waiting shard; false → true applies only to shards
        that appear afterwards.
        """
        if timeout_ms is not None:
            _check_timeout(timeout_ms)
            self._timeout_ms = timeout_ms
        if ordered is not None:
            if self._ordered and not ordered:
                for slot in self._slots.values():
                    if slot.state is ShardState.WAIT:
                        slot.transition_to(ShardState.NOT_ALLOC)
            self._ordered = ordered
            self._synced = None
        self._version += 1
        self.expire(now_ms)

    def heartbeat(
        self, consumer: str, held: Iterable[int], shards: Sequence[ShardView], now_ms: int
    ) -> list[int]:
        """One heartbeat from ``consumer`` holding ``held``; returns the shards it should hold.

        ``shards`` is every shard of the logstore now. The whole round runs here: expire
        silent consumers, register or refresh this one, follow the shard set, adopt reported
        shards nobody else claims, balance, finish hand-offs.
        """
        _check_consumer_name(consumer)
        reported = frozenset(held)
        if not all(isinstance(shard_id, int) for shard_id in reported):
            raise ParameterInvalid("a heartbeat lists shard ids (integers)")
        if len(reported) > shards_per_group_max:
            raise ParameterInvalid(f"a heartbeat lists at most {shards_per_group_max} shards")
        if len(shards) > shards_per_group_max:
            raise ParameterInvalid(f"a consumer group spans at most {shards_per_group_max} shards")
        self.expire(now_ms)
        entry = self._consumers.get(consumer)
        if entry is not None and not reported and entry.reported and entry.last_reply:
            self._remove({consumer})  # a leave: see the module docstring
            return []
        if entry is None:
            if len(self._consumers) >= consumers_per_group_max:
                raise ParameterInvalid(
                    f"consumer group {self.name} has {consumers_per_group_max} consumers already"
                )
            entry = self._consumers[consumer] = _Consumer(now_ms)
            self._version += 1
        entry.last_seen_ms = now_ms
        balancing = now_ms >= self._recovering_until_ms
        if (
            entry.quiet_version == self._version
            and entry.quiet_balancing == balancing
            and reported == entry.reported
            and (shards is self._synced or tuple(shards) == self._synced)
        ):
            # Nothing a round reads has changed since this consumer's last round, and that
            # round changed nothing: a round now would start from the same state with the
            # same inputs, so it would change nothing and give the same reply. This is the
            # steady state of a settled group, and it costs O(held), not O(shards).
            return sorted(entry.last_reply)
        if reported != entry.reported:
            entry.reported = reported
            self._version += 1
        version_before = self._version
        self._sync(shards)
        claims = self._claims()
        self._adopt(claims)
        if balancing:
            self._balance(claims)
        self._complete_transfers(claims)
        reply = sorted(
            shard_id
            for shard_id, slot in self._slots.items()
            if slot.state is ShardState.ALREADY_ALLOC and slot.holder == consumer
        )
        if entry.last_reply != frozenset(reply):
            entry.last_reply = frozenset(reply)
            self._version += 1
        changed = self._version != version_before
        entry.quiet_version = -1 if changed else self._version
        entry.quiet_balancing = balancing
        return reply

    def restore(self, owners: Mapping[int, str], shards: Sequence[ShardView], now_ms: int) -> None:
        """Takes over a saved assignment (shard -> holder) in a group that has seen no
        heartbeat yet, with ``shards`` every shard of the logstore now. Each holder is a
        consumer last seen now and last told it holds its shards, so nobody else is given
        them, and its next heartbeat keeps them. A holder that does not heartbeat within
        the timeout loses them, as any silent consumer.

        A shard that was being handed over comes back to its holder (the saved owner is the
        holder until the hand-off ends); the next round plans the move again. A shard that
        no longer exists, or that waits for its parents, is not restored."""
        assert not self._consumers and not self._slots, "restore only into a new group"
        for shard_id, consumer in owners.items():
            _check_consumer_name(consumer)
            entry = self._consumers.get(consumer)
            if entry is None:
                if len(self._consumers) >= consumers_per_group_max:
                    break
                entry = self._consumers[consumer] = _Consumer(now_ms)
            entry.last_reply = entry.last_reply | {shard_id}
            self._restored[shard_id] = consumer
        self._now_ms = max(self._now_ms, now_ms)
        self._recovering_until_ms = min(self._recovering_until_ms, now_ms)
        self._version += 1
        self._sync(shards)  # the holders hold their shards from now: checkpoints, describe

    def can_checkpoint(self, consumer: str, shard_id: int) -> bool:
        """Fencing for a checkpoint update that is not forced: only the shard's holder may
        write (in ``transfer``, the old holder, who must still save its final checkpoint)."""
        slot = self._slots.get(shard_id)
        return (
            slot is not None
            and slot.state in (ShardState.ALREADY_ALLOC, ShardState.TRANSFER)
            and slot.holder == consumer
        )

    def expire(self, now_ms: int) -> list[str]:
        """Remove the consumers silent for longer than the timeout; returns their names.

        Their shards go back to the pool; a hand-off to one of them goes back to the old
        holder.
        """
        assert now_ms >= self._now_ms, "time never goes back"
        self._now_ms = now_ms
        gone = {
            name
            for name, entry in self._consumers.items()
            if now_ms - entry.last_seen_ms > self._timeout_ms
        }
        if gone:
            self._remove(gone)
        return sorted(gone)

    def _remove(self, gone: set[str]) -> None:
        """Their shards go back to the pool; a hand-off to one of them goes back to the old
        holder."""
        self._version += 1
        for name in gone:
            del self._consumers[name]
        for slot in self._slots.values():
            if slot.state is ShardState.ALREADY_ALLOC and slot.holder in gone:
                slot.transition_to(ShardState.NOT_ALLOC)  # 4
            elif slot.state is ShardState.TRANSFER and slot.holder in gone:
                slot.transition_to(ShardState.NOT_ALLOC)  # 9
            elif slot.state is ShardState.TRANSFER and slot.next_consumer in gone:
                slot.transition_to(ShardState.ALREADY_ALLOC, holder=slot.holder)  # 6, back

    def assignments(self) -> dict[str, list[int]]:
        """Each live consumer's granted shards (``already_alloc``), sorted."""
        granted: dict[str, list[int]] = {name: [] for name in sorted(self._consumers)}
        for shard_id in sorted(self._slots):
            slot = self._slots[shard_id]
            if slot.state is ShardState.ALREADY_ALLOC and slot.holder is not None:
                granted[slot.holder].append(shard_id)
        return granted

    def owners(self) -> dict[int, str]:
        """Who holds each held shard: the holder while ``already_alloc``, and during a
        ``transfer`` still the old holder (it consumes until it lets go). What the SDK's
        checkpoint "consumer" field shows."""
        return {
            shard_id: slot.holder
            for shard_id, slot in sorted(self._slots.items())
            if slot.state in (ShardState.ALREADY_ALLOC, ShardState.TRANSFER)
            and slot.holder is not None
        }

    def shard_states(self) -> dict[int, ShardState]:
        return {shard_id: self._slots[shard_id].state for shard_id in sorted(self._slots)}

    def statistics(self) -> GroupStatistics:
        count = dict.fromkeys(ShardState, 0)
        for slot in self._slots.values():
            count[slot.state] += 1
        return GroupStatistics(
            consumers=len(self._consumers),
            shards=len(self._slots),
            not_alloc=count[ShardState.NOT_ALLOC],
            already_alloc=count[ShardState.ALREADY_ALLOC],
            transfer=count[ShardState.TRANSFER],
            wait=count[ShardState.WAIT],
            over=count[ShardState.OVER],
            recovering=self._now_ms < self._recovering_until_ms,
        )

    def _sync(self, shards: Sequence[ShardView]) -> None:
        """Follow the shard set: drop vanished shards, enter new ones (1), release waiting
        ones whose ancestors are all over (2), close finished ones (8), reopen ones that are
        not finished any more (7). Parents first, so a child sees its parents' new state."""
        snapshot = tuple(shards)
        if snapshot == self._synced:
            return  # a second pass over the same shards changes nothing
        self._synced = snapshot
        self._version += 1
        views = {view.shard_id: view for view in shards}
        assert len(views) == len(shards), "shard ids are unique"
        for shard_id in [s for s in self._slots if s not in views]:
            del self._slots[shard_id]
        ancestor_open: dict[int, bool] = {}  # an ancestor is not over yet
        for shard_id in self._topological_order(shards, views):
            view = views[shard_id]
            ancestor_open[shard_id] = any(
                self._slots[parent].state is not ShardState.OVER or ancestor_open[parent]
                for parent in view.parents
                if parent in views
            )
            slot = self._slots.get(shard_id)
            if slot is None:
                waits = self._ordered and ancestor_open[shard_id]
                state = ShardState.WAIT if waits else ShardState.NOT_ALLOC
                slot = self._slots[shard_id] = ShardSlot.enter(shard_id, state)
                holder = self._restored.get(shard_id)
                if state is ShardState.NOT_ALLOC and holder in self._consumers:
                    slot.transition_to(ShardState.ALREADY_ALLOC, holder=holder)  # 3
            if slot.state is ShardState.WAIT and not ancestor_open[shard_id]:
                slot.transition_to(ShardState.NOT_ALLOC)
            if view.finished and slot.state in _BALANCED:
                slot.transition_to(ShardState.OVER)
            elif not view.finished and slot.state is ShardState.OVER:
                slot.transition_to(ShardState.NOT_ALLOC)
        if self._restored:
            # a restored holder's claim on a shard that did not come back is dropped
            for name, entry in self._consumers.items():
                kept = frozenset(s for s in entry.last_reply if s in self._slots
                                 and self._slots[s].holder == name)  # fmt: skip
                entry.last_reply = kept
            self._restored = {}

    def _topological_order(
        self, shards: Sequence[ShardView], views: dict[int, ShardView]
    ) -> list[int]:
        """Shard ids, parents before children (ties by id); cached while the lineage holds."""
        lineage = tuple((view.shard_id, view.parents) for view in shards)
        if lineage == self._lineage:
            return self._order
        waiting = {
            view.shard_id: sum(1 for p in set(view.parents) if p in views) for view in shards
        }
        children: dict[int, list[int]] = {}
        for view in shards:
            for parent in set(view.parents):
                if parent in views:
                    children.setdefault(parent, []).append(view.shard_id)
        ready = [shard_id for shard_id, count in waiting.items() if count == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            shard_id = heapq.heappop(ready)
            order.append(shard_id)
            for child in children.get(shard_id, ()):
                waiting[child] -= 1
                if waiting[child] == 0:
                    heapq.heappush(ready, child)
        assert len(order) == len(views), "shard lineage has no cycle"
        self._lineage, self._order = lineage, order
        return order

    def _claims(self) -> dict[int, set[str]]:
        """Shard -> the live consumers that report it or were last told they hold it."""
        claims: dict[int, set[str]] = {}
        for name, entry in self._consumers.items():
            for shard_id in entry.reported | entry.last_reply:
                claims.setdefault(shard_id, set()).add(name)
        return claims

    def _claimed_by_another(
        self, shard_id: int, consumer: str, claims: dict[int, set[str]]
    ) -> bool:
        """The rule that prevents duplicates: never give a shard that someone else may read."""
        return any(name != consumer for name in claims.get(shard_id, ()))

    def _adopt(self, claims: dict[int, set[str]]) -> None:
        """A consumer keeps a free shard it reports (the server never gave it, or forgot it
        in a restart) when no other live consumer claims it."""
        for name, entry in self._consumers.items():
            for shard_id in entry.reported:
                slot = self._slots.get(shard_id)
                if (
                    slot is not None
                    and slot.state is ShardState.NOT_ALLOC
                    and not self._claimed_by_another(shard_id, name, claims)
                ):
                    self._move(slot, ShardState.ALREADY_ALLOC, holder=name)  # 3

    def _balance(self, claims: dict[int, set[str]]) -> None:
        """Plan every needed move at once; a hand-off counts for its next consumer already."""
        holders: dict[int, str | None] = {}
        for shard_id, slot in self._slots.items():
            if slot.state is ShardState.TRANSFER:
                holders[shard_id] = slot.next_consumer
            elif slot.state in _BALANCED:
                holders[shard_id] = slot.holder
        for shard_id, consumer in plan_moves(sorted(self._consumers), holders).items():
            slot = self._slots[shard_id]
            if slot.state is ShardState.NOT_ALLOC:
                if not self._claimed_by_another(shard_id, consumer, claims):
                    self._move(slot, ShardState.ALREADY_ALLOC, holder=consumer)  # 3
            elif slot.holder == consumer:  # a hand-off back to its holder: cancel it
                self._move(slot, ShardState.ALREADY_ALLOC, holder=consumer)  # 6
            else:
                self._move(
                    slot, ShardState.TRANSFER, holder=slot.holder, next_consumer=consumer
                )  # 5

    def _complete_transfers(self, claims: dict[int, set[str]]) -> None:
        for shard_id, slot in self._slots.items():
            if slot.state is ShardState.TRANSFER:
                receiver = slot.next_consumer
                assert receiver is not None
                if not self._claimed_by_another(shard_id, receiver, claims):
                    self._move(slot, ShardState.ALREADY_ALLOC, holder=receiver)  # 6

    def _move(
        self,
        slot: ShardSlot,
        state: ShardState,
        *,
        holder: str | None = None,
        next_consumer: str | None = None,
    ) -> None:
        """A transition inside a round, counted in the version."""
        slot.transition_to(state, holder=holder, next_consumer=next_consumer)
        self._version += 1


def _check_timeout(timeout_ms: int) -> None:
    if not isinstance(timeout_ms, int) or not 1 <= timeout_ms <= timeout_ms_max:
        raise ParameterInvalid(f"timeout must be between 1 ms and {timeout_ms_max} ms")


def _check_consumer_name(consumer: str) -> None:
    if not isinstance(consumer, str) or not 1 <= len(consumer) <= consumer_name_chars_max:
        raise ParameterInvalid(
            f"a consumer name has 1 to {consumer_name_chars_max} characters, got {consumer!r}"
        )
