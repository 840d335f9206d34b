"""The rules of logstores and their shards, shared by every metadata store.

The SQL store and the cluster's etcd store keep the same records in different places; what a
logstore looks like in memory (``CachedLogstore``), how a split or a merge changes its shards
(``plan_split``, ``plan_merge``), and the limits on both are written here once.

Pure values and functions; thread-safe.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from itertools import pairwise
from typing import Any, Protocol

from loghub.errors import (
    LogStoreInfoInvalid,
    LogStoreNotExist,
    ParameterInvalid,
    ShardNotExist,
    ShardReadOnly,
)
from loghub.metadata._validate import shards_per_logstore_max
from loghub.metadata.hashing import KEY_SPACE_END, format_hash_key
from loghub.metadata.models import Logstore, LogstoreSpec, Shard

__all__ = [
    "UPDATABLE",
    "CachedLogstore",
    "ShardSealer",
    "check_updatable",
    "close_parents",
    "list_page_size_max",
    "missing_logstore",
    "page",
    "plan_merge",
    "plan_split",
    "plan_succession",
    "reshard",
    "seal",
    "shard_ids_per_logstore_max",
    "spec_of",
    "spec_values",
    "unseal",
]

# The hosted service pages lists at 500 at most; a larger ``size`` is cut to this, and the
# returned total tells the caller there is more.
list_page_size_max = 500
# Shards ever made in one logstore, readonly ones included: bounds lineage and directories.
shard_ids_per_logstore_max = 4096
# Logstore fields update_logstore may change. The shard count changes only by split/merge.
UPDATABLE = frozenset(
    {
        "ttl_days",
        "auto_split",
        "max_split_shard",
        "append_meta",
        "enable_tracking",
        "telemetry_type",
        "mode",
        "extra",
    }
)


class ShardSealer(Protocol):
    """What split and merge need from storage: make a shard's log read-only and learn its
    end sequence (``seal``), or undo that when the metadata change fails (``unseal``)."""

    def seal(self, shard_id: int) -> int: ...

    def unseal(self, shard_id: int) -> None: ...


@dataclass(frozen=True)
class CachedLogstore:
    """A logstore with its shards, indexed for the hot path."""

    logstore: Logstore
    shards: tuple[Shard, ...]  # by shard_id
    by_id: Mapping[int, Shard]
    writable: tuple[Shard, ...]  # read-write shards by begin_key
    writable_begins: tuple[int, ...]

    @classmethod
    def build(cls, logstore: Logstore, shards: Sequence[Shard]) -> CachedLogstore:
        ordered = tuple(sorted(shards, key=lambda s: s.shard_id))
        writable = tuple(
            sorted((s for s in ordered if s.status == "readwrite"), key=lambda s: s.begin_key)
        )
        # The read-write shards tile the key space: every key has exactly one writer.
        assert writable and writable[0].begin_key == 0, logstore
        assert writable[-1].end_key == KEY_SPACE_END, logstore
        assert all(a.end_key == b.begin_key for a, b in pairwise(writable)), logstore
        return cls(
            logstore=replace(logstore, shard_count=len(writable)),
            shards=ordered,
            by_id={s.shard_id: s for s in ordered},
            writable=writable,
            writable_begins=tuple(s.begin_key for s in writable),
        )

    def shard(self, shard_id: int) -> Shard:
        shard = self.by_id.get(shard_id)
        if shard is None:
            raise ShardNotExist(f"shard {shard_id} does not exist")
        return shard

    def shard_for_key(self, key: int) -> Shard:
        if not 0 <= key < KEY_SPACE_END:
            raise ParameterInvalid(f"hash key {key} is outside [0, 2**128)")
        shard = self.writable[bisect_right(self.writable_begins, key) - 1]
        assert shard.covers(key), (shard, key)
        return shard

    def writable_shard(self, shard_id: int) -> Shard:
        shard = self.shard(shard_id)
        if shard.status != "readwrite":
            raise ShardReadOnly(f"shard {shard_id} is readonly")
        return shard


def missing_logstore(name: str) -> LogStoreNotExist:
    return LogStoreNotExist(f"logstore {name} does not exist")


def plan_split(
    entry: CachedLogstore, shard_id: int, split_key: int, now_s: int
) -> tuple[Shard, list[Shard]]:
    """(the parent, its two children) for splitting a read-write shard at ``split_key``."""
    parent = entry.writable_shard(shard_id)
    if not parent.begin_key < split_key < parent.end_key:
        raise ParameterInvalid(
            f"split key {format_hash_key(split_key)} is not strictly inside shard "
            f"{shard_id} [{format_hash_key(parent.begin_key)}, "
            f"{format_hash_key(parent.end_key)})"
        )
    _check_room(entry, readwrite_added=1)
    left_id, right_id = _next_ids(entry, 2)
    left = Shard(left_id, "readwrite", parent.begin_key, split_key, now_s, parents=(shard_id,))
    right = Shard(right_id, "readwrite", split_key, parent.end_key, now_s, parents=(shard_id,))
    return parent, [left, right]


def plan_merge(entry: CachedLogstore, shard_id: int, now_s: int) -> tuple[list[Shard], Shard]:
    """([left, right], the merged child) for merging a read-write shard with its right-hand
    read-write neighbour."""
    left = entry.writable_shard(shard_id)
    right = next((s for s in entry.writable if s.begin_key == left.end_key), None)
    if right is None:
        raise ParameterInvalid(f"shard {shard_id} has no right-hand neighbour to merge")
    _check_room(entry, readwrite_added=-1)
    (merged_id,) = _next_ids(entry, 1)
    merged = Shard(
        merged_id,
        "readwrite",
        left.begin_key,
        right.end_key,
        now_s,
        parents=(left.shard_id, right.shard_id),
    )
    return [left, right], merged


def plan_succession(entry: CachedLogstore, shard_id: int, now_s: int) -> tuple[Shard, Shard]:
    """(the parent, its one child with the same hash range) for moving a read-write shard's
    writes to a new log (in a cluster, on another node)."""
    parent = entry.writable_shard(shard_id)
    _check_room(entry, readwrite_added=0)
    (child_id,) = _next_ids(entry, 1)
    child = Shard(child_id, "readwrite", parent.begin_key, parent.end_key, now_s,
                  parents=(shard_id,))  # fmt: skip
    return parent, child


def seal(sealer: ShardSealer, parents: Sequence[Shard]) -> list[int]:
    """Seals every parent, returning their end sequences; a failure unseals those already
    sealed, so a refused change leaves every log writable."""
    end_seqs: list[int] = []
    try:
        for parent in parents:
            end_seqs.append(sealer.seal(parent.shard_id))
    except BaseException:
        unseal(sealer, parents[: len(end_seqs)])
        raise
    return end_seqs


def unseal(sealer: ShardSealer, parents: Sequence[Shard]) -> None:
    for parent in parents:
        sealer.unseal(parent.shard_id)


def close_parents(
    parents: Sequence[Shard], children: Sequence[Shard], end_seqs: Sequence[int], now_s: int
) -> list[Shard]:
    """The parents as they are after the change: read-only, with their children and ends."""
    child_ids = tuple(c.shard_id for c in children)
    return [
        replace(p, status="readonly", closed_at_s=now_s, children=child_ids, end_seq=end_seq)
        for p, end_seq in zip(parents, end_seqs, strict=True)
    ]


def reshard(
    entry: CachedLogstore, closed: Sequence[Shard], children: Sequence[Shard]
) -> list[Shard]:
    """The logstore's shards with ``closed`` replacing their read-write selves, plus
    ``children``."""
    replaced = {s.shard_id: s for s in closed}
    return [replaced.get(s.shard_id, s) for s in entry.shards] + list(children)


def check_updatable(changes: Mapping[str, Any]) -> None:
    unknown = set(changes) - UPDATABLE
    if unknown:
        raise LogStoreInfoInvalid(f"cannot update {', '.join(sorted(unknown))}")


def _check_room(entry: CachedLogstore, readwrite_added: int) -> None:
    if len(entry.writable) + readwrite_added > shards_per_logstore_max:
        raise ParameterInvalid(f"a logstore has at most {shards_per_logstore_max} readwrite shards")
    if len(entry.shards) + 2 > shard_ids_per_logstore_max:
        raise ParameterInvalid(
            f"a logstore has at most {shard_ids_per_logstore_max} shards, readonly included"
        )


def _next_ids(entry: CachedLogstore, count: int) -> list[int]:
    """Shard ids are never reused: new ones continue after the largest ever given."""
    first = max(entry.by_id) + 1
    return list(range(first, first + count))


def page(names: list[str], offset: int, size: int) -> list[str]:
    if offset < 0 or size < 0:
        raise ParameterInvalid(f"offset and size must not be negative: {offset}, {size}")
    return names[offset : offset + min(size, list_page_size_max)]


_SPEC_FIELDS = tuple(f.name for f in fields(LogstoreSpec))


def spec_values(spec: LogstoreSpec) -> dict[str, Any]:
    values = {name: getattr(spec, name) for name in _SPEC_FIELDS}
    values["extra"] = dict(spec.extra)
    return values


def spec_of(logstore: Logstore) -> LogstoreSpec:
    return LogstoreSpec(**{name: getattr(logstore, name) for name in _SPEC_FIELDS})
