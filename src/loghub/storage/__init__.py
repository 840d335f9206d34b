"""Durable per-shard logs on local disk, Kafka style: segments of CRC-framed records with
offset and time indexes. Storage knows nothing of HTTP, projects or protobuf: a record's
payload is opaque bytes. Byte layouts, crash behaviour and thread-safety are in each module's
docstring (``segment``, ``offset_index``, ``time_index``, ``leader_epochs``, ``shard_log``,
``shard_store``).
"""

from loghub.storage._files import raise_open_files_limit
from loghub.storage.offset_index import OffsetIndex
from loghub.storage.segment import Segment
from loghub.storage.shard_log import (
    BufferedRead,
    ReadBatch,
    ShardLog,
    ShardLogStatistics,
    StagedAppend,
    StorageConfig,
)
from loghub.storage.shard_store import ShardStore, ShardStoreStatistics
from loghub.storage.time_index import TimeIndex

__all__ = [
    "BufferedRead",
    "OffsetIndex",
    "ReadBatch",
    "Segment",
    "ShardLog",
    "ShardLogStatistics",
    "ShardStore",
    "ShardStoreStatistics",
    "StagedAppend",
    "StorageConfig",
    "TimeIndex",
    "raise_open_files_limit",
]
