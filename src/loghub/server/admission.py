"""Room for request bodies: a byte budget shared by all requests, so memory stays bounded.

A PutLogs body is held several times over while it is handled (as received, decompressed,
framed for the log, parsed in a checking worker), so six clients sending 30 MiB at once
used to grow the server by about half a gigabyte. Each request with a body first takes room
for it here, counted at the larger of its length and its declared raw size, and gives the
room back when it has been answered. A request that finds no room waits, in arrival order,
without its body being read (so TCP pushes back on the client); after ``wait_s`` it is
answered 503 ServerBusy with Retry-After, which the SDK retries. A body larger than the whole
budget is let in alone, so every body within the size limits can be stored.

Thread-safety: event loop only.
"""

from __future__ import annotations

import asyncio
import collections

from loghub.errors import ServerBusy

__all__ = ["BodyBudget"]


class BodyBudget:
    def __init__(self, bytes_max: int, wait_s: float) -> None:
        assert bytes_max > 0 and wait_s > 0, (bytes_max, wait_s)
        self.bytes_max = bytes_max
        self.wait_s = wait_s
        self.in_use_bytes = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def waiting(self) -> int:
        """Requests waiting for room now."""
        return len(self._waiters)

    def _fits(self, size: int) -> bool:
        return self.in_use_bytes == 0 or self.in_use_bytes + size <= self.bytes_max

    def room(self, size: int) -> _Room:
        """Holds `size` bytes of the budget for an ``async with`` block; raises ServerBusy
        after waiting wait_s for them. A plain class rather than an asynccontextmanager: its
        generator cost every request more than the accounting itself."""
        assert size >= 0, size
        return _Room(self, size)

    def _release(self, size: int) -> None:
        self.in_use_bytes -= size
        self._wake()

    async def _take(self, size: int) -> None:
        if not self._waiters and self._fits(size):
            self.in_use_bytes += size
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, waiter)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.wait_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if waiter.done() and not waiter.cancelled():
                self.in_use_bytes -= size  # granted just as the wait ended: give it back
            else:
                self._waiters.remove(entry)
                waiter.cancel()
            self._wake()
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise ServerBusy(
                f"{self.in_use_bytes} bytes of request bodies are being handled (at most "
                f"{self.bytes_max}); try again"
            ) from None

    def _wake(self) -> None:
        """Lets in waiters in arrival order while the first one fits."""
        while self._waiters and self._fits(self._waiters[0][0]):
            size, waiter = self._waiters.popleft()
            self.in_use_bytes += size
            waiter.set_result(None)


class _Room:
    """The budget taken by one request, for the duration of an ``async with``."""

    __slots__ = ("_budget", "_size")

    def __init__(self, budget: BodyBudget, size: int) -> None:
        self._budget = budget
        self._size = size

    async def __aenter__(self) -> None:
        size, budget = self._size, self._budget
        if size == 0:
            return
        if not budget._waiters and budget._fits(size):  # the usual case: no await at all
            budget.in_use_bytes += size
            return
        await budget._take(size)

    async def __aexit__(self, *exc: object) -> None:
        if self._size:
            self._budget._release(self._size)
