"""Who should hold what: balanced, sticky targets and the moves that reach them.

Both ways of sharing shards (the server's consumer group and the client-side lease protocol)
need the same answer to one question: given the live consumers and who holds each shard now,
which shards must change hands so that any two consumers hold counts that differ by at most
one? Moving a shard costs a hand-off (the old holder saves its checkpoint and lets go), so
the answer moves as few shards as possible: a consumer keeps everything up to its target,
and the extra slot that an uneven split leaves over goes to the consumers that already hold
the most. Every needed move is planned in one round (a new consumer should not wait one
heartbeat per shard), taking from the most loaded first. The result depends only on the
inputs: ties break by name and shard id, so every server and every simulation agree.

``prefer`` names the consumer that plans for itself (a lease-mode worker's taker round): ties
for the extra slot break in its favour. A worker that has its round
after another's then fills the gap itself, instead of planning it for a worker whose
round is over. Which shards each consumer receives does not depend on ``prefer``, so thieves
planning at once from the same view reach for different shards.

Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["loads", "plan_moves", "targets"]


def loads(consumers: Sequence[str], holders: Mapping[int, str | None]) -> dict[str, list[int]]:
    """Each consumer's shards, sorted; a shard held by someone not in ``consumers`` counts
    for nobody."""
    owned: dict[str, list[int]] = {consumer: [] for consumer in consumers}
    for shard_id in sorted(holders):
        holder = holders[shard_id]
        if holder is not None and holder in owned:
            owned[holder].append(shard_id)
    return owned


def targets(
    consumers: Sequence[str], holders: Mapping[int, str | None], prefer: str | None = None
) -> dict[str, int]:
    """How many shards each consumer should hold: ``len(holders) // len(consumers)``, plus one
    for the ``len(holders) % len(consumers)`` consumers that hold the most now (ties: by name),
    so that the fewest shards move."""
    assert len(set(consumers)) == len(consumers), "consumer names are unique"
    if not consumers:
        return {}
    return _targets(loads(consumers, holders), len(holders), prefer)


def plan_moves(
    consumers: Sequence[str], holders: Mapping[int, str | None], prefer: str | None = None
) -> dict[int, str]:
    """The shards that must change hands, and their new holders.

    ``holders`` maps every shard to balance to its holder (None when nobody holds it).
    The plan covers unheld shards (and shards held by consumers not in ``consumers``) plus,
    from each consumer above its target, its surplus (see ``_surplus``); the most loaded
    give first, and the least loaded receive first. Shards of a consumer at or below its
    target never move. With no consumers there is nothing to plan.
    """
    if not consumers:
        return {}
    assert len(set(consumers)) == len(consumers), "consumer names are unique"
    owned = loads(consumers, holders)
    goal = _targets(owned, len(holders), prefer)
    live = set(consumers)
    pool = [s for s in sorted(holders) if holders[s] is None or holders[s] not in live]
    for consumer in sorted(consumers, key=lambda c: (-len(owned[c]), c)):
        surplus = len(owned[consumer]) - goal[consumer]
        if surplus > 0:
            pool.extend(_surplus(owned[consumer], surplus))
    moves: dict[int, str] = {}
    free = iter(pool)
    for consumer in sorted(consumers, key=lambda c: (len(owned[c]), c)):
        for _ in range(goal[consumer] - len(owned[consumer])):
            moves[next(free)] = consumer
    assert next(free, None) is None, "every planned shard has a new holder"
    return moves


def _targets(owned: dict[str, list[int]], shard_count: int, prefer: str | None) -> dict[str, int]:
    base, extra = divmod(shard_count, len(owned))
    ranked = sorted(owned, key=lambda c: (-len(owned[c]), c != prefer, c))
    return {consumer: base + (1 if rank < extra else 0) for rank, consumer in enumerate(ranked)}


def _surplus(shard_ids: list[int], count: int) -> list[int]:
    """Which ``count`` of a consumer's sorted shards to give away: every other one first, as
    the hosted service does (holding 0-4 and keeping 3, it gives away 1 and 3), then from the
    end."""
    preference = shard_ids[1::2] + shard_ids[0::2][::-1]
    return preference[:count]
