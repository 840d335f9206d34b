"""Checkpoints: the cursor a shard resumes from, kept in memory and written durably.

A checkpoint means "resume here": the cursor after the last log group processed. Writing one
costs a round trip (to the server, or to the lease database), so the processor marks progress
in memory after each batch (``Checkpointer.save()``) and the worker writes the newest mark:

- at once, when the processor asks (``save(persistent=True)``);
- in the background, once ``checkpoint_interval_ms`` has passed since the last write;
- always when the worker lets go of the shard (release, end of a read-only shard, shutdown).

Only a mark that differs from what was last written is written. After a crash the shard
resumes from the last *written* checkpoint: what was processed after it is delivered again
(at least once), and nothing else.

Writes of one shard are serialised (``_write_lock``) and take the newest mark when they start,
so a slow background write can never land after a newer one and move the checkpoint back.

Thread-safety: ``CheckpointTracker`` is safe to share between the shard's process task and
the background flush. A ``Checkpointer`` belongs to the calls of one processor (never
concurrent).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from loghub._clock import Clock

__all__ = ["CheckpointListener", "CheckpointTracker", "CheckpointWriter", "Checkpointer"]

# Writes ``cursor`` as the checkpoint of ``shard_id``; raises when it could not (LeaseLostError:
# the shard belongs to another worker now; ClientError/DatabaseError: try again later).
CheckpointWriter = Callable[[int, str], None]
# Told (shard_id, cursor) after each checkpoint written: monitoring, and crash tests that must
# know what was durable.
CheckpointListener = Callable[[int, str], None]


class CheckpointTracker:
    """One shard's checkpoint: the newest mark in memory, and the last one written."""

    def __init__(
        self,
        shard_id: int,
        writer: CheckpointWriter,
        clock: Clock,
        *,
        flush_interval_ms: int,
        persisted: str,
        start_cursor: str,
        listener: CheckpointListener | None = None,
    ) -> None:
        self.shard_id = shard_id
        self._writer = writer
        self._clock = clock
        self._flush_interval_ms = flush_interval_ms
        self._listener = listener
        self._lock = threading.Lock()  # guards the fields below, never held across I/O
        self._write_lock = threading.Lock()  # one write of this shard at a time
        self._marked: str | None = None
        self._persisted = persisted  # "" when the shard never had a checkpoint
        self._start_cursor = start_cursor
        self._last_flush_ms = clock.monotonic_ms()
        self.writes = 0

    @property
    def persisted(self) -> str:
        with self._lock:
            return self._persisted

    @property
    def marked(self) -> str | None:
        with self._lock:
            return self._marked

    def mark(self, cursor: str) -> None:
        """Progress in memory: the shard may resume from ``cursor``."""
        assert cursor, "a checkpoint is a cursor"
        with self._lock:
            self._marked = cursor

    def resume_cursor(self) -> str:
        """Where the shard would resume now: the newest mark, else the last checkpoint
        written, else where it started."""
        with self._lock:
            return self._marked or self._persisted or self._start_cursor

    def dirty(self) -> bool:
        with self._lock:
            return self._marked is not None and self._marked != self._persisted

    def next_flush_ms(self) -> int | None:
        """When the background flush is due, None while there is nothing to write."""
        with self._lock:
            if self._marked is None or self._marked == self._persisted:
                return None
            return self._last_flush_ms + self._flush_interval_ms

    def flush_due(self, now_ms: int) -> bool:
        """A background flush is due: something to write, and the interval has passed."""
        with self._lock:
            stale = now_ms - self._last_flush_ms >= self._flush_interval_ms
            return stale and self._marked is not None and self._marked != self._persisted

    def flush(self) -> bool:
        """Write the newest mark if it was not written yet; True when a write happened. Raises
        what the writer raised; the mark stays, for the next flush."""
        with self._write_lock:
            with self._lock:
                target, persisted = self._marked, self._persisted
                self._last_flush_ms = self._clock.monotonic_ms()
            if target is None or target == persisted:
                return False
            self._writer(self.shard_id, target)
            with self._lock:
                self._persisted = target
                self.writes += 1
        if self._listener is not None:
            self._listener(self.shard_id, target)
        return True


class Checkpointer:
    """What a processor sees: the current batch's cursors, and ``save``.

    ``cursor`` is where the current batch starts, ``next_cursor`` where it ends (the resume
    point once it is processed). In ``shutdown`` both are the resume point after the last
    batch processed.
    """

    def __init__(self, tracker: CheckpointTracker, worker_name: str) -> None:
        self._tracker = tracker
        self.worker_name = worker_name
        resume = tracker.resume_cursor()
        self.cursor = resume
        self.next_cursor = resume

    @property
    def shard_id(self) -> int:
        return self._tracker.shard_id

    @property
    def persisted_cursor(self) -> str:
        """The last checkpoint written durably ("" when none yet)."""
        return self._tracker.persisted

    def save(self, persistent: bool = False, cursor: str | None = None) -> None:
        """Mark progress: the shard resumes from ``cursor`` (default: after this batch).

        ``persistent=False`` keeps it in memory, written by the next background flush or when
        the shard is released; ``persistent=True`` writes it now and raises if it could not
        (``LeaseLostError`` when the shard has moved to another worker; the mark stays for
        the next flush otherwise).
        """
        self._tracker.mark(cursor or self.next_cursor)
        if persistent:
            self._tracker.flush()

    def _set_batch(self, cursor: str, next_cursor: str) -> None:
        self.cursor = cursor
        self.next_cursor = next_cursor
