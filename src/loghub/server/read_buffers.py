"""Buffers that pulls read stored groups into, kept between pulls up to a total size.

Why: a pull packs up to ``pull_bytes_max`` (16 MiB) of stored groups into one buffer before
compressing it. The server maps every large block on its own and unmaps it when freed (see
``loghub.server.memory``), so a new buffer per pull was faulted in page by page each time,
which cost about as much CPU as compressing the reply. Reusing a few buffers costs none of
that, and the total kept is bounded by ``Limits.pull_buffer_bytes_kept_max``: a buffer given
back when the kept ones already fill the bound is freed, so the server's size still follows
its load beyond that bound. More pulls than kept buffers at once simply allocate their own.

Thread-safety: ``take`` and ``give_back`` may be called from any thread (one lock around a
list append or pop).
"""

from __future__ import annotations

import threading

__all__ = ["ReadBuffers"]


class ReadBuffers:
    """A bounded stack of reusable ``bytearray``s, the most recently used (warmest) first."""

    def __init__(self, bytes_kept_max: int) -> None:
        assert bytes_kept_max >= 0
        self._bytes_kept_max = bytes_kept_max
        self._free: list[bytearray] = []
        self._kept_bytes = 0
        self._lock = threading.Lock()

    def take(self) -> bytearray:
        """A buffer for one read (empty when none is kept; reads grow it as they need)."""
        with self._lock:
            if not self._free:
                return bytearray()
            buffer = self._free.pop()
            self._kept_bytes -= len(buffer)
            return buffer

    def give_back(self, buffer: bytearray) -> None:
        """Keeps ``buffer`` for a later read if the bound allows, else lets it be freed. The
        caller must hold no view of it any more."""
        with self._lock:
            if self._kept_bytes + len(buffer) <= self._bytes_kept_max:
                self._free.append(buffer)
                self._kept_bytes += len(buffer)

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return self._kept_bytes
