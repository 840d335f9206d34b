"""Which node holds which shard: the controller's placement rule, as a pure function.

``place(shards, nodes, current)`` returns the owner of every writable shard. It is called by
the controller after any change of the node set (a join, a drain, a lease that expired) or
of the shards (a new logstore, a split or merge), with the placement it wrote last; it
returns a new one, and the controller writes what changed. Time, etcd and I/O stay outside,
so the rule is tested on its own and the same inputs always give the same answer.

The rule, in order of what matters:

1. Every shard has an owner while any node can take shards; a node that is draining
   (``loghub node drain``) or gone takes none and keeps none.
2. Counts are even: no node holds more than ``ceil(shards / nodes)``; after the call the
   busiest and the idlest node differ by at most one shard.
3. Few moves: a shard stays where it is unless rule 1 or 2 moves it. Moving a shard costs
   a hand-off (and, with one replica, leaves its older data on the node it left), so a
   join moves only what is needed to even the counts, and a node that comes back does not
   pull its shards back.
4. Racks spread each logstore: among the nodes a shard may go to, the one whose rack holds
   the fewest shards of the same logstore wins (then the idlest node, then the node id), so
   a rack that fails takes the smallest share of any one logstore with it.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["NodeSlot", "ShardRef", "group_coordinator", "moves", "place", "place_replicas"]

# (project, logstore, shard_id)
ShardRef = tuple[str, str, int]


@dataclass(frozen=True)
class NodeSlot:
    """A node as placement sees it."""

    node_id: str
    rack: str = ""
    draining: bool = False


def place(
    shards: Iterable[ShardRef],
    nodes: Sequence[NodeSlot],
    current: Mapping[ShardRef, str],
) -> dict[ShardRef, str]:
    """The owner of each shard (see the module docstring). Shards are left out of the result
    only when no node can take any."""
    ordered = sorted(set(shards))
    takers = sorted((n for n in nodes if not n.draining), key=lambda n: n.node_id)
    if not takers or not ordered:
        return {}
    by_id = {n.node_id: n for n in takers}
    ceiling = -(-len(ordered) // len(takers))
    # exactly len(ordered) % len(takers) nodes may hold `ceiling` (all of them if it divides)
    full_slots = len(ordered) % len(takers) or len(takers)

    placement: dict[ShardRef, str] = {}
    counts: Counter[str] = Counter({n.node_id: 0 for n in takers})
    # per (rack, project, logstore): how many shards of that logstore the rack holds
    rack_load: Counter[tuple[str, str, str]] = Counter()

    def assign(shard: ShardRef, node_id: str) -> None:
        placement[shard] = node_id
        counts[node_id] += 1
        rack_load[(by_id[node_id].rack, shard[0], shard[1])] += 1

    def room(node_id: str) -> bool:
        at_ceiling = sum(1 for c in counts.values() if c >= ceiling)
        if counts[node_id] < ceiling - 1:
            return True
        return counts[node_id] == ceiling - 1 and at_ceiling < full_slots

    # rule 3: keep what may stay, the current owner's oldest shards first
    for shard in ordered:
        owner = current.get(shard)
        if owner in by_id and room(owner):
            assign(shard, owner)
    # rules 1, 2 and 4: the rest go where the counts and the racks say
    for shard in ordered:
        if shard in placement:
            continue
        candidates = [n for n in takers if room(n.node_id)]
        best = min(
            candidates,
            key=lambda n: (rack_load[(n.rack, shard[0], shard[1])], counts[n.node_id], n.node_id),
        )
        assign(shard, best.node_id)
    return placement


def place_replicas(
    shards: Iterable[ShardRef],
    nodes: Sequence[NodeSlot],
    current: Mapping[ShardRef, Sequence[str]],
    replication_factor: int,
) -> dict[ShardRef, tuple[str, ...]]:
    """The replicas of every shard not in ``current`` (those keep theirs: moving a replica
    is a reassignment, which copies data, not a placement decision), the preferred leader
    first. Shards are left out while fewer than ``replication_factor`` nodes can take
    them: a shard never starts under-replicated.

    Each replica goes to the node whose rack holds the fewest replicas of this shard, then
    the fewest of the logstore, then holds the fewest replicas, then by node id; the
    preferred leader is the chosen node that leads the fewest shards. So three replicas
    land on three racks when there are three, and leaders spread like owners do in
    ``place``."""
    assert replication_factor >= 1, replication_factor
    takers = sorted((n for n in nodes if not n.draining), key=lambda n: n.node_id)
    by_id = {n.node_id: n for n in nodes}
    counts: Counter[str] = Counter({n.node_id: 0 for n in takers})
    leads: Counter[str] = Counter({n.node_id: 0 for n in takers})
    rack_load: Counter[tuple[str, str, str]] = Counter()
    for shard, replicas in current.items():
        for position, node_id in enumerate(replicas):
            counts[node_id] += 1
            leads[node_id] += position == 0
            rack = by_id[node_id].rack if node_id in by_id else ""
            rack_load[(rack, shard[0], shard[1])] += 1
    placed: dict[ShardRef, tuple[str, ...]] = {}
    if len(takers) < replication_factor:
        return placed
    for shard in sorted(set(shards) - set(current)):
        chosen: list[NodeSlot] = []
        for _ in range(replication_factor):
            racks_used = Counter(n.rack for n in chosen)
            best = min(
                (n for n in takers if n not in chosen),
                key=lambda n: (
                    racks_used[n.rack],
                    rack_load[(n.rack, shard[0], shard[1])],
                    counts[n.node_id],
                    n.node_id,
                ),
            )
            chosen.append(best)
        leader = min(chosen, key=lambda n: (leads[n.node_id], counts[n.node_id], n.node_id))
        ordered = (leader, *(n for n in chosen if n is not leader))
        for node in ordered:
            counts[node.node_id] += 1
            rack_load[(node.rack, shard[0], shard[1])] += 1
        leads[leader.node_id] += 1
        placed[shard] = tuple(n.node_id for n in ordered)
    return placed


def moves(
    before: Mapping[ShardRef, str], after: Mapping[ShardRef, str]
) -> dict[ShardRef, tuple[str | None, str | None]]:
    """What changed owner: shard -> (old owner or None, new owner or None)."""
    return {
        shard: (before.get(shard), after.get(shard))
        for shard in set(before) | set(after)
        if before.get(shard) != after.get(shard)
    }


def group_coordinator(group: str, nodes: Iterable[NodeSlot]) -> str | None:
    """The node that should coordinate a consumer group when nobody does: the highest
    rendezvous hash of (group, node) among the nodes that are not draining; None when no
    node can take it.

    Why rendezvous hashing: every node computes the same answer from the same node list
    without asking anyone, groups spread evenly over the nodes, and a node that joins or
    leaves changes the choice only for the groups whose best node it is (about 1/n of
    them). The choice matters only while a group has no coordinator: a live coordinator
    keeps its groups (it is sticky), so a join moves no group at all."""
    best: tuple[bytes, str] | None = None
    for node in nodes:
        if node.draining:
            continue
        digest = hashlib.blake2b(f"{group}\0{node.node_id}".encode(), digest_size=8).digest()
        if best is None or (digest, node.node_id) > best:
            best = (digest, node.node_id)
    return best[1] if best is not None else None
