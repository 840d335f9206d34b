"""Running an iterator a few items ahead of its consumer, in a thread.

Why: an executor's Python worker hands each record batch to Spark by writing it to a socket,
and blocks there while the JVM turns the batch into rows. Decoding the next batch meanwhile
(pulls wait on the network, and Arrow's kernels release the GIL) keeps the worker and the JVM
busy at the same time instead of taking turns.

At most ``depth`` items wait in the queue (a limit on memory: each is one record batch). An
exception in the producer is raised in the consumer. When the consumer stops early (the
generator is closed), the producer is told to stop and its iterator is closed, which closes
what it holds (its HTTP client).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["prefetched"]

T = TypeVar("T")

_POLL_S = 0.1  # how often a producer blocked on a full queue checks for a stop
_JOIN_TIMEOUT_S = 30.0


class _Done:
    pass


def prefetched(make: Callable[[], Iterator[T]], depth: int = 2) -> Iterator[T]:
    """The items of ``make()``, produced in a thread up to ``depth`` ahead."""
    assert depth >= 1, depth
    items: queue.Queue[tuple[T | None, BaseException | None] | _Done] = queue.Queue(depth)
    stop = threading.Event()

    def put(entry: tuple[T | None, BaseException | None] | _Done) -> bool:
        while not stop.is_set():
            try:
                items.put(entry, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        source = make()
        try:
            for item in source:
                if not put((item, None)):
                    return
            put(_Done())
        except BaseException as exc:  # handed to the consumer, which raises it
            put((None, exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="loghub-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            entry = items.get()
            if isinstance(entry, _Done):
                return
            item, error = entry
            if error is not None:
                raise error
            yield item  # type: ignore[misc]  # None only together with an error
    finally:
        stop.set()
        thread.join(_JOIN_TIMEOUT_S)
