"""Reading ahead in a thread: same items in the same order, errors raised in the reader, and
the producer stopped and closed when the reader stops early."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from loghub.spark._prefetch import prefetched


def test_items_arrive_in_order() -> None:
    assert list(prefetched(lambda: iter(range(100)), depth=2)) == list(range(100))


def test_an_error_in_the_producer_is_raised_in_the_consumer_after_the_items_before_it() -> None:
    def failing() -> Iterator[int]:
        yield 1
        raise ValueError("pull failed")

    got = []
    with pytest.raises(ValueError, match="pull failed"):
        for item in prefetched(failing):
            got.append(item)
    assert got == [1]


def test_stopping_early_closes_the_producer() -> None:
    closed = threading.Event()

    def endless() -> Iterator[int]:
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.set()

    reader = prefetched(endless, depth=1)
    assert [next(reader) for _ in range(3)] == [0, 1, 2]
    reader.close()  # type: ignore[attr-defined]
    assert closed.wait(5)
