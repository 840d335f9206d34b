"""A shard log: one shard's records, durable on local disk, as a list of segments.

Byte layout: a directory of segments (see ``loghub.storage.segment``), each named by the first
sequence it holds, ``00000000000000000000.log`` with its ``.index`` and ``.timeindex``, and
the ``leader-epochs`` file (see ``loghub.storage.leader_epochs``). The segments are
contiguous: a segment holds [its base, the next segment's base). Only the last (active)
segment is appended to; a new one is rolled when the active one would pass
``segment_bytes_max`` (a record larger than that gets a segment of its own). Segments of the
first format (no segment header) are read as they are; when the active one is of that
format, ``open`` starts a new segment (or gives an empty one its header), so new records
always go into the current format and old files are never rewritten.

Leader epochs and the high watermark, the seams replication is built on: every record is
stamped with the log's current leader epoch (``set_leader_epoch``; 0 on a single server),
and the leader-epoch file records where each epoch began, written once per epoch before its
first record. ``end_seq`` is the end of the records written (Kafka's log end offset);
``high_watermark_seq`` the end of the committed ones, which is all a consumer's ``read``
returns. On a single server the two are equal; a follower's ``read_raw`` copies up to
``end_seq``. In replicated mode (``set_replicated``) the replication layer sets the high
watermark (``advance_high_watermark``: up only, never past end_seq) and appends leave it
where it is. Cursors in [high watermark, end_seq] stay valid and read nothing yet;
``seq_for_time`` and the "end" cursor answer at most the high watermark, and retention
deletes only below it.

Truncation (``truncate_to``): a follower whose epoch lineage left the leader's cuts its log
at the point of divergence, then copies the leader's records with ``append_raw``. Later
segments are unlinked newest first, the segment holding the cut is cut, and the leader-epoch
file is written last; a crash in between leaves a prefix of the old log, whose epoch
entries past its end ``open`` drops (the method's docstring explains the order).

Life cycle of an append under ``fsync_policy="always"`` (group commit, leader/follower):

    append() --queue--> waiting --(no writer busy: becomes leader)--> leader takes the whole
    queue, assigns sequences, one os.write, one fdatasync --> publishes end_seq --> wakes all
    followers, whose records went out in that batch (or become the next leader)

A caller that batches appends of many shards itself (the server's commit queue: one thread
that writes every shard a round touched, then syncs them) uses the two halves of that:

    stage_append(payloads) -- writer role taken, sequences assigned, one os.write, no sync
    complete_append(staged) -- fdatasync (under "always"), end_seq published, role released

so that the writes of all shards go out before the first fdatasync waits. Between the two
the records are in the file but not readable (end_seq is unchanged) and other writers wait.

Under ``"interval"`` the append returns after the write, and a background thread fdatasyncs
every ``fsync_interval_ms``. A failed write or sync truncates the file back to where the batch
began and raises, for every record of the batch, ``DiskFullError`` when the disk is full (the
next append tries again, so writes resume when space returns) or ``StorageError`` otherwise.

After a crash: ``open`` runs ``Segment.recover`` on the last segment (cuts a torn tail, logs
the bytes cut, keeps intact records after damage in the middle) and ``check_sealed`` on
earlier ones. Records acknowledged under "always" are on disk; under "interval" the last
``fsync_interval_ms`` may be lost. Sequence numbers never go back: after retention removes
everything, an empty segment named by end_seq remains; records lost to damage keep their
sequences (a ``LostRange``), so no sequence or cursor is ever given to other data. The one
exception is ``truncate_to``: a follower's records past the divergence were never committed,
and their sequences go to the leader's records.

Damage: a read that starts in a lost range raises ``RecordsLostError`` (with the range, so that
the reader can resume after it); a read that starts before one stops at its first sequence.
A read that meets damage not yet known (a record or an index entry failing its checks)
rescans that segment once, notes what it finds, and is planned again.
Receive times are stored as max(previous, given); the previous time is read back from the
time indexes on open, so it is forgotten only when retention has emptied the shard; a
truncation takes it back to the newest record left (the leader's records may be older).

Thread-safety: ``ShardLog`` is thread-safe. One lock guards the segment list, the published
end_seq and the in-memory indexes; file I/O runs outside it (but for rare repairs: a rescan,
a roll back, a truncation). One thread at a time holds the writer role (a leader, retention,
a raw append, a truncation, close). Readers pin the segments they read so that retention can
unlink a segment under them; its descriptors close at the last unpin. A truncation holds new
reads back and waits for those pinning the segments it cuts, so that no read returns part of
the old tail and part of what replaces it.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NoReturn

from loghub._clock import Clock
from loghub.errors import (
    CorruptSegmentError,
    DiskFullError,
    LogSealedError,
    RecordsLostError,
    RecordTooLargeError,
    SequenceOutOfRangeError,
    StorageClosedError,
    StorageError,
)
from loghub.storage._files import FileCache, fsync_directory
from loghub.storage.leader_epochs import (
    EpochEntry,
    fit_to_log,
    merge_epoch_starts,
    read_leader_epochs,
    write_leader_epochs,
)
from loghub.storage.segment import (
    HEADER,
    HEADER_BYTES,
    LostRange,
    ReadPlan,
    Segment,
    check_header,
    encode_header,
    record_crc_matches,
    segment_base_sequences,
)

__all__ = [
    "BufferedRead",
    "ReadBatch",
    "ShardLog",
    "ShardLogStatistics",
    "StagedAppend",
    "StorageConfig",
]

logger = logging.getLogger("loghub.storage")

_POSITION_MAX = 2**32 - 1
_EPOCH_MAX = 2**32 - 1
_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class StorageConfig:
    """Limits and durability of the storage layer.

    ``segment_bytes_max + payload_bytes_max`` must fit the indexes' u32 positions.
    """

    fsync_policy: Literal["always", "interval"] = "always"
    fsync_interval_ms: int = 1000
    segment_bytes_max: int = 256 * 1024 * 1024
    index_interval_bytes: int = 4096
    payload_bytes_max: int = 64 * 1024 * 1024
    # Log file descriptors kept open while unused, across every shard of a store (least
    # recently used closed first); files in use are open on top of it. 512 leaves half of
    # the common `ulimit -n 1024` to sockets and the metadata database.
    open_files_max: int = 512
    # Told the seconds each fdatasync of a log file took (the server's fsync latency
    # histogram); called from the writing thread, so it must be quick and thread-safe.
    # A duration, not a point in time: it is measured here with the performance counter.
    fsync_observer: Callable[[float], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.fsync_policy not in ("always", "interval"):
            raise ValueError(f"fsync_policy must be 'always' or 'interval': {self.fsync_policy}")
        if self.fsync_interval_ms <= 0:
            raise ValueError("fsync_interval_ms must be positive")
        if self.segment_bytes_max <= 0 or self.index_interval_bytes <= 0:
            raise ValueError("segment_bytes_max and index_interval_bytes must be positive")
        if self.open_files_max < 1:
            raise ValueError("open_files_max must be at least 1")
        if self.payload_bytes_max < 0:
            raise ValueError("payload_bytes_max must not be negative")
        if self.segment_bytes_max + HEADER_BYTES + self.payload_bytes_max > _POSITION_MAX:
            raise ValueError("segment_bytes_max + payload_bytes_max must stay below 4 GiB")


@dataclass(frozen=True)
class ReadBatch:
    data: bytes  # the concatenated payloads of the records read, in order (no headers)
    count: int  # records read
    next_seq: int  # sequence after the last record read (== start when count == 0)
    # what the payloads count against a read's bytes_max: their length, an lz4 entry of
    # ``loghub.wire.stored`` the framed entry it expands to
    raw_bytes: int = 0


@dataclass(frozen=True)
class BufferedRead:
    size_bytes: int  # the payloads fill the caller's buffer from index 0 to here
    count: int  # records read
    next_seq: int  # sequence after the last record read (== start when count == 0)
    raw_bytes: int = 0  # as ReadBatch.raw_bytes


@dataclass(frozen=True)
class ShardLogStatistics:
    begin_seq: int
    end_seq: int
    high_watermark_seq: int  # == end_seq unless replicated (see ShardLog.set_replicated)
    segment_count: int
    size_bytes: int  # bytes of the committed records (segment headers not counted)
    fsync_count: int  # fdatasyncs of log files (group commit makes it < append_count)
    append_count: int  # records appended (append and append_raw) since open
    lost_range_count: int  # damaged ranges found (on open or by reads since)
    lost_record_count: int  # records in those ranges


@dataclass
class _PendingAppend:
    payload: bytes
    receive_time_ms: int
    sequence: int = -1
    done: bool = False
    error: StorageError | None = None


class _DamageFound(Exception):
    """A segment failed a check during a read (carried out of the read to rescan it)."""

    def __init__(self, segment: Segment, error: CorruptSegmentError) -> None:
        super().__init__(error.message)
        self.segment = segment
        self.error = error


# A record ready to write: (sequence, receive_time_ms, header, payload).
_Record = tuple[int, int, bytes, bytes]


@dataclass(frozen=True)
class _UndoPoint:
    """Where a batch began, to cut it off again if it fails."""

    segment: Segment
    size_bytes: int
    next_seq: int
    time_ms: int


@dataclass
class StagedAppend:
    """Records written by ``stage_append`` and not yet synced nor published: the holder has
    the shard's writer role and must pass this to ``complete_append`` (or ``abort_append``)."""

    first_seq: int
    records: list[_Record]
    undo: _UndoPoint
    created: list[Segment]


@dataclass
class _ReadState:
    out: bytearray  # the records' payloads (or whole records) packed from index 0
    size_bytes: int = 0  # how much of ``out`` they fill; the rest is scratch
    count: int = 0
    taken_bytes: int = 0


class ShardLog:
    """One shard's durable log. Open with ``ShardLog.open``."""

    def __init__(
        self,
        path: Path,
        config: StorageConfig,
        clock: Clock,
        segments: list[Segment],
        files: FileCache,
        label: str,
        epochs: list[EpochEntry],
    ) -> None:
        assert segments
        self.path = path
        self.label = label  # how messages a client may see name the shard (never a path)
        self._files = files
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._condition = threading.Condition(self._lock)
        self._segments = segments
        self._end_seq = segments[-1].next_seq
        # Replicated mode (set_replicated): the high watermark is kept here, set by the
        # replication layer; otherwise it is end_seq and this field is unused.
        self._replicated = False
        self._high_watermark = self._end_seq
        self._high_watermark_moved = threading.Condition(self._lock)
        # truncate_to waits, with new reads held back, for the reads and the background
        # sync that use the segments it cuts (they notify this while it waits)
        self._truncating = False
        self._syncing = False
        self._pins_released = threading.Condition(self._lock)
        self._epochs = epochs  # the leader-epoch file's entries; replaced, never changed
        self._leader_epoch = epochs[-1][0] if epochs else 0  # what appends are stamped with
        self._last_time_ms = _newest_time_ms(segments)
        self._writer_busy = False
        self._queue: list[_PendingAppend] = []
        self._closed = False
        self._sealed = False
        self._broken: BaseException | None = None
        self._fsync_count = 0
        self._lost: set[tuple[int, int]] = set()  # (first_seq, end_seq) of known lost ranges
        for segment in segments:
            self._note_lost(segment.lost)
        self._append_count = 0
        self._synced_append_count = 0
        self._stop_syncing = threading.Event()
        self._sync_thread: threading.Thread | None = None
        # Called with the new high watermark each time it advances (on a single server with
        # each commit, in replicated mode with each advance_high_watermark that moves it), from
        # that thread with the lock held, so it must be quick and must not call back into this
        # log (the server wakes pulls parked at the end of the shard; call_soon_threadsafe).
        self.end_seq_listener: Callable[[int], None] | None = None
        if config.fsync_policy == "interval":
            self._sync_thread = threading.Thread(
                target=self._sync_periodically, name=f"loghub-fsync {path}", daemon=True
            )
            self._sync_thread.start()

    @classmethod
    def open(
        cls,
        path: Path,
        config: StorageConfig,
        clock: Clock,
        files: FileCache | None = None,
        label: str | None = None,
    ) -> ShardLog:
        """Opens (creating if needed) the shard log in ``path``, recovering its tail.
        ``files`` is the descriptor cache shared by a store's shards (a private one when
        None); ``label`` names the shard in error messages (default: its directory name)."""
        path.mkdir(parents=True, exist_ok=True)
        files = files or FileCache(config.open_files_max)
        bases = segment_base_sequences(path)
        segments: list[Segment] = []
        limits = {
            "index_interval_bytes": config.index_interval_bytes,
            "payload_bytes_max": config.payload_bytes_max,
        }
        try:
            if not bases:
                segments.append(Segment.create(path, 0, files=files, **limits))
                fsync_directory(path)
            for index, base in enumerate(bases):
                segment = Segment.open(path, base, files=files, **limits)
                segments.append(segment)
                if index + 1 < len(bases):
                    segment.check_sealed(bases[index + 1])
                else:
                    cut_bytes = segment.recover()
                    if cut_bytes:
                        logger.warning("shard log %s: recovery cut %d bytes", path, cut_bytes)
            _upgrade_active_segment(path, segments, files, limits)
            epochs = _load_leader_epochs(path, segments)
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        label = label or f"shard {path.name}"
        return cls(path, config, clock, segments, files, label, epochs)

    # --- appending ----------------------------------------------------------------------

    def append(self, payload: bytes, receive_time_ms: int) -> int:
        """Appends one record; returns its sequence once it is durable under the policy."""
        self.check_payload_size(len(payload))
        assert receive_time_ms >= 0
        request = _PendingAppend(payload, receive_time_ms)
        with self._condition:
            self._check_writable()
            self._check_not_sealed()
            self._queue.append(request)
            while not request.done:
                if self._writer_busy:
                    self._condition.wait()
                else:
                    self._lead()
        if request.error is not None:
            raise type(request.error)(request.error.message) from request.error
        return request.sequence

    def _lead(self) -> None:
        """Writes every queued record as one batch. Called with the lock held."""
        batch, self._queue = self._queue, []
        self._writer_busy = True
        try:
            self._check_writable()
            self._check_not_sealed()
            records = []
            time_ms = self._last_time_ms
            for offset, request in enumerate(batch):
                time_ms = max(time_ms, request.receive_time_ms)
                request.sequence = self._end_seq + offset
                records.append((request.sequence, time_ms, b"", request.payload))
            epoch = self._leader_epoch
            self._commit(records, epoch, self._epoch_change(epoch))
        except StorageError as exc:
            for request in batch:
                request.error = exc
        except Exception as exc:
            error = StorageError(f"append failed: {exc!r}")
            error.__cause__ = exc
            for request in batch:
                request.error = error
        finally:
            for request in batch:
                request.done = True
            self._writer_busy = False
            self._condition.notify_all()

    def check_payload_size(self, size_bytes: int) -> None:
        """Raises RecordTooLargeError for a payload this log would refuse."""
        if size_bytes > self._config.payload_bytes_max:
            raise RecordTooLargeError(
                f"payload of {size_bytes} bytes over the limit of {self._config.payload_bytes_max}"
            )

    def stage_append(self, payloads: list[tuple[bytes, int]]) -> StagedAppend:
        """First half of a batched append of ``(payload, receive_time_ms)`` records: waits for
        the writer role, numbers the records and writes them with one write per segment,
        without syncing or publishing them. On success the caller holds the writer role until
        ``complete_append`` or ``abort_append``; on failure the batch is cut off again, the
        role released, and DiskFullError, StorageError or LogSealedError raised. Payload
        sizes must have passed ``check_payload_size``."""
        assert payloads
        with self._condition:
            self._acquire_writer()
            try:
                self._check_not_sealed()
                first_seq, time_ms = self._end_seq, self._last_time_ms
                epoch = self._leader_epoch
                epoch_change = self._epoch_change(epoch)
                records: list[_Record] = []
                for offset, (payload, receive_time_ms) in enumerate(payloads):
                    assert len(payload) <= self._config.payload_bytes_max
                    time_ms = max(time_ms, receive_time_ms)
                    records.append((first_seq + offset, time_ms, b"", payload))
                undo = self._undo_point()
            except BaseException:
                self._release_writer()
                raise
        created: list[Segment] = []
        try:
            self._record_epochs(epoch_change)
            framed = self._framed(records, epoch)
            self._write_batch(framed, created, sync=False)
        except BaseException as exc:
            with self._condition:
                try:
                    self._undo(undo, created, exc)
                finally:
                    self._release_writer()
        return StagedAppend(first_seq, framed, undo, created)

    def complete_append(self, staged: StagedAppend) -> int:
        """Second half: syncs the staged records (under "always"), publishes them and
        releases the writer role; returns the first one's sequence. A failed sync cuts the
        batch off and raises as ``stage_append`` does."""
        try:
            if self._config.fsync_policy == "always":
                self._sync(self._segments[-1])  # the writer role keeps the list as it is
        except BaseException as exc:
            with self._condition:
                try:
                    self._undo(staged.undo, staged.created, exc)
                finally:
                    self._release_writer()
        with self._condition:
            try:
                self._publish(staged.records, staged.undo.segment, staged.created)
            finally:
                self._release_writer()
        return staged.first_seq

    def abort_append(self, staged: StagedAppend) -> None:
        """Cuts staged records off again and releases the writer role (the caller could not
        complete them, e.g. it is shutting down)."""
        with self._condition:
            try:
                self._roll_back_batch(staged.undo, staged.created)
            finally:
                self._release_writer()

    def append_raw(self, records: bytes) -> int:
        """Appends framed records (as ``read_raw`` returns them) after checking each one's
        framing, CRC and sequence continuity; returns the new end_seq once durable."""
        parsed = self._parse_raw(records)
        with self._condition:
            self._acquire_writer()
            try:
                self._check_not_sealed()
                expected = self._end_seq
                time_ms = self._last_time_ms
                epoch_last = self._epochs[-1][0] if self._epochs else -1
                epoch_changes: list[EpochEntry] = []
                for sequence, receive_time_ms, header, _payload in parsed:
                    epoch = HEADER.unpack(header)[2]
                    if sequence != expected or receive_time_ms < time_ms or epoch < epoch_last:
                        raise StorageError(
                            f"raw record {sequence} (time {receive_time_ms}, epoch {epoch}) does "
                            f"not follow sequence {expected - 1} (time {time_ms}, epoch "
                            f"{epoch_last})"
                        )
                    if epoch > epoch_last:
                        epoch_changes.append((epoch, sequence))
                    expected += 1
                    time_ms, epoch_last = receive_time_ms, epoch
                if parsed:
                    self._commit(parsed, self._leader_epoch, epoch_changes)
                return self._end_seq
            finally:
                self._release_writer()

    def _parse_raw(self, records: bytes) -> list[_Record]:
        view = memoryview(records)
        parsed: list[_Record] = []
        position = 0
        while position < len(view):
            if len(view) - position < HEADER_BYTES:
                raise CorruptSegmentError(f"raw records: incomplete header at {position}")
            fields = HEADER.unpack_from(view, position)
            sequence = fields[3]
            problem = check_header(fields, sequence, self._config.payload_bytes_max)
            end = position + HEADER_BYTES + fields[5]
            if problem is None and end > len(view):
                problem = "incomplete record"
            if problem is None and not record_crc_matches(view[position:end]):
                problem = "CRC mismatch"
            if problem is not None:
                raise CorruptSegmentError(f"raw records at {position}: {problem}")
            header = bytes(view[position : position + HEADER_BYTES])
            parsed.append((sequence, fields[4], header, bytes(view[position + HEADER_BYTES : end])))
            position = end
        return parsed

    def _commit(self, records: list[_Record], epoch: int, epoch_changes: list[EpochEntry]) -> None:
        """Writes and syncs ``records`` (headers made here with ``epoch`` when empty), then
        publishes them; ``epoch_changes`` go to the leader-epoch file first. Called with the
        lock and the writer role held; drops the lock during I/O."""
        undo = self._undo_point()
        created: list[Segment] = []
        self._condition.release()
        try:
            self._record_epochs(epoch_changes)
            self._write_batch(
                self._framed(records, epoch), created, sync=self._config.fsync_policy == "always"
            )
        except BaseException as exc:
            self._condition.acquire()
            self._undo(undo, created, exc)
        self._condition.acquire()
        self._publish(records, undo.segment, created)

    def _undo_point(self) -> _UndoPoint:
        segment = self._segments[-1]
        return _UndoPoint(segment, segment.size_bytes, segment.next_seq, self._last_time_ms)

    @staticmethod
    def _framed(records: list[_Record], epoch: int) -> list[_Record]:
        return [
            (sequence, time_ms, header or encode_header(sequence, time_ms, payload, epoch), payload)
            for sequence, time_ms, header, payload in records
        ]

    def _epoch_change(self, epoch: int) -> list[EpochEntry]:
        """The leader-epoch entry a batch stamped with ``epoch`` starts, if any (lock and
        writer role held): one comparison per batch, a file write once per epoch."""
        if self._epochs and self._epochs[-1][0] == epoch:
            return []
        return [(epoch, self._end_seq)]

    def _record_epochs(self, epoch_changes: list[EpochEntry]) -> None:
        """Writes the leader-epoch file with ``epoch_changes`` before the records they
        describe (writer role held, lock not held): no durable record lacks its entry."""
        if not epoch_changes:
            return
        begin_seq = self._segments[0].base_seq  # retention waits for the writer role
        epochs = fit_to_log(merge_epoch_starts(self._epochs, epoch_changes), begin_seq, 2**64)
        write_leader_epochs(self.path, epochs)
        with self._lock:
            self._epochs = epochs

    def _undo(self, undo: _UndoPoint, created: list[Segment], exc: BaseException) -> NoReturn:
        """Cuts a failed batch off (lock held) and raises what its failure means."""
        if not isinstance(exc, Exception):
            raise exc
        self._roll_back_batch(undo, created)
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE_ERRNOS:
            logger.error("shard log %s: out of space, write refused: %r", self.path, exc)
            raise DiskFullError(f"no space left on the server's disk for {self.label}") from exc
        raise StorageError(f"{self.path}: write failed: {exc!r}") from exc

    def _roll_back_batch(self, undo: _UndoPoint, created: list[Segment]) -> None:
        self._roll_back(undo.segment, undo.size_bytes, undo.next_seq, created)
        self._last_time_ms = undo.time_ms

    def _publish(self, records: list[_Record], first: Segment, created: list[Segment]) -> None:
        """Makes written and synced records readable (lock held)."""
        for segment in [first, *created]:
            segment.committed_size_bytes = segment.size_bytes
        self._end_seq = records[-1][0] + 1
        self._last_time_ms = records[-1][1]
        self._append_count += len(records)
        if self._replicated:
            return  # the high watermark waits for the replicas (advance_high_watermark)
        self._high_watermark_moved.notify_all()
        if self.end_seq_listener is not None:
            self.end_seq_listener(self._end_seq)

    def _write_batch(self, records: list[_Record], created: list[Segment], sync: bool) -> None:
        """One write per segment touched; rolls when the active segment would overflow."""
        segment = self._segments[-1]
        chunk: list[_Record] = []
        chunk_bytes = 0
        for record in records:
            record_bytes = HEADER_BYTES + len(record[3])
            size_after = segment.size_bytes + chunk_bytes + record_bytes
            holds_records = segment.size_bytes + chunk_bytes > segment.data_start
            if holds_records and size_after > self._config.segment_bytes_max:
                self._write_chunk(segment, chunk)
                segment = self._roll(segment, record[0])
                created.append(segment)
                chunk, chunk_bytes = [], 0
            chunk.append(record)
            chunk_bytes += record_bytes
        self._write_chunk(segment, chunk)
        if sync:
            self._sync(segment)

    def _write_chunk(self, segment: Segment, chunk: list[_Record]) -> None:
        if not chunk:
            return
        placements = segment.write(chunk)
        with self._lock:
            segment.index(placements)

    def _roll(self, segment: Segment, base_seq: int) -> Segment:
        """Seals ``segment`` and starts a new one at ``base_seq`` (writer role, no lock)."""
        assert base_seq == segment.next_seq
        segment.seal()
        with self._lock:
            self._fsync_count += 1
        new_segment = Segment.create(
            self.path,
            base_seq,
            index_interval_bytes=self._config.index_interval_bytes,
            payload_bytes_max=self._config.payload_bytes_max,
            files=self._files,
        )
        new_segment.next_seq = base_seq
        with self._lock:
            self._segments.append(new_segment)
        fsync_directory(self.path)
        return new_segment

    def _sync(self, segment: Segment) -> None:
        started_s = time.perf_counter()
        segment.sync()
        self._observe_fsync(started_s)
        with self._lock:
            self._fsync_count += 1

    def _observe_fsync(self, started_s: float) -> None:
        observer = self._config.fsync_observer
        if observer is not None:
            observer(time.perf_counter() - started_s)

    def _roll_back(
        self, segment: Segment, size_bytes: int, next_seq: int, created: list[Segment]
    ) -> None:
        """Removes every byte of a failed batch (lock held). If even that fails, the shard
        log refuses further writes: its files no longer match what it believes."""
        try:
            for new_segment in created:
                self._segments.remove(new_segment)
                new_segment.delete_files()
                new_segment.close()
            segment.truncate(size_bytes, next_seq)
            if created:
                fsync_directory(self.path)
        except OSError as exc:
            logger.error("shard log %s: roll back failed, refusing writes: %r", self.path, exc)
            self._broken = exc

    # --- truncation (a follower's log) -----------------------------------------------------

    def truncate_to(self, seq: int) -> int:
        """Cuts every record with sequence >= ``seq``, durably, and returns the new end_seq:
        a follower whose epoch lineage left the leader's drops its own tail before it copies
        the leader's (Kafka's log truncation, KIP-101). ``seq == end_seq`` changes nothing;
        outside [begin_seq, end_seq] is SequenceOutOfRangeError; a sealed log refuses
        (LogSealedError). When ``seq`` falls inside a range lost to damage, the cut goes to
        where that range begins (its bytes cannot be told apart record by record), so the
        end returned may be below ``seq``; the follower copies those records again.

        Takes the writer role, holds back new reads and waits for those under way in the
        segments it cuts (so that none returns a mix of the old tail and what is appended
        after), then, under the lock, in an order that a crash at any point leaves a prefix
        of the old log whose leader-epoch file fits it:

        1. the later segments are unlinked, newest first, the directory fsynced after each
           (a crash leaves the log cut at a segment boundary, never with a gap);
        2. the segment holding ``seq`` is cut (ftruncate, fdatasync);
        3. the leader-epoch file is written without the entries at or after the new end.

        A crash before 3 leaves entries for records that are gone, which ``open`` drops from
        the file (as it does for an epoch whose first batch never became durable). Writing
        the file first would be worse: a crash before the cut would leave records whose
        epoch has no entry, taken for the previous epoch's with nothing to tell. The end,
        the last receive time, the epochs and (in replicated mode) the high watermark are
        updated in memory before the I/O, so when it fails the log refuses writes (the files
        may not match; reopening recovers one of those prefixes) but serves reads of what
        remains. Readers between seq and the old end see SequenceOutOfRangeError next."""
        with self._condition:
            self._acquire_writer()
            try:
                self._check_not_sealed()
                self._check_cursor(seq)
                if seq == self._end_seq:
                    return seq
                index = self._segment_index(seq)
                self._truncating = True
                try:
                    while self._syncing or any(s.pins for s in self._segments[index:]):
                        self._pins_released.wait()
                    self._truncate(index, seq)
                finally:
                    self._truncating = False
                    self._pins_released.notify_all()
                return self._end_seq
            finally:
                self._release_writer()

    def _truncate(self, index: int, seq: int) -> None:
        """``truncate_to``'s work (lock and writer role held, no read in the segments from
        ``index`` on, nothing written that is not published)."""
        segment = self._segments[index]
        position, end_seq = self._cut_point(segment, seq)
        doomed = self._segments[index + 1 :]
        del self._segments[index + 1 :]
        old_end_seq = self._end_seq
        self._end_seq = end_seq
        self._high_watermark = min(self._high_watermark, end_seq)
        self._lost = {item for item in self._lost if item[0] < end_seq}
        self._epochs = fit_to_log(self._epochs, self._segments[0].base_seq, end_seq)
        try:
            for old in reversed(doomed):
                old.delete_files()
                fsync_directory(self.path)
            segment.truncate(position, end_seq)
            self._fsync_count += 1
            if not segment.current_format:  # new records go into the current format, as after open
                _upgrade_active_segment(self.path, self._segments, self._files, self._limits())
            write_leader_epochs(self.path, self._epochs)
        except OSError as exc:
            logger.error("shard log %s: truncation failed, refusing writes: %r", self.path, exc)
            self._broken = exc
            raise StorageError(f"{self.path}: truncation failed: {exc!r}") from exc
        finally:
            for old in doomed:
                self._retire(old)
            self._last_time_ms = _newest_time_ms(self._segments)
        logger.warning(
            "shard log %s: truncated to %d (records %d..%d cut, %d segments deleted)",
            self.path,
            end_seq,
            end_seq,
            old_end_seq - 1,
            len(doomed),
        )

    def _cut_point(self, segment: Segment, seq: int) -> tuple[int, int]:
        """(byte position, sequence) where ``segment`` is cut for ``truncate_to(seq)``: the
        start of record ``seq``, or of the lost range holding it. A record or index entry
        that fails its checks on the way makes it rescan the segment once and ask again."""
        for attempt in (0, 1):
            lost = segment.lost_range_at(seq)
            if lost is not None:
                return lost.position, lost.first_seq
            try:
                return segment.position_of(seq), seq
            except CorruptSegmentError as exc:
                if attempt:
                    raise
                logger.error("shard log %s: %s; rescanning the segment", self.path, exc.message)
                try:
                    self._note_lost(segment.rescan())
                except OSError as scan_error:
                    raise StorageError(f"{self.path}: rescan failed: {scan_error!r}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _limits(self) -> dict[str, int]:
        return {
            "index_interval_bytes": self._config.index_interval_bytes,
            "payload_bytes_max": self._config.payload_bytes_max,
        }

    # --- the writer role ----------------------------------------------------------------

    def _acquire_writer(self) -> None:
        """Waits for the writer role (lock held)."""
        while self._writer_busy:
            self._condition.wait()
        self._check_writable()
        self._writer_busy = True

    def _release_writer(self) -> None:
        self._writer_busy = False
        self._condition.notify_all()

    def _check_not_sealed(self) -> None:
        if self._sealed:
            raise LogSealedError(f"{self.label} is read-only")

    # --- sealing --------------------------------------------------------------------------

    @property
    def sealed(self) -> bool:
        with self._lock:
            return self._sealed

    def seal(self) -> int:
        """Makes the log read-only for good and returns its end sequence, which never moves
        again. Waits for the batch being written (it completes and counts), fails queued and
        later appends with LogSealedError, and syncs, so the end survives a crash under either
        fsync policy. Idempotent; the sealed state is not stored here: whoever keeps the
        shard's status (metadata) seals the log again after a restart."""
        with self._condition:
            self._acquire_writer()
            try:
                if not self._sealed:
                    self._sealed = True
                    for request in self._queue:
                        request.error = LogSealedError(f"{self.label} became read-only")
                        request.done = True
                    self._queue = []
                    self._segments[-1].sync()
                    self._fsync_count += 1
                return self._end_seq
            finally:
                self._release_writer()

    def unseal(self) -> None:
        """Undoes ``seal`` when the change that sealed the log could not be committed."""
        with self._condition:
            self._sealed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError(f"shard log {self.path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._broken is not None:
            raise StorageError(f"shard log {self.path} refuses writes: {self._broken!r}")

    def _sync_periodically(self) -> None:
        """The interval policy's background fdatasync. Pins the descriptor in the file cache,
        so that a concurrent roll or close cannot pull it from under it."""
        interval_s = self._config.fsync_interval_ms / 1000
        while not self._stop_syncing.wait(interval_s):
            with self._lock:
                if self._closed:
                    return
                if self._append_count == self._synced_append_count or self._truncating:
                    continue
                append_count = self._append_count
                log_path = self._segments[-1].path
                fd = self._files.acquire(log_path)
                self._syncing = True  # truncate_to waits for it before it unlinks the file
            synced = False
            try:
                started_s = time.perf_counter()
                os.fdatasync(fd)
                synced = True
                self._observe_fsync(started_s)
            except OSError as exc:
                logger.error("shard log %s: background fdatasync failed: %r", self.path, exc)
            finally:
                self._files.release(log_path)
                with self._lock:
                    self._syncing = False
                    self._pins_released.notify_all()
                    if synced:
                        self._fsync_count += 1
                        self._synced_append_count = max(self._synced_append_count, append_count)

    # --- reading ------------------------------------------------------------------------

    def read(
        self, start_seq: int, count_max: int, bytes_max: int, end_seq: int | None = None
    ) -> ReadBatch:
        """Payloads of records [start_seq, min(end_seq, self.high_watermark_seq)), at most
        ``count_max`` of them and about ``bytes_max`` bytes (at least one record when any is
        available; an lz4 entry of ``loghub.wire.stored`` counts as the framed entry it
        expands to, so that the limit is in the bytes a reader gets)."""
        state = self._read(bytearray(), start_seq, count_max, bytes_max, end_seq, raw=False)
        del state.out[state.size_bytes :]
        return ReadBatch(bytes(state.out), state.count, start_seq + state.count, state.taken_bytes)

    def read_into(
        self,
        out: bytearray,
        start_seq: int,
        count_max: int,
        bytes_max: int,
        end_seq: int | None = None,
    ) -> BufferedRead:
        """What ``read`` returns, with the payloads packed at the start of ``out`` instead of
        in new bytes; ``out`` grows when it is too small and its bytes after the payloads are
        scratch. A caller that keeps its buffers between reads spares every read the
        allocation (and page faults) of a new block. ``out`` must have no exported views."""
        state = self._read(out, start_seq, count_max, bytes_max, end_seq, raw=False)
        return BufferedRead(
            state.size_bytes, state.count, start_seq + state.count, state.taken_bytes
        )

    def read_raw(self, start_seq: int, bytes_max: int) -> bytes:
        """Framed records (headers included) from ``start_seq``, about ``bytes_max`` bytes
        (at least one record when any is available), for a follower's ``append_raw``. Up to
        end_seq, not the high watermark: a follower must copy records before they count as
        committed (Kafka's follower fetch)."""
        state = self._read(bytearray(), start_seq, 2**63, bytes_max, None, raw=True)
        del state.out[state.size_bytes :]
        return bytes(state.out)

    def _read(
        self,
        out: bytearray,
        start_seq: int,
        count_max: int,
        bytes_max: int,
        end_seq: int | None,
        *,
        raw: bool,
    ) -> _ReadState:
        """Reads once; when a segment fails its checks on the way, rescans it (which notes
        the damage and rebuilds its indexes) and reads once more."""
        assert count_max >= 0 and bytes_max >= 0
        try:
            return self._read_once(out, start_seq, count_max, bytes_max, end_seq, raw=raw)
        except _DamageFound as damage:
            self._rescan(damage.segment, damage.error)
        try:
            return self._read_once(out, start_seq, count_max, bytes_max, end_seq, raw=raw)
        except _DamageFound as damage:
            raise damage.error from None

    def _read_once(
        self,
        out: bytearray,
        start_seq: int,
        count_max: int,
        bytes_max: int,
        end_seq: int | None,
        *,
        raw: bool,
    ) -> _ReadState:
        state = _ReadState(out)
        with self._lock:
            while self._truncating:  # its segments are being cut: read what remains after
                self._pins_released.wait()
            self._check_open()
            self._check_cursor(start_seq)
            # consumers never see past the high watermark; a follower copies up to the end
            limit_seq = self._end_seq if raw else self._high_watermark_seq()
            stop_seq = limit_seq if end_seq is None else min(end_seq, limit_seq)
            if count_max == 0 or start_seq >= stop_seq:
                return state
            plans = self._plan_reads(start_seq, stop_seq)
        try:
            for segment, plan in plans:
                try:
                    count, taken_bytes, state.size_bytes = segment.read_into(
                        segment.read_fd,
                        plan,
                        count_max - state.count,
                        bytes_max - state.taken_bytes,
                        out,
                        state.size_bytes,
                        raw=raw,
                        take_first=not state.count,
                    )
                except CorruptSegmentError as exc:
                    raise _DamageFound(segment, exc) from exc
                state.count += count
                state.taken_bytes += taken_bytes
                if count < plan.stop_seq - plan.start_seq:
                    break  # a limit was reached inside this segment
        finally:
            with self._lock:
                for segment, _plan in plans:
                    self._unpin(segment)
        return state

    def _plan_reads(self, start_seq: int, stop_seq: int) -> list[tuple[Segment, ReadPlan]]:
        """Pins and plans every segment the read may touch (lock held). The read stops
        before a lost range; one starting inside a lost range raises RecordsLostError."""
        plans: list[tuple[Segment, ReadPlan]] = []
        index = self._segment_index(start_seq)
        sequence = start_seq
        while sequence < stop_seq:
            segment = self._segments[index]
            segment_stop = stop_seq
            if index + 1 < len(self._segments):
                segment_stop = min(stop_seq, self._segments[index + 1].base_seq)
            lost = segment.first_lost_at_or_after(sequence)
            if lost is not None and lost.first_seq <= sequence:
                if not plans:
                    raise self._data_corrupted(lost)
                break
            if lost is not None and lost.first_seq < segment_stop:
                segment_stop = stop_seq = lost.first_seq
            if sequence < segment_stop:
                plan = segment.plan_read(sequence, segment_stop)
                self._pin(segment)
                plans.append((segment, plan))
            sequence = segment_stop
            index += 1
        return plans

    def _data_corrupted(self, lost: LostRange) -> RecordsLostError:
        return RecordsLostError(
            f"records {lost.first_seq}..{lost.end_seq - 1} of {self.label} were lost to damage "
            f"on disk; reading can resume at sequence {lost.end_seq}",
            first_seq=lost.first_seq,
            end_seq=lost.end_seq,
        )

    def _rescan(self, segment: Segment, error: CorruptSegmentError) -> None:
        """Takes the writer role (so that no append moves the segment meanwhile) and rescans
        ``segment``, which failed a check: notes its damaged ranges and rebuilds its indexes
        (a wrong index entry alone is put right this way)."""
        logger.error("shard log %s: %s; rescanning the segment", self.path, error.message)
        with self._condition:
            while self._writer_busy:
                self._condition.wait()
            self._check_open()
            if segment.retired:
                return
            self._writer_busy = True
            try:
                self._note_lost(segment.rescan())
            except OSError as exc:
                raise StorageError(f"{self.path}: rescan failed: {exc!r}") from exc
            finally:
                self._release_writer()

    def _note_lost(self, lost: list[LostRange]) -> None:
        """Counts newly found damaged ranges (lock held, or during open)."""
        for item in lost:
            key = (item.first_seq, item.end_seq)
            if key not in self._lost:
                self._lost.add(key)
                logger.error(
                    "shard log %s: %d records (%d..%d) lost to damage on disk",
                    self.path,
                    item.record_count,
                    item.first_seq,
                    item.end_seq - 1,
                )

    def lost_ranges(self) -> list[tuple[int, int]]:
        """The known damaged ranges [first_seq, end_seq), ascending."""
        with self._lock:
            return sorted(self._lost)

    def _pin(self, segment: Segment) -> None:
        """Pins the segment and its log's descriptor for a read (lock held): retention may
        unlink the file meanwhile, but the descriptor stays open until the last unpin."""
        if segment.pins == 0:
            segment.read_fd = self._files.acquire(segment.path)
        segment.pins += 1

    def _unpin(self, segment: Segment) -> None:
        segment.pins -= 1
        if self._truncating:
            self._pins_released.notify_all()
        if segment.pins == 0:
            self._files.release(segment.path)
            segment.read_fd = -1
            if segment.retired:
                segment.close()

    def _retire(self, segment: Segment) -> None:
        """Closes the segment's descriptors now or at its last reader's unpin (lock held)."""
        segment.retired = True
        if segment.pins == 0:
            segment.close()

    def _segment_index(self, sequence: int) -> int:
        bases = [segment.base_seq for segment in self._segments]
        index = bisect.bisect_right(bases, sequence) - 1
        assert index >= 0
        return index

    def _check_cursor(self, sequence: int) -> None:
        begin_seq = self._segments[0].base_seq
        if not begin_seq <= sequence <= self._end_seq:
            raise SequenceOutOfRangeError(
                f"sequence {sequence} is outside [{begin_seq}, {self._end_seq}] of {self.label}"
            )

    # --- positions and times --------------------------------------------------------------

    @property
    def begin_seq(self) -> int:
        with self._lock:
            return self._segments[0].base_seq

    @property
    def end_seq(self) -> int:
        """One past the last record written and synced under the policy (Kafka's log end
        offset). Writers and followers use it; readers use ``high_watermark_seq``."""
        with self._lock:
            return self._end_seq

    @property
    def high_watermark_seq(self) -> int:
        """One past the last committed record: what consumers may read and where the "end"
        cursor points. Never above end_seq nor below begin_seq; it goes back only when
        ``truncate_to`` cuts committed records (an unclean leader election)."""
        with self._lock:
            return self._high_watermark_seq()

    def _high_watermark_seq(self) -> int:
        """The high watermark (lock held). On a single server every record that is durable
        under the policy is committed, so it is end_seq; in replicated mode the replication
        layer sets it (Kafka's least end offset of the in-sync replicas)."""
        return self._high_watermark if self._replicated else self._end_seq

    @property
    def is_replicated(self) -> bool:
        """Whether the high watermark is set from outside (``set_replicated``)."""
        with self._lock:
            return self._replicated

    def set_replicated(self, initial_high_watermark_seq: int) -> None:
        """Keeps the high watermark apart from end_seq from now on: appends no longer move
        it, ``advance_high_watermark`` does. It starts at ``initial_high_watermark_seq``
        (what the replication layer knows to be committed, e.g. from its checkpoint) within
        [begin_seq, end_seq]. Not stored: whoever replicates the shard calls this again after
        each open. Called again, it only advances the high watermark (which never goes back)."""
        assert initial_high_watermark_seq >= 0
        with self._lock:
            self._check_open()
            if self._replicated:
                self._advance_high_watermark(initial_high_watermark_seq)
                return
            begin_seq = self._segments[0].base_seq
            self._high_watermark = max(begin_seq, min(initial_high_watermark_seq, self._end_seq))
            self._replicated = True

    def advance_high_watermark(self, seq: int) -> int:
        """Moves the high watermark of a replicated log to ``min(seq, end_seq)`` when that is
        higher (it never goes back: a stale or reordered update is ignored) and returns the one
        in force. A move wakes ``wait_for_high_watermark`` and calls ``end_seq_listener``,
        so that pulls parked at the end of the shard see the newly committed records. On a
        log not in replicated mode the high watermark is end_seq already: nothing changes."""
        with self._lock:
            self._check_open()
            if not self._replicated:
                return self._end_seq
            return self._advance_high_watermark(seq)

    def _advance_high_watermark(self, seq: int) -> int:
        target = min(seq, self._end_seq)
        if target > self._high_watermark:
            self._high_watermark = target
            self._high_watermark_moved.notify_all()
            if self.end_seq_listener is not None:
                self.end_seq_listener(target)
        return self._high_watermark

    def wait_for_high_watermark(self, seq: int, timeout_s: float | None = None) -> int:
        """Waits until the high watermark reaches ``seq`` (every record below it committed:
        a producer waiting for acknowledgement from all in-sync replicas), at most
        ``timeout_s`` (None: no limit); returns the high watermark in force, below ``seq``
        when the time ran out. StorageClosedError when the log closes meanwhile."""
        with self._lock:
            self._check_open()
            self._high_watermark_moved.wait_for(
                lambda: self._closed or self._high_watermark_seq() >= seq, timeout_s
            )
            self._check_open()
            return self._high_watermark_seq()

    # --- leader epochs --------------------------------------------------------------------

    @property
    def leader_epoch(self) -> int:
        """The epoch that appends are stamped with (0 on a single server)."""
        with self._lock:
            return self._leader_epoch

    def set_leader_epoch(self, epoch: int) -> None:
        """Stamps later appends with ``epoch`` (this log's node became the shard's leader in
        it). The leader-epoch file gets the epoch's entry with its first record. Epochs only
        go up: an older one means the caller acts on a stale leadership."""
        assert 0 <= epoch <= _EPOCH_MAX
        with self._lock:
            assert epoch >= self._leader_epoch, (epoch, self._leader_epoch)
            self._leader_epoch = epoch

    def leader_epochs(self) -> list[EpochEntry]:
        """(epoch, first sequence) of every epoch of the retained records, ascending."""
        with self._lock:
            return fit_to_log(self._epochs, self._segments[0].base_seq, self._end_seq)

    def receive_time_ms(self, seq: int) -> int:
        """The receive time of record ``seq``; at or past the high watermark (the "end"
        cursor; in replicated mode, records not yet committed), the newest committed
        record's (or the clock's when there is none). Read from the record's own header, so
        a damaged time index cannot give a wrong answer; a lost record raises
        RecordsLostError (for the end behind a lost record, the newest time the indexes
        know stands in)."""
        for attempt in (0, 1):
            with self._lock:
                self._check_open()
                self._check_cursor(seq)
                visible_end = self._high_watermark_seq()
                at_end = seq >= visible_end
                if at_end and self._segments[0].base_seq == visible_end:
                    return self._clock.wall_ms()
                target = visible_end - 1 if at_end else seq
                segment = self._segments[self._segment_index(target)]
                lost = segment.lost_range_at(target)
                if lost is not None:
                    if at_end and visible_end == self._end_seq:
                        return self._last_time_ms
                    if at_end:  # uncommitted records follow: the indexes up to the lost one
                        return _newest_time_ms(self._segments[: self._segment_index(target) + 1])
                    raise self._data_corrupted(lost)
                try:
                    return segment.read_time_ms(target)
                except CorruptSegmentError as exc:
                    if attempt:
                        raise
                    error = exc
            self._rescan(segment, error)
        raise AssertionError("unreachable")  # pragma: no cover

    def seq_for_time(self, time_ms: int) -> int:
        """The first retained committed record whose receive time is >= ``time_ms``, else the
        high watermark (end_seq on a single server): a cursor for consumers, who see nothing
        past it. The time index's answer is checked against the records' own headers; when
        they disagree, the segment is rescanned (its indexes rebuilt) and asked again."""
        for segment in self._segments_snapshot():
            found = self._seq_for_time_in(segment, time_ms)
            if found is None:
                self._rescan(segment, CorruptSegmentError(f"{segment.path}: time index is wrong"))
                found = self._seq_for_time_in(segment, time_ms)
                if found is None:
                    raise StorageError(f"{segment.path}: time index still wrong after a rescan")
            if found >= 0:
                return found
        with self._lock:
            return self._high_watermark_seq()

    def _seq_for_time_in(self, segment: Segment, time_ms: int) -> int | None:
        """The answer within ``segment`` (at most the high watermark): a sequence, -1 when
        every record in it is older, None when its time index disagrees with its records."""
        with self._lock:
            self._check_open()
            if segment.retired:
                return -1
            visible_end = self._high_watermark_seq()
            if segment.base_seq >= visible_end:
                return visible_end
            max_time_ms = segment.max_time_ms
            if max_time_ms is None or max_time_ms < time_ms:
                return -1
            relative_sequence = segment.time_index.first_at_or_after(time_ms)
            assert relative_sequence is not None
            found = min(segment.base_seq + relative_sequence, self._end_seq)
            if not self._time_answer_holds(segment, found, time_ms):
                return None
            return min(found, visible_end)  # times never go back: nothing committed is newer

    def _segments_snapshot(self) -> list[Segment]:
        with self._lock:
            return list(self._segments)

    def _time_answer_holds(self, segment: Segment, found: int, time_ms: int) -> bool:
        """Whether record ``found`` has a time >= ``time_ms`` and the intact record before it
        in the segment (if any) one < ``time_ms`` (lock held)."""
        try:
            if found < segment.next_seq and segment.read_time_ms(found) < time_ms:
                return False
            previous = found - 1
            if previous < segment.base_seq or segment.lost_range_at(previous) is not None:
                return True
            return segment.read_time_ms(previous) < time_ms
        except CorruptSegmentError:
            return False

    # --- retention ------------------------------------------------------------------------

    def apply_retention(self, now_ms: int, ttl_ms: int) -> int:
        """Deletes whole segments from the front whose newest record is older than
        ``now_ms - ttl_ms``, the active one too (after rolling an empty one at end_seq).
        In replicated mode only segments below the high watermark go (as in Kafka), so that
        begin_seq never passes it and records not yet on every replica stay. Returns the
        number of segments deleted."""
        assert ttl_ms >= 0
        cutoff_ms = now_ms - ttl_ms
        with self._condition:
            self._acquire_writer()
            try:
                active = self._segments[-1]
                if (
                    active.record_count > 0
                    and _expired(active, cutoff_ms)
                    and active.next_seq <= self._high_watermark_seq()
                ):
                    self._roll_empty(active)
                doomed = self._take_expired(cutoff_ms)
                if doomed:
                    self._delete(doomed)
                return len(doomed)
            except OSError as exc:
                raise StorageError(f"{self.path}: retention failed: {exc!r}") from exc
            finally:
                self._release_writer()

    def _roll_empty(self, active: Segment) -> None:
        """Starts an empty segment at end_seq so that the active one can be deleted and
        sequences never go back (writer role and lock held; drops the lock for the I/O)."""
        self._condition.release()
        try:
            active.seal()
            new_segment = Segment.create(
                self.path,
                active.next_seq,
                index_interval_bytes=self._config.index_interval_bytes,
                payload_bytes_max=self._config.payload_bytes_max,
                files=self._files,
            )
            new_segment.next_seq = active.next_seq
            fsync_directory(self.path)
        finally:
            self._condition.acquire()
        self._fsync_count += 1
        self._segments.append(new_segment)

    def _take_expired(self, cutoff_ms: int) -> list[Segment]:
        doomed = []
        while (
            len(self._segments) > 1
            and _expired(self._segments[0], cutoff_ms)
            and self._segments[0].next_seq <= self._high_watermark_seq()
        ):
            doomed.append(self._segments.pop(0))
        return doomed

    def _delete(self, doomed: list[Segment]) -> None:
        """Unlinks segments already removed from the list, front first (lock held)."""
        for segment in doomed:
            segment.delete_files()
            self._retire(segment)
        fsync_directory(self.path)
        logger.info(
            "shard log %s: retention deleted %d segments, begin_seq %d",
            self.path,
            len(doomed),
            self._segments[0].base_seq,
        )

    # --- the rest ---------------------------------------------------------------------------

    def statistics(self) -> ShardLogStatistics:
        with self._lock:
            return ShardLogStatistics(
                begin_seq=self._segments[0].base_seq,
                end_seq=self._end_seq,
                high_watermark_seq=self._high_watermark_seq(),
                segment_count=len(self._segments),
                size_bytes=sum(
                    segment.committed_size_bytes - segment.data_start for segment in self._segments
                ),
                fsync_count=self._fsync_count,
                append_count=self._append_count,
                lost_range_count=len(self._lost),
                lost_record_count=sum(end - first for first, end in self._lost),
            )

    def close(self) -> None:
        """Fails queued appends with StorageClosedError, syncs and closes. Idempotent."""
        with self._condition:
            if self._closed:
                return
            while self._writer_busy:
                self._condition.wait()
            self._closed = True
            for request in self._queue:
                request.error = StorageClosedError(f"shard log {self.path} is closed")
                request.done = True
            self._queue = []
            self._condition.notify_all()
            self._high_watermark_moved.notify_all()
        self._stop_syncing.set()
        if self._sync_thread is not None:
            self._sync_thread.join()
        with self._lock:
            try:
                if self._config.fsync_policy == "interval" and self._broken is None:
                    self._segments[-1].sync()
                    self._fsync_count += 1
            finally:
                for segment in self._segments:
                    self._retire(segment)


def _newest_time_ms(segments: list[Segment]) -> int:
    """The newest receive time the segments' time indexes know, 0 when they hold no record."""
    for segment in reversed(segments):
        if segment.max_time_ms is not None:
            return segment.max_time_ms
    return 0


def _expired(segment: Segment, cutoff_ms: int) -> bool:
    """Whether every record of ``segment`` is older than the cut-off (true when empty)."""
    max_time_ms = segment.max_time_ms
    return max_time_ms is None or max_time_ms < cutoff_ms


def _upgrade_active_segment(
    path: Path, segments: list[Segment], files: FileCache, limits: dict[str, int]
) -> None:
    """Sees that new records go into the current segment format (during open): an active
    segment of an older format that holds no record gets the current header in place; one
    with records is sealed as it is and a new segment started after it, so that a file of an
    older format never changes again (and never holds what its format does not allow)."""
    active = segments[-1]
    if active.current_format:
        return
    if active.next_seq == active.base_seq and active.size_bytes == active.data_start:
        active.upgrade_empty()
        logger.info("shard log %s: active segment upgraded in place", path)
        return
    active.seal()
    new_segment = Segment.create(path, active.next_seq, files=files, **limits)
    new_segment.next_seq = active.next_seq
    segments.append(new_segment)
    fsync_directory(path)
    logger.info("shard log %s: new segment at %d in the current format", path, active.next_seq)


def _load_leader_epochs(path: Path, segments: list[Segment]) -> list[EpochEntry]:
    """The leader-epoch file's entries fitted to the log (during open); rebuilt from the
    record headers, and written again, when the file is damaged or missing while the log
    holds records. Entries at or past the end (an epoch whose first batch never became
    durable, or a crash inside ``truncate_to``) are dropped from the file too: left there,
    they would be taken for the epochs of records appended later in an older epoch."""
    begin_seq, end_seq = segments[0].base_seq, segments[-1].next_seq
    entries, exists = read_leader_epochs(path)
    if entries is None and (exists or end_seq > begin_seq):
        if exists:
            logger.error("shard log %s: leader-epoch file damaged; rebuilding it", path)
        starts = [start for segment in segments for start in segment.epoch_starts()]
        entries = fit_to_log(merge_epoch_starts([], starts), begin_seq, end_seq)
        write_leader_epochs(path, entries)
    elif entries and entries[-1][1] >= end_seq:
        logger.info("shard log %s: leader epochs past the end of the log dropped", path)
        entries = fit_to_log(entries, begin_seq, end_seq)
        write_leader_epochs(path, entries)
    return fit_to_log(entries or [], begin_seq, end_seq)
