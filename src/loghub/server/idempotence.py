"""Idempotent writes: a retried PutLogs stored once, also after a failover.

A client that retries a write whose answer it did not get (a timeout, a connection closed,
a 503 from a leader deposed while the write waited for its replicas) cannot know whether
the first attempt was stored. LogHub's client names each write with a **producer id** (a
random 64-bit id per client) and a **sequence** (one per write, the same on every retry),
in the signed header ``x-log-loghub-producer: <producer id>:<sequence>``. The shard's
leader remembers the last ``SEQUENCES_KEPT`` sequences of each producer it has seen
(``ShardProducers``): a write it already holds is answered as stored (after waiting, like
the first, for its replicas) instead of being appended again; one still in flight is
awaited.

Why it survives a failover: the id is stored with the write, as the log group's
``Reserved`` field (``loghub-producer:<id>:<sequence>``, appended to the group's bytes by
the server; protobuf keeps the last value of a field, and every reader of the protocol
knows the field). A replica that becomes leader, or a server that restarts, rebuilds the
memory from the last ``SCAN_RECORDS_MAX`` records of its log before it takes the first
write that names a producer, so a retry that reaches the new leader finds the write there
if any replica held it.

Limits: a retry of a write older than the scan window (or than the last
``SEQUENCES_KEPT`` writes of its producer to that shard) may be stored twice; a write whose
group sets ``Reserved`` itself has it replaced. Producer ids are not authenticated: any key
that may write the logstore may name any id (as any Kafka client may).

Thread-safety: used on the event loop only; the rebuild reads the log in a thread.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from loghub.storage import ShardLog
from loghub.storage.segment import HEADER, HEADER_BYTES
from loghub.wire.producer_ids import WriteId, marker_of
from loghub.wire.stored import LZ4_ENTRY_MARK

__all__ = ["SCAN_RECORDS_MAX", "SEQUENCES_KEPT", "IdempotentWrites", "ShardProducers", "scan_log"]

SEQUENCES_KEPT = 64  # per producer and shard
PRODUCERS_KEPT = 10_000  # per shard; the least recently seen go first
SCAN_RECORDS_MAX = 20_000  # records a new leader reads back to rebuild the memory
_SCAN_BYTES_MAX = 64 * 1024 * 1024


@dataclass
class ShardProducers:
    """What one shard's leader remembers of the producers writing to it: per producer, its
    last sequences and, for each, the end sequence of its record in the log, or the future
    of a write still being appended."""

    leader_epoch: int
    producers: OrderedDict[str, OrderedDict[int, int | asyncio.Future[int]]] = field(
        default_factory=OrderedDict
    )

    def find(self, write: WriteId) -> int | asyncio.Future[int] | None:
        sequences = self.producers.get(write.producer)
        return None if sequences is None else sequences.get(write.sequence)

    def note(self, write: WriteId, end: int | asyncio.Future[int]) -> None:
        sequences = self.producers.get(write.producer)
        if sequences is None:
            sequences = self.producers[write.producer] = OrderedDict()
            while len(self.producers) > PRODUCERS_KEPT:
                self.producers.popitem(last=False)
        else:
            self.producers.move_to_end(write.producer)
        sequences[write.sequence] = end
        sequences.move_to_end(write.sequence)
        while len(sequences) > SEQUENCES_KEPT:
            sequences.popitem(last=False)

    def forget(self, write: WriteId) -> None:
        sequences = self.producers.get(write.producer)
        if sequences is not None:
            sequences.pop(write.sequence, None)


def scan_log(shard_log: ShardLog) -> ShardProducers:
    """The producers' memory rebuilt from the last records of ``shard_log`` (all of them up
    to its end, above the high watermark too: a new leader's log is the shard's from now
    on). Blocking: call from a thread."""
    producers = ShardProducers(shard_log.leader_epoch)
    end = shard_log.end_seq
    position = max(shard_log.begin_seq, end - SCAN_RECORDS_MAX)
    scanned = 0
    while position < end and scanned < _SCAN_BYTES_MAX:
        chunk = shard_log.read_raw(position, 4 * 1024 * 1024)
        if not chunk:
            break
        view = memoryview(chunk)
        offset = 0
        while offset < len(view):
            fields = HEADER.unpack_from(view, offset)
            sequence, size = fields[3], fields[5]
            payload = view[offset + HEADER_BYTES : offset + HEADER_BYTES + size]
            # a marked write is stored framed; an lz4 entry is a producer's own block
            write = None if size and payload[0] == LZ4_ENTRY_MARK else marker_of(payload)
            if write is not None:
                producers.note(write, sequence + 1)
            offset += HEADER_BYTES + size
            position = sequence + 1
        scanned += len(chunk)
    return producers


class IdempotentWrites:
    """Every shard's ``ShardProducers`` on this server, rebuilt from the log when first
    needed in a leader epoch."""

    def __init__(self) -> None:
        # by (storage key, shard id): a logstore made again under a deleted one's name has
        # another storage key, so it never meets the old one's memory
        self._shards: dict[tuple[str, int], ShardProducers] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}

    async def producers(
        self,
        key: tuple[str, int],
        shard_log: ShardLog,
        offload: Callable[..., Awaitable[ShardProducers]],
    ) -> ShardProducers:
        found = self._shards.get(key)
        if found is not None and found.leader_epoch == shard_log.leader_epoch:
            return found
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            found = self._shards.get(key)
            if found is None or found.leader_epoch != shard_log.leader_epoch:
                found = self._shards[key] = await offload(scan_log, shard_log)
            return found
