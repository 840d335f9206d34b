"""Pulls parked at the end of a shard until new data comes (long polling).

A PullLogs with ``loghub_wait_ms`` that finds nothing new does not answer at once: it parks
here, as an asyncio future on the event loop (no thread is held), until the shard's end_seq
advances, the shard is sealed (split or merge made it read-only), the server shuts down, or
the deadline passes. That is Kafka's fetch ``max.wait.ms`` and Redis's ``XREAD BLOCK``: a
consumer at the tail hears of new data within a network round trip instead of after its poll
interval, and an idle consumer costs the server one parked future instead of a pull every
few hundred milliseconds.

How a wake-up travels: the thread that commits a batch publishes the new end_seq and calls
the shard log's ``end_seq_listener``, which is ``TailWaits.notify``; when a pull waits on
that shard, ``notify`` schedules ``_wake`` on the loop with ``call_soon_threadsafe``, which
resolves every future of the shard. No wake-up is lost: a waiter registers its future
*before* it reads end_seq again, and the committer publishes end_seq (under the log's lock)
before it calls the listener, so either the waiter sees the new end_seq or the listener sees
the waiter.

Limit: at most ``waiters_max`` pulls wait at once. One more is answered at once, empty, as
if it had not asked to wait; the reply says so (``x-loghub-wait-ms: 0``), and a client then
pauses before pulling again, as it would without long polling.

Thread-safety: ``notify`` may be called from any thread; everything else runs on the event
loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from dataclasses import dataclass

from loghub.storage import ShardLog

__all__ = ["ShardTail", "TailWaits", "WaitEnd"]


@dataclass(frozen=True)
class ShardTail:
    """Where an empty pull stopped: at ``end_seq`` of a writable shard's log."""

    shard_log: ShardLog
    end_seq: int


class WaitEnd(enum.Enum):
    DATA = "data"  # end_seq moved past the pull's cursor: pull again
    SEALED = "sealed"  # the shard turned read-only: nothing more will come
    CLOSED = "closed"  # the server is shutting down
    TIMEOUT = "timeout"  # the deadline passed
    FULL = "full"  # waiters_max pulls were waiting already: not parked


class TailWaits:
    def __init__(self, waiters_max: int) -> None:
        assert waiters_max >= 1
        self.waiters_max = waiters_max
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[ShardLog, set[asyncio.Future[None]]] = {}
        self._count = 0
        self._closed = False

    @property
    def waiting(self) -> int:
        """Pulls parked right now."""
        return self._count

    async def wait(self, tail: ShardTail, timeout_s: float) -> WaitEnd:
        """Parks until the log passes ``tail.end_seq``, is sealed, the server closes, or
        ``timeout_s`` passes."""
        if self._closed:
            return WaitEnd.CLOSED
        if self._count >= self.waiters_max:
            return WaitEnd.FULL
        self._loop = asyncio.get_running_loop()
        shard_log = tail.shard_log
        if shard_log.end_seq_listener is None:
            shard_log.end_seq_listener = lambda _end_seq: self.notify(shard_log)
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiting.setdefault(shard_log, set()).add(future)
        self._count += 1
        try:
            # registered first, read second: see the module docstring
            ready = self._ready(tail)
            if ready is not None:
                return ready
            try:
                await asyncio.wait_for(future, timeout_s)
            except TimeoutError:
                return WaitEnd.TIMEOUT
            if self._closed:
                return WaitEnd.CLOSED
            return self._ready(tail) or WaitEnd.DATA
        finally:
            self._count -= 1
            futures = self._waiting.get(shard_log)
            if futures is not None:
                futures.discard(future)
                if not futures:
                    del self._waiting[shard_log]

    def _ready(self, tail: ShardTail) -> WaitEnd | None:
        if tail.shard_log.high_watermark_seq > tail.end_seq:
            return WaitEnd.DATA
        if tail.shard_log.sealed:
            return WaitEnd.SEALED
        return None

    def notify(self, shard_log: ShardLog) -> None:
        """The log's end_seq advanced or it was sealed: wake its waiters. Any thread; cheap
        when nobody waits on it (one dictionary lookup)."""
        loop = self._loop
        if loop is None or shard_log not in self._waiting:
            return
        # a closed loop (RuntimeError) means the server is gone: nobody waits any more
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._wake, shard_log)

    def _wake(self, shard_log: ShardLog) -> None:
        for future in self._waiting.pop(shard_log, ()):
            if not future.done():
                future.set_result(None)

    def close(self) -> None:
        """Ends every wait at once and refuses new ones (the server is shutting down). Call
        on the event loop."""
        self._closed = True
        for shard_log in list(self._waiting):
            self._wake(shard_log)
