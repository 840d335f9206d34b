"""Projects, logstores and shards: what exists, where its data lives, and how keys route.

``MetadataStore`` keeps them in SQLite or PostgreSQL and serves reads from memory;
``hashing`` is the 128-bit hash-key math shards are cut by; ``ClusterStore`` names what shard
replication will need from the control plane (leader, leader epoch, in-sync replicas).

The names that need SQLAlchemy (the stores) are imported on first use: the command line
imports this package for the hash-key math alone, and every ``loghub`` command would
otherwise pay SQLAlchemy's import (about a fifth of a second here) before doing anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loghub._lazy import imported_on_use
from loghub.metadata._validate import (
    max_split_shard_max,
    shards_per_logstore_max,
    ttl_days_max,
)
from loghub.metadata.cluster_store import ClusterStore, ShardLeadership, SingleNodeClusterStore
from loghub.metadata.hashing import (
    KEY_SPACE_END,
    even_ranges,
    format_hash_key,
    md5_hash_key,
    parse_hash_key,
)
from loghub.metadata.models import Logstore, LogstoreSpec, Project, Shard, ShardStatus

if TYPE_CHECKING:
    from loghub.metadata.groups import (
        Checkpoint,
        ConsumerGroupCatalog,
        ConsumerGroupDef,
        consumer_groups_per_logstore_max,
    )
    from loghub.metadata.store import (
        SCHEMA_VERSION,
        MetadataStore,
        ShardSealer,
        shard_ids_per_logstore_max,
    )

_IMPORTED_ON_USE = {
    "Checkpoint": "loghub.metadata.groups",
    "ConsumerGroupCatalog": "loghub.metadata.groups",
    "ConsumerGroupDef": "loghub.metadata.groups",
    "consumer_groups_per_logstore_max": "loghub.metadata.groups",
    "SCHEMA_VERSION": "loghub.metadata.store",
    "MetadataStore": "loghub.metadata.store",
    "ShardSealer": "loghub.metadata.store",
    "shard_ids_per_logstore_max": "loghub.metadata.store",
}

__getattr__ = imported_on_use(__name__, _IMPORTED_ON_USE)


__all__ = [
    "KEY_SPACE_END",
    "SCHEMA_VERSION",
    "Checkpoint",
    "ClusterStore",
    "ConsumerGroupCatalog",
    "ConsumerGroupDef",
    "Logstore",
    "LogstoreSpec",
    "MetadataStore",
    "Project",
    "Shard",
    "ShardLeadership",
    "ShardSealer",
    "ShardStatus",
    "SingleNodeClusterStore",
    "consumer_groups_per_logstore_max",
    "even_ranges",
    "format_hash_key",
    "max_split_shard_max",
    "md5_hash_key",
    "parse_hash_key",
    "shard_ids_per_logstore_max",
    "shards_per_logstore_max",
    "ttl_days_max",
]
