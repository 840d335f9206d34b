"""How big a shard's next pull should be, and what a pulled batch costs in memory.

A batch lives in three forms: the reply body as it came over the wire (lz4, kept while the
batch waits in the queue), the serialized ``LogGroupList`` (``raw_size`` bytes, only while it
is parsed) and the decoded protobuf messages that ``process`` gets. Decoded messages take
about 3.3 times their serialized size (measured with upb on access logs of seven fields),
so a batch is charged ``wire + raw x batch_bytes_per_raw_byte`` from the moment its pull is
reserved until ``process`` returns: the most it holds at any moment, whichever form it is in.

Each shard may hold ``batches_per_shard`` batches (one being processed, the rest queued or
in flight), so a pull aims at ``share / batches_per_shard`` of charged bytes, where the share
is the worker's budget divided by the shards it consumes. Against a LogHub server the pull
asks for that many raw bytes (``loghub_max_bytes``). Other servers (the hosted service)
ignore that parameter, so the log-group count is also sized: from the bytes per group of the
shard's earlier pulls, starting with a single group when nothing is known yet.

Pure functions and a small per-shard estimate; the estimate is used under its shard's lock.
"""

from __future__ import annotations

import math

__all__ = [
    "GroupSizeEstimate",
    "batch_bytes_per_raw_byte",
    "batch_cost_bytes",
    "pull_count",
    "pull_raw_bytes_max",
    "pull_raw_bytes_target",
]

# Decoded messages (about 3.3 x the serialized size) plus the serialized copy they are
# parsed from, which is alive at the same time while parsing.
batch_bytes_per_raw_byte = 4.5
# A pull never asks for more than LogHub's own reply limit (``Limits.pull_bytes_max``).
pull_raw_bytes_max = 16 * 1024 * 1024
# Weight of the newest pull in the bytes-per-group estimate: log sizes drift, a burst of
# big groups should count quickly.
_estimate_weight_new = 0.5


def batch_cost_bytes(wire_bytes: int, raw_bytes: int) -> int:
    """What a batch may hold in memory at its peak (see the module docstring)."""
    return wire_bytes + math.ceil(raw_bytes * batch_bytes_per_raw_byte)


def pull_raw_bytes_target(share_bytes: int, batches_per_shard: int) -> int:
    """The raw bytes one pull should bring so that the shard's batches fit its share."""
    assert share_bytes > 0 and batches_per_shard > 0, (share_bytes, batches_per_shard)
    per_batch = share_bytes / batches_per_shard
    # the wire body is at most the raw size (uncompressed replies), hence the + 1
    raw_bytes = int((per_batch - 1) / (batch_bytes_per_raw_byte + 1))  # - 1: cost rounds up
    return max(1, min(pull_raw_bytes_max, raw_bytes))


def pull_count(raw_bytes_target: int, group_bytes: float | None, count_max: int) -> int:
    """Log groups to ask for from a server that may not honour the byte bound: as many as
    fit the target by the estimate, at least one; one while the size is unknown."""
    if group_bytes is None:
        return 1
    return max(1, min(count_max, int(raw_bytes_target / max(group_bytes, 1.0))))


class GroupSizeEstimate:
    """Raw bytes per log group of one shard, from its earlier pulls (a moving average)."""

    def __init__(self) -> None:
        self.group_bytes: float | None = None

    def add(self, raw_bytes: int, count: int) -> None:
        if count <= 0:
            return
        observed = raw_bytes / count
        if self.group_bytes is None:
            self.group_bytes = observed
        else:
            self.group_bytes += _estimate_weight_new * (observed - self.group_bytes)

    def expected_raw_bytes(self, raw_bytes_target: int) -> int:
        """What a pull aimed at ``raw_bytes_target`` is expected to bring: at least one group."""
        if self.group_bytes is None:
            return raw_bytes_target
        return max(raw_bytes_target, math.ceil(self.group_bytes))
