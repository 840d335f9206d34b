"""The logstore's shards as a worker sees them: the list, each read-only shard's end, and
which shards may be consumed now.

A worker must know where a read-only shard ends to notice that it has read all of it (the
pull's next cursor equals the end) and release it, so that the shard's children can start.
LogHub lists the end cursor (``ShardInfo.end_cursor``); the hosted service does not, and then
``get_cursor(shard, "end")`` is asked once per read-only shard: a read-only shard's end never
moves.

``consumable_shards`` is the lease mode's ordering rule (in server mode the server applies
it): a shard is consumable unless it is finished, and, in an ordered group, unless one of
its ancestors is not finished yet. A shard is *finished* when it is read-only and its
checkpoint is its end. Ancestors missing from the list (deleted by retention) count as
finished. Lineage comes from LogHub's shard list; the hosted service reports none, so there
an ordered lease group behaves as an unordered one.

Thread-safety: ``ShardDirectory`` belongs to one thread (the coordination thread); the pure
functions are safe anywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set

from loghub.client import LogHubClient, ShardInfo

__all__ = ["ShardDirectory", "consumable_shards", "finished_shards"]


class ShardDirectory:
    """Lists a logstore's shards, filling in the end cursor of read-only shards."""

    def __init__(self, client: LogHubClient, project: str, logstore: str) -> None:
        self._client = client
        self._project = project
        self._logstore = logstore
        self._ends: dict[int, str] = {}  # asked once per read-only shard

    def refresh(self) -> dict[int, ShardInfo]:
        """Every shard by id; raises what the client raises."""
        shards = {}
        for info in self._client.list_shards(self._project, self._logstore):
            if not info.writable and info.end_cursor is None:
                end = self._ends.get(info.shard_id)
                if end is None:
                    end = self._client.get_cursor(
                        self._project, self._logstore, info.shard_id, "end"
                    )
                    self._ends[info.shard_id] = end
                info = dataclasses.replace(info, end_cursor=end)
            shards[info.shard_id] = info
        for gone in self._ends.keys() - shards.keys():
            del self._ends[gone]
        return shards


def finished_shards(shards: Mapping[int, ShardInfo], checkpoints: Mapping[int, str]) -> set[int]:
    """Read-only shards whose checkpoint is their end."""
    return {
        shard_id
        for shard_id, info in shards.items()
        if not info.writable
        and info.end_cursor is not None
        and checkpoints.get(shard_id) == info.end_cursor
    }


def consumable_shards(
    shards: Mapping[int, ShardInfo], finished: Set[int], ordered: bool
) -> set[int]:
    """The shards a worker may ask for now: not finished, and in an ordered group every
    ancestor finished (for one hash key, a child's data comes after all of its parents')."""
    if not ordered:
        return {shard_id for shard_id in shards if shard_id not in finished}
    blocked: dict[int, bool] = {}  # some ancestor is not finished yet
    for shard_id in _parents_first(shards):
        blocked[shard_id] = any(
            parent not in finished or blocked[parent]
            for parent in shards[shard_id].parents
            if parent in shards  # a parent deleted by retention has nothing left to wait for
        )
    # a shard caught in a lineage cycle (never from a sane server) is never visited: blocked
    return {s for s in shards if s not in finished and not blocked.get(s, True)}


def _parents_first(shards: Mapping[int, ShardInfo]) -> list[int]:
    """Shard ids with every listed parent before its children (Kahn's algorithm, by id)."""
    waiting = {s: {p for p in info.parents if p in shards} for s, info in shards.items()}
    children: dict[int, list[int]] = {}
    for shard_id, parents in waiting.items():
        for parent in parents:
            children.setdefault(parent, []).append(shard_id)
    ready = sorted(shard_id for shard_id, parents in waiting.items() if not parents)
    order: list[int] = []
    while ready:
        shard_id = ready.pop()
        order.append(shard_id)
        for child in children.get(shard_id, ()):
            waiting[child].discard(shard_id)
            if not waiting[child]:
                ready.append(child)
    return order
