"""Offsets of the `loghub` source, and how far each micro-batch may read.

An offset is, per shard, the sequence number of the next log group to read, as JSON with
string shard ids (Spark's checkpoint turns integer keys into strings):
``{"0": 1536, "3": 0}``. A micro-batch reads ``[start[s], end[s])`` of every shard ``s``.

``plan_end`` decides ``end`` from ``start`` and the shards as they are now, with three rules:

- A shard the offsets do not know yet (created by a split or merge, or new since the query
  started) first enters at its beginning, reading nothing; it is read from the next batch on.
  So every range a batch reads starts at a position written in the checkpoint, and replaying
  a logged batch after a crash reads exactly the same groups.
- With ``ordered``, a shard whose parents are not read to their end *as of the batch's start*
  reads nothing. Partitions of one batch run in parallel, so a child may start only in a
  batch after the one that finished its parents.
- With a limit (``maxOffsetsPerTrigger``, in log groups), the limit is shared among the shards
  in proportion to their backlog; what rounding leaves goes one group at a time to the
  shards with the most left to read, so a small limit does not starve any shard.

Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loghub.spark.options import Position

__all__ = ["ShardExtent", "allocate", "plan_end", "resolve_position"]

Offsets = dict[str, int]


@dataclass(frozen=True)
class ShardExtent:
    """A shard as the planner sees it: groups ``[begin, end)`` are readable now; a read-only
    shard's ``end`` is final."""

    shard_id: int
    begin: int
    end: int
    read_only: bool = False
    parents: tuple[int, ...] = ()
    at_time: int | None = None  # the position for a `time` Position, when one was asked for
    # host:port of the LogHub cluster node holding the shard's log: where its partitions pull
    # from (planning ignores it)
    node_address: str | None = None

    def __post_init__(self) -> None:
        assert 0 <= self.begin <= self.end, self


def resolve_position(position: Position, shards: Sequence[ShardExtent]) -> Offsets:
    """``position`` in every shard, clamped to what the shard holds."""
    explicit = dict(position.shards)
    offsets: Offsets = {}
    for shard in shards:
        where: int | str
        if position.kind == "shards":
            where = explicit.get(shard.shard_id, position.default)
        elif position.kind == "time":
            assert shard.at_time is not None, shard
            where = shard.at_time
        else:
            where = position.kind
        if where == "earliest":
            offsets[str(shard.shard_id)] = shard.begin
        elif where == "latest":
            offsets[str(shard.shard_id)] = shard.end
        else:
            assert isinstance(where, int)
            offsets[str(shard.shard_id)] = min(max(where, shard.begin), shard.end)
    return offsets


def plan_end(
    start: Mapping[str, int],
    shards: Sequence[ShardExtent],
    *,
    ordered: bool,
    groups_max: int | None = None,
    cap: Mapping[str, int] | None = None,
) -> Offsets:
    """The end of the next batch that starts at ``start`` (see the module docstring).

    ``cap`` (for ``Trigger.AvailableNow``) bounds every shard: no shard reads past its cap, and
    shards without one are neither entered nor read.
    """
    end: Offsets = dict(start)  # shards no longer listed keep their position
    by_id = {shard.shard_id: shard for shard in shards}
    backlog: dict[str, int] = {}
    for shard in shards:
        key = str(shard.shard_id)
        if cap is not None and key not in cap:
            continue
        if key not in start:
            end[key] = shard.begin
            continue
        if ordered and not _parents_done(shard, start, by_id):
            continue
        limit = shard.end if cap is None else min(shard.end, cap[key])
        if limit > start[key]:
            backlog[key] = limit - start[key]
    granted = backlog if groups_max is None else allocate(backlog, groups_max)
    for key, groups in granted.items():
        end[key] = start[key] + groups
    return end


def _parents_done(
    shard: ShardExtent, start: Mapping[str, int], by_id: Mapping[int, ShardExtent]
) -> bool:
    """Whether every parent of ``shard`` was read to its end before ``start``. A parent that
    is no longer listed (expired) counts as done."""
    for parent_id in shard.parents:
        parent = by_id.get(parent_id)
        if parent is None:
            continue
        position = start.get(str(parent_id))
        if not parent.read_only or position is None or position < parent.end:
            return False
    return True


def allocate(backlog: Mapping[str, int], groups_max: int) -> dict[str, int]:
    """At most ``groups_max`` groups shared among shards in proportion to ``backlog`` (each
    shard gets no more than its backlog); deterministic."""
    assert groups_max >= 1, groups_max
    total = sum(backlog.values())
    if total <= groups_max:
        return dict(backlog)
    granted = {key: groups_max * groups // total for key, groups in backlog.items()}
    left = groups_max - sum(granted.values())
    # the shards with the most still unread first; ties by shard id, as numbers
    order = sorted(backlog, key=lambda key: (granted[key] - backlog[key], int(key)))
    for key in order[:left]:
        granted[key] += 1
    assert sum(granted.values()) == groups_max
    return {key: groups for key, groups in granted.items() if groups}
