"""MemoryBudget: the cap on fetched-but-unprocessed bytes of one worker.

Prefetching keeps processors busy, but a worker with many shards and a slow processor would
otherwise pull data faster than it can use it and grow without bound. Every pulled batch is
counted here (its decoded size, ``x-log-bodyrawsize``) from the moment it arrives until it is
processed or dropped; a shard may start a new pull only while the count is below the cap.

What happens at the limit: pulls wait, processing goes on and frees bytes, pulls resume. The
size of a pull is known only after it returns, so the count can exceed the cap by at most
what the pulls already in flight bring (one pull per shard, each at most the server's pull
limit, 16 MiB on LogHub): ``bytes_max + pulls in flight x pull size``. Processing needs no
budget, so the worker can never deadlock on it.

Thread-safety: safe to share (one lock).
"""

from __future__ import annotations

import threading

__all__ = ["MemoryBudget"]


class MemoryBudget:
    def __init__(self, bytes_max: int) -> None:
        assert bytes_max > 0, bytes_max
        self.bytes_max = bytes_max
        self._lock = threading.Lock()
        self._used_bytes = 0
        self._high_water_bytes = 0

    def may_fetch(self) -> bool:
        """Below the cap: a new pull may start."""
        with self._lock:
            return self._used_bytes < self.bytes_max

    def add(self, size_bytes: int) -> None:
        assert size_bytes >= 0, size_bytes
        with self._lock:
            self._used_bytes += size_bytes
            self._high_water_bytes = max(self._high_water_bytes, self._used_bytes)

    def release(self, size_bytes: int) -> None:
        with self._lock:
            assert 0 <= size_bytes <= self._used_bytes, (size_bytes, self._used_bytes)
            self._used_bytes -= size_bytes

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used_bytes

    @property
    def high_water_bytes(self) -> int:
        with self._lock:
            return self._high_water_bytes
