"""What the metadata store hands out: frozen snapshots of projects, logstores and shards.

They are values, not handles: the store replaces them on every change, so a caller can keep
one without locking, and the server can render one with ``to_json()`` in the exact shape the
LogHub SDK reads (``reference/sls-protocol.md`` 5.3, 6.2 and 6.3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from loghub.metadata.hashing import format_hash_key

__all__ = ["Logstore", "LogstoreSpec", "Project", "Shard", "ShardStatus"]

ShardStatus = Literal["readwrite", "readonly"]


@dataclass(frozen=True)
class Project:
    name: str
    description: str
    created_at_s: int
    modified_at_s: int

    def to_json(self) -> dict[str, Any]:
        """The get_project body. The hosted service sends the times as strings of seconds;
        ``status``, ``region`` and ``owner`` are required by the SDK, so they get fixed values
        that mean "a local, working project"."""
        return {
            "projectName": self.name,
            "description": self.description,
            "status": "Normal",
            "region": "local",
            "owner": "",
            "createTime": str(self.created_at_s),
            "lastModifyTime": str(self.modified_at_s),
        }


@dataclass(frozen=True)
class LogstoreSpec:
    """What a create_logstore request asks for. ``extra`` keeps the optional SDK keys this
    server stores but does not act on (``encrypt_conf``, ``hot_ttl``, ``enableModify``,
    ``infrequentAccessTTL``…) under their wire names, so get_logstore returns what was set."""

    name: str
    ttl_days: int = 30
    shard_count: int = 2
    auto_split: bool = False
    max_split_shard: int = 64
    append_meta: bool = False
    enable_tracking: bool = False
    telemetry_type: str = ""
    mode: str = "standard"
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Logstore:
    """A logstore as stored. ``shard_count`` is the number of read-write shards now (what the
    SDK shows as ``shardCount``), not the count it was created with. ``storage_key`` names the
    directory of its shard logs, relative to the data directory; it carries a random suffix so
    that a logstore deleted and created again under the same name never sees the old data."""

    project: str
    name: str
    ttl_days: int
    shard_count: int
    auto_split: bool
    max_split_shard: int
    append_meta: bool
    enable_tracking: bool
    telemetry_type: str
    mode: str
    extra: Mapping[str, Any] = field(hash=False)
    created_at_s: int
    modified_at_s: int
    storage_key: str

    def to_json(self) -> dict[str, Any]:
        """The get_logstore body; the known keys win over any same-named key in ``extra``."""
        body: dict[str, Any] = dict(self.extra)
        body.update(
            {
                "logstoreName": self.name,
                "ttl": self.ttl_days,
                "shardCount": self.shard_count,
                "enable_tracking": self.enable_tracking,
                "appendMeta": self.append_meta,
                "autoSplit": self.auto_split,
                "maxSplitShard": self.max_split_shard,
                "telemetryType": self.telemetry_type,
                "mode": self.mode,
                "createTime": self.created_at_s,
                "lastModifyTime": self.modified_at_s,
            }
        )
        return body


@dataclass(frozen=True)
class Shard:
    """One shard and its lineage. A shard covers ``[begin_key, end_key)``; ``end_key`` may be
    ``2**128``. Split and merge turn a shard read-only, set ``closed_at_s``
    and ``end_seq`` (the sequence number after its last group) and record ``children``; the
    new shards record their ``parents``, which in-order consumption needs."""

    shard_id: int
    status: ShardStatus
    begin_key: int
    end_key: int
    created_at_s: int
    closed_at_s: int | None = None
    parents: tuple[int, ...] = ()
    children: tuple[int, ...] = ()
    end_seq: int | None = None

    def covers(self, key: int) -> bool:
        return self.begin_key <= key < self.end_key

    def to_json(self) -> dict[str, Any]:
        """The list_shards entry. Beyond the SDK's keys it carries the lineage (``parents``,
        ``children``, ``closeTime``); the SDK ignores keys it does not know."""
        return {
            "shardID": self.shard_id,
            "status": self.status,
            "inclusiveBeginKey": format_hash_key(self.begin_key),
            "exclusiveEndKey": format_hash_key(self.end_key),
            "createTime": self.created_at_s,
            "parents": list(self.parents),
            "children": list(self.children),
            "closeTime": self.closed_at_s,
        }
