"""The checkpoint tracker and the processor's Checkpointer: memory marks, durable writes,
the background flush on a fake clock, and writes that never go backwards."""

from __future__ import annotations

import threading

import pytest

from loghub.consumer.checkpoint import Checkpointer, CheckpointTracker
from loghub.errors import LeaseLostError, TransportError
from loghub.testing import FakeClock


class Store:
    def __init__(self) -> None:
        self.written: list[tuple[int, str]] = []
        self.fail: Exception | None = None

    def write(self, shard_id: int, cursor: str) -> None:
        if self.fail is not None:
            raise self.fail
        self.written.append((shard_id, cursor))


def tracker(
    store: Store, clock: FakeClock, interval_ms: int = 1_000, persisted: str = ""
) -> CheckpointTracker:
    return CheckpointTracker(
        7,
        store.write,
        clock,
        flush_interval_ms=interval_ms,
        persisted=persisted,
        start_cursor="MA==",
    )


def test_save_marks_in_memory_and_persistent_save_writes_at_once() -> None:
    store, clock = Store(), FakeClock()
    checkpointer = Checkpointer(tracker(store, clock), "w1")
    checkpointer._set_batch("MA==", "Mw==")
    checkpointer.save()
    assert store.written == [] and checkpointer.persisted_cursor == ""
    checkpointer._set_batch("Mw==", "NQ==")
    checkpointer.save(persistent=True)
    assert store.written == [(7, "NQ==")] and checkpointer.persisted_cursor == "NQ=="


def test_save_takes_an_explicit_cursor() -> None:
    store, clock = Store(), FakeClock()
    checkpointer = Checkpointer(tracker(store, clock), "w1")
    checkpointer._set_batch("MA==", "Mw==")
    checkpointer.save(persistent=True, cursor="MQ==")
    assert store.written == [(7, "MQ==")]


def test_the_background_flush_is_due_once_the_interval_passed_and_there_is_news() -> None:
    store, clock = Store(), FakeClock()
    track = tracker(store, clock, interval_ms=1_000)
    assert not track.flush_due(clock.monotonic_ms()) and track.next_flush_ms() is None
    track.mark("MQ==")
    assert track.next_flush_ms() == 1_000
    clock.advance(999)
    assert not track.flush_due(clock.monotonic_ms())
    clock.advance(1)
    assert track.flush_due(clock.monotonic_ms())
    assert track.flush() and store.written == [(7, "MQ==")]
    assert not track.flush_due(clock.monotonic_ms() + 10_000), "nothing new to write"
    assert not track.flush(), "an unchanged mark is not written again"


def test_a_failed_write_keeps_the_mark_for_the_next_flush() -> None:
    store, clock = Store(), FakeClock()
    track = tracker(store, clock)
    track.mark("MQ==")
    store.fail = TransportError("down")
    with pytest.raises(TransportError):
        track.flush()
    assert track.dirty() and track.persisted == ""
    store.fail = None
    assert track.flush() and track.persisted == "MQ=="


def test_a_refused_write_raises_lease_lost() -> None:
    store, clock = Store(), FakeClock()
    track = tracker(store, clock)
    track.mark("MQ==")
    store.fail = LeaseLostError("moved on")
    with pytest.raises(LeaseLostError):
        track.flush()


def test_resume_cursor_prefers_the_mark_then_the_written_checkpoint_then_the_start() -> None:
    store, clock = Store(), FakeClock()
    assert tracker(store, clock).resume_cursor() == "MA=="
    track = tracker(store, clock, persisted="Mg==")
    assert track.resume_cursor() == "Mg=="
    track.mark("Mw==")
    assert track.resume_cursor() == "Mw=="


def test_the_listener_hears_every_durable_write() -> None:
    store, clock = Store(), FakeClock()
    heard: list[tuple[int, str]] = []
    track = CheckpointTracker(
        3,
        store.write,
        clock,
        flush_interval_ms=0,
        persisted="",
        start_cursor="MA==",
        listener=lambda shard, cursor: heard.append((shard, cursor)),
    )
    track.mark("MQ==")
    track.flush()
    track.flush()
    assert heard == [(3, "MQ==")]


def test_concurrent_flushes_never_move_the_checkpoint_back() -> None:
    """A slow write started with an old mark must not land after a newer one."""
    clock = FakeClock()
    written: list[str] = []
    first_write_started = threading.Event()
    release_first_write = threading.Event()

    def slow_writer(shard_id: int, cursor: str) -> None:
        if not written and not first_write_started.is_set():
            first_write_started.set()
            release_first_write.wait(5)
        written.append(cursor)

    track = CheckpointTracker(
        1, slow_writer, clock, flush_interval_ms=0, persisted="", start_cursor="MA=="
    )
    track.mark("MQ==")
    background = threading.Thread(target=track.flush)
    background.start()
    first_write_started.wait(5)
    track.mark("Mg==")
    newer = threading.Thread(target=track.flush)
    newer.start()
    release_first_write.set()
    background.join(5)
    newer.join(5)
    assert written == ["MQ==", "Mg=="] and track.persisted == "Mg=="
