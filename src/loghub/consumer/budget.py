"""MemoryBudget: the cap on what one worker's pulled-but-unprocessed batches hold in memory.

Prefetching keeps processors busy, but a worker with many shards and a slow processor would
otherwise pull data faster than it can use it and grow until the kernel kills it, and the
next worker inherits the same backlog. So a pull is paid for *before* it starts:

- ``try_reserve(key, bytes)``: a shard reserves what its next pull is expected to cost in
  memory (see ``loghub.consumer.sizing``); the pull starts only when the reservation fits.
- ``settle(reserved, actual)``: when the pull returns, the reservation becomes the batch's
  real cost (the difference is given back, or added when the pull brought more).
- ``release(bytes)``: the batch was processed or dropped.

Fair turns: when a reservation does not fit, its shard joins a queue, and while anybody
waits only the shard at the head may reserve. Every shard therefore gets its turn in the
order it asked, whatever the sizes: a shard with big batches is not overtaken forever by
shards with small ones. A shard that stops wanting a pull leaves the queue (``withdraw``).

What happens at the limit: pulls wait, processing goes on and frees bytes, pulls resume.
A reservation larger than the whole budget is granted when nothing else is held, so a shard
whose single log group is bigger than the budget still advances. The count can pass the cap
only when a pull brings more than was reserved (a server that ignores the byte bound and a
log-group size estimate that was too low); the next reservations then wait until it is back
under. Processing needs no budget, so the worker can never deadlock on it.

``members`` (shards being consumed, ``join``/``leave``) divides the budget into shares, which
size the pulls.

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
        self._members: set[int] = set()
        self._waiting: dict[int, None] = {}  # insertion-ordered: the queue of turns

    def join(self, key: int) -> None:
        with self._lock:
            self._members.add(key)

    def leave(self, key: int) -> None:
        with self._lock:
            self._members.discard(key)
            self._waiting.pop(key, None)

    def share_bytes(self) -> int:
        """The budget divided among the members (the whole budget when there are none)."""
        with self._lock:
            return self.bytes_max // max(1, len(self._members))

    def try_reserve(self, key: int, size_bytes: int) -> bool:
        """Reserve ``size_bytes`` for ``key``'s next pull; False (and ``key`` waits for its
        turn) when it does not fit or others were waiting first."""
        assert size_bytes >= 0, size_bytes
        with self._lock:
            if self._waiting and next(iter(self._waiting)) != key:
                self._waiting.setdefault(key)
                return False
            if self._used_bytes and self._used_bytes + size_bytes > self.bytes_max:
                self._waiting.setdefault(key)
                return False
            self._waiting.pop(key, None)
            self._add(size_bytes)
            return True

    def withdraw(self, key: int) -> None:
        """``key`` no longer wants a pull: it gives up its place in the queue."""
        with self._lock:
            self._waiting.pop(key, None)

    def settle(self, reserved_bytes: int, actual_bytes: int) -> None:
        """Turn a reservation into what the pull really costs."""
        assert reserved_bytes >= 0 and actual_bytes >= 0, (reserved_bytes, actual_bytes)
        with self._lock:
            assert reserved_bytes <= self._used_bytes, (reserved_bytes, self._used_bytes)
            self._used_bytes -= reserved_bytes
            self._add(actual_bytes)

    def release(self, size_bytes: int) -> None:
        with self._lock:
            assert 0 <= size_bytes <= self._used_bytes, (size_bytes, self._used_bytes)
            self._used_bytes -= size_bytes

    def _add(self, size_bytes: int) -> None:
        self._used_bytes += size_bytes
        self._high_water_bytes = max(self._high_water_bytes, self._used_bytes)

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used_bytes

    @property
    def high_water_bytes(self) -> int:
        with self._lock:
            return self._high_water_bytes

    @property
    def waiting(self) -> tuple[int, ...]:
        """The keys waiting for their turn, first first."""
        with self._lock:
            return tuple(self._waiting)
