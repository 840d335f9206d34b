"""A segment: one ``.log`` file of framed records plus its offset and time indexes.

Byte layout of ``<base_seq:020d>.log`` (base_seq is the sequence of its first record). Segment
formats 2 and 3 open with a 12-byte segment header, big-endian (``struct`` format
``>4sHHI``), then records back to back:

    offset  size  field
    0       4     magic             b"LHSG"
    4       2     segment_format    u16  3 (2 in files written before format 3)
    6       2     header_bytes      u16  12 (where the first record starts)
    8       4     crc32c            u32  CRC32C of bytes 0..7

The formats differ in what a payload may be, not in their layout: in format 3 (written since
producers' LZ4 blocks are kept as they came) a payload is either entry form of
``loghub.wire.stored``; in format 2 (written since leader epochs were given a file of their
own) it is always a framed LogGroupList entry. The version moved so that an older LogHub,
which would serve a kept LZ4 block to its readers as if it were a framed group, refuses a
format-3 file instead. Segment format 1 (every file written before) has no header: records
start at byte 0. Older files stay as they are and are read as before; a data directory is
upgraded in place by writing new segments in the current format (``ShardLog.open`` rolls a
new segment when the active one is in an older format, or gives it the new header in place
when it holds no record). Magic, version and the CRC keep their places in every later format, so a
file of a format this code does not know (a newer LogHub wrote it) is recognised and refused
with ``UnsupportedFormatError`` rather than misread as damage (and cut). A header that fails
its CRC is damage: it is rewritten when the record after it proves the layout (or when the
file holds no record), and refused as ``CorruptSegmentError`` otherwise.

Each record is a 30-byte header then the payload (opaque bytes), the same in both segment
formats. Header, big-endian (``struct`` format ``>BBIQQII``):

    offset  size  field
    0       1     format_version    u8   record format, always 1
    1       1     attributes        u8   0 (reserved: compression, control records)
    2       4     leader_epoch      u32  the epoch of the shard's leader that appended it
                                         (0 on a single server; see ``leader_epochs``)
    6       8     sequence          u64  base_seq + index of the record in the segment
    14      8     receive_time_ms   u64  non-decreasing within a shard
    22      4     payload_length    u32  at most payload_bytes_max
    26      4     crc32c            u32  CRC32C of bytes 0..25 of the header, then the payload
    30      n     payload

The fixed leading bytes (format version 1, attributes 0) are the record's magic: to find the
next record after damage, ``_resync`` looks for them and accepts a candidate only when its
sequence is after the damaged one (and no further than the bytes in between allow), its length
fits the file, its time does not go back and its CRC32C over header and payload matches. A
false match needs a 32-bit CRC collision on top of those checks. The record layout is unchanged
from the first release, so every record ever written reads as it did.

Who writes it: only the shard log's writer (one thread at a time), appending with ``os.write``
on an ``O_APPEND`` descriptor; readers use ``os.pread`` and check every record's CRC.
Descriptors come from the shard store's ``FileCache``; a segment holds none between uses.

After a crash or damage: ``recover()`` (the last segment) and ``scan()`` walk every record
checking header fields, lengths, sequence continuity, non-decreasing times and CRCs. A bad
record followed by an intact one is damage in the middle: the bytes stay, the sequences in
between become a ``LostRange`` (reads that reach it are refused, see ``ShardLog.read``), and
the walk goes on from the intact record, whose own sequence says how many were lost. A bad
record with nothing intact after it in the last segment is a torn tail (a write never
acknowledged): it is cut (ftruncate + fsync). In an earlier segment nothing is cut; the lost
range then runs to the next segment's base. Earlier segments were fsynced (log and indexes)
before the roll, so ``check_sealed()`` only checks their indexes (checksum, shape, and the
log's records after the last offset entry) and scans the log when they disagree. Damage in
the middle of an earlier segment is found by the read that meets it, which rescans.

Thread-safety: not thread-safe by itself. The shard log serializes writers, keeps the index
lookups under its lock, and lets readers ``pread`` concurrently: a reader only walks bytes
below ``committed_size_bytes``, which the writer advances after the bytes are written.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import crc32c

from loghub.errors import CorruptSegmentError, UnsupportedFormatError
from loghub.storage._files import FileCache, pread_fully, write_fully, writev_fully
from loghub.storage._gather import (
    BAD_HEADER,
    CRC_MISMATCH,
    DONE,
    INCOMPLETE_HEADER,
    INCOMPLETE_RECORD,
    LIMIT,
    NEED_ROOM,
    gather,
)
from loghub.storage.offset_index import OffsetIndex
from loghub.storage.time_index import TimeIndex

__all__ = [
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "SEGMENT_FORMAT_VERSION",
    "SEGMENT_HEADER_BYTES",
    "LostRange",
    "ReadPlan",
    "Segment",
    "check_header",
    "encode_header",
    "encode_segment_header",
    "record_crc_matches",
    "segment_base_sequences",
    "segment_file_name",
    "segment_format",
]

logger = logging.getLogger("loghub.storage")

FORMAT_VERSION = 1  # of records
SEGMENT_FORMAT_VERSION = 3  # of segment files written now: payloads may be kept lz4 blocks
_SEGMENT_FORMAT_FRAMED_ONLY = 2  # with a header, every payload a framed LogGroupList entry
_SEGMENT_FORMAT_HEADERLESS = 1  # files written before segment headers existed
_SEGMENT_MAGIC = b"LHSG"
_SEGMENT_HEADER = struct.Struct(">4sHHI")
_SEGMENT_HEADER_COVERED_BYTES = 8
SEGMENT_HEADER_BYTES = _SEGMENT_HEADER.size
assert SEGMENT_HEADER_BYTES == 12
HEADER = struct.Struct(">BBIQQII")
HEADER_BYTES = HEADER.size
_CRC_COVERED = struct.Struct(">BBIQQI")
_CRC = struct.Struct(">I")
_CRC_COVERED_BYTES = _CRC_COVERED.size
_MAGIC = bytes([FORMAT_VERSION, 0])  # format version, attributes: how a record starts
assert HEADER_BYTES == 30 and _CRC_COVERED_BYTES == 26

_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1
_SCAN_CHUNK_BYTES = 1024 * 1024
_READ_CHUNK_BYTES_MIN = 64 * 1024
_READ_FIRST_BYTES = 256 * 1024
_GATHER_COUNT_MAX = 2**62  # "no limit" for a read of raw records, within a C long long
_DAMAGE = {
    INCOMPLETE_HEADER: "incomplete header",
    INCOMPLETE_RECORD: "incomplete record",
    CRC_MISMATCH: "CRC mismatch",
}
_FILE_MODE = 0o644
_LOG_NAME = re.compile(r"^(\d{20})\.log$")


def segment_file_name(base_seq: int, suffix: str) -> str:
    assert 0 <= base_seq <= _U64_MAX
    return f"{base_seq:020d}{suffix}"


def segment_base_sequences(directory: Path) -> list[int]:
    """The base sequences of the ``.log`` files in ``directory``, ascending."""
    bases = []
    for entry in os.scandir(directory):
        match = _LOG_NAME.match(entry.name)
        if match is not None and entry.is_file():
            bases.append(int(match.group(1)))
    return sorted(bases)


def encode_segment_header() -> bytes:
    """The 12-byte header every segment file of the current format starts with."""
    covered = _SEGMENT_HEADER.pack(_SEGMENT_MAGIC, SEGMENT_FORMAT_VERSION, SEGMENT_HEADER_BYTES, 0)
    return covered[:8] + _CRC.pack(crc32c.crc32c(covered[:_SEGMENT_HEADER_COVERED_BYTES]))


def segment_format(head: bytes) -> int | None:
    """The segment format a file's first bytes declare: ``SEGMENT_FORMAT_VERSION``, a
    newer one (the caller refuses it), 1 for a file without a header (records from byte 0),
    or None when they start like a header but fail its checks (damaged, or torn while it
    was being created). A pure leaf: the callers decide what damage means."""
    if not head.startswith(_SEGMENT_MAGIC):
        return None if _SEGMENT_MAGIC.startswith(head) and head else _SEGMENT_FORMAT_HEADERLESS
    if len(head) < SEGMENT_HEADER_BYTES:
        return None
    _magic, version, header_bytes, stored = _SEGMENT_HEADER.unpack_from(head)
    if stored != crc32c.crc32c(head[:_SEGMENT_HEADER_COVERED_BYTES]):
        return None
    if version < _SEGMENT_FORMAT_FRAMED_ONLY:  # no such header was ever written
        return None
    if version <= SEGMENT_FORMAT_VERSION and header_bytes != SEGMENT_HEADER_BYTES:
        return None
    return int(version)


def encode_header(
    sequence: int, receive_time_ms: int, payload: bytes, leader_epoch: int = 0
) -> bytes:
    """The 30-byte header of a record; the record is this followed by ``payload``."""
    assert 0 <= sequence <= _U64_MAX and 0 <= receive_time_ms <= _U64_MAX
    assert 0 <= leader_epoch <= _U32_MAX and len(payload) <= _U32_MAX
    covered = _CRC_COVERED.pack(
        FORMAT_VERSION, 0, leader_epoch, sequence, receive_time_ms, len(payload)
    )
    header = covered + _CRC.pack(crc32c.crc32c(payload, crc32c.crc32c(covered)))
    assert len(header) == HEADER_BYTES
    return header


def record_crc_matches(record: bytes | memoryview) -> bool:
    """Whether a whole framed record (header and payload) matches its stored CRC."""
    stored = _CRC.unpack_from(record, _CRC_COVERED_BYTES)[0]
    computed = crc32c.crc32c(record[HEADER_BYTES:], crc32c.crc32c(record[:_CRC_COVERED_BYTES]))
    return bool(stored == computed)


def check_header(
    fields: tuple[int, ...], expected_sequence: int, payload_bytes_max: int
) -> str | None:
    """What is wrong with an unpacked header, or None. A pure leaf: callers decide."""
    format_version, attributes, _epoch, sequence, _time, payload_length, _crc = fields
    if format_version != FORMAT_VERSION:
        return f"format version {format_version}"
    if attributes != 0:
        return f"attributes {attributes}"
    if sequence != expected_sequence:
        return f"sequence {sequence} where {expected_sequence} was expected"
    if payload_length > payload_bytes_max:
        return f"payload length {payload_length} over the limit {payload_bytes_max}"
    return None


@dataclass(frozen=True)
class LostRange:
    """Records [first_seq, end_seq) of a segment that failed their checks: the damaged
    bytes [position, end_position) stay in the file, but no read returns them."""

    first_seq: int
    end_seq: int
    position: int
    end_position: int

    @property
    def record_count(self) -> int:
        return self.end_seq - self.first_seq


class _ChunkReader:
    """Views of a file's bytes below ``limit``, read with as few preads as possible."""

    def __init__(self, fd: int, limit: int, chunk_bytes: int) -> None:
        self._fd = fd
        self._limit = limit
        self._chunk_bytes = chunk_bytes
        self._start = 0
        self._data = memoryview(b"")

    def view(self, position: int, size_bytes: int) -> memoryview | None:
        """``size_bytes`` at ``position``, or None when they reach past the limit or the file."""
        end = position + size_bytes
        if end > self._limit:
            return None
        if position < self._start or end > self._start + len(self._data):
            want = min(max(size_bytes, self._chunk_bytes), self._limit - position)
            self._data = memoryview(pread_fully(self._fd, want, position))
            self._start = position
            if len(self._data) < size_bytes:
                return None
        offset = position - self._start
        return self._data[offset : offset + size_bytes]


class _IndexBuilder:
    """Decides which records get offset and time index entries (rules in their modules)."""

    def __init__(
        self,
        base_seq: int,
        index_interval_bytes: int,
        last_offset_entry: tuple[int, int] | None,
        last_time_ms: int | None,
    ) -> None:
        self.base_seq = base_seq
        self.index_interval_bytes = index_interval_bytes
        self.last_offset_position = None if last_offset_entry is None else last_offset_entry[1]
        self.last_time_ms = last_time_ms
        self.offset_entries: list[tuple[int, int]] = []
        self.time_entries: list[tuple[int, int]] = []

    def add(self, sequence: int, receive_time_ms: int, position: int) -> None:
        relative_sequence = sequence - self.base_seq
        assert 0 <= relative_sequence <= _U32_MAX and position <= _U32_MAX
        if (
            self.last_offset_position is None
            or position - self.last_offset_position >= self.index_interval_bytes
        ):
            self.offset_entries.append((relative_sequence, position))
            self.last_offset_position = position
        if self.last_time_ms is None or receive_time_ms > self.last_time_ms:
            self.time_entries.append((receive_time_ms, relative_sequence))
            self.last_time_ms = receive_time_ms

    def after_lost_range(self) -> None:
        """The next record gets an offset entry, so that no read walks damaged bytes."""
        self.last_offset_position = None


@dataclass(frozen=True)
class _ScanResult:
    valid_size_bytes: int  # the end of the last intact record
    next_seq: int  # one past the last intact record (or lost range) found
    offset_entries: list[tuple[int, int]]
    time_entries: list[tuple[int, int]]
    lost: list[LostRange]
    problem: str | None  # what ended the walk before the end of the file
    epoch_starts: list[tuple[int, int]]  # (epoch, sequence) where intact records change epoch


@dataclass(frozen=True)
class ReadPlan:
    """Where a read starts in one segment and where it must stop (made under the shard lock)."""

    position: int  # a record boundary at or before start_seq (an offset index entry)
    position_seq: int  # the sequence of the record at ``position``
    start_seq: int  # first record to return
    stop_seq: int  # one past the last record that may be returned
    limit_position: int  # no byte at or after this position is read


class Segment:
    """One segment's files. Create with ``create`` or ``open``."""

    def __init__(
        self,
        directory: Path,
        base_seq: int,
        *,
        create: bool,
        index_interval_bytes: int,
        payload_bytes_max: int,
        files: FileCache,
    ) -> None:
        assert index_interval_bytes > 0 and payload_bytes_max >= 0
        self.directory = directory
        self.base_seq = base_seq
        self.index_interval_bytes = index_interval_bytes
        self.payload_bytes_max = payload_bytes_max
        self.files = files
        self.path = directory / segment_file_name(base_seq, ".log")
        if create:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            fd = os.open(self.path, flags, _FILE_MODE)
            try:  # durable before the file is listed, so no listed file lacks its header
                write_fully(fd, encode_segment_header())
                os.fsync(fd)
            finally:
                os.close(fd)
            self.format_version = SEGMENT_FORMAT_VERSION
        else:
            self.format_version = self._open_format()
        self.data_start = (
            0 if self.format_version == _SEGMENT_FORMAT_HEADERLESS else SEGMENT_HEADER_BYTES
        )
        self.offset_index = OffsetIndex(
            directory / segment_file_name(base_seq, ".index"), create=create
        )
        self.time_index = TimeIndex(
            directory / segment_file_name(base_seq, ".timeindex"), create=create
        )
        self.size_bytes = self.path.stat().st_size  # written, by the writer
        self.committed_size_bytes = self.size_bytes  # readable, published under the shard lock
        self.next_seq = base_seq  # known after recover() or check_sealed()
        self.lost: list[LostRange] = []  # damaged ranges found so far, ascending
        self.pins = 0  # readers using the file; guarded by the shard lock
        self.read_fd = -1  # the log's descriptor while pinned (pins > 0)
        self.retired = False
        self._closed = False
        self._deleted = False

    @classmethod
    def create(
        cls,
        directory: Path,
        base_seq: int,
        *,
        index_interval_bytes: int,
        payload_bytes_max: int,
        files: FileCache,
    ) -> Segment:
        """A new empty segment. The caller fsyncs the directory."""
        return cls(
            directory,
            base_seq,
            create=True,
            index_interval_bytes=index_interval_bytes,
            payload_bytes_max=payload_bytes_max,
            files=files,
        )

    @classmethod
    def open(
        cls,
        directory: Path,
        base_seq: int,
        *,
        index_interval_bytes: int,
        payload_bytes_max: int,
        files: FileCache,
    ) -> Segment:
        """An existing segment; call ``recover()`` (last) or ``check_sealed()`` (earlier) next."""
        return cls(
            directory,
            base_seq,
            create=False,
            index_interval_bytes=index_interval_bytes,
            payload_bytes_max=payload_bytes_max,
            files=files,
        )

    @property
    def record_count(self) -> int:
        """Sequences the segment spans (lost ones included)."""
        return self.next_seq - self.base_seq

    @property
    def max_time_ms(self) -> int | None:
        return self.time_index.max_time_ms

    def lost_range_at(self, sequence: int) -> LostRange | None:
        for lost in self.lost:
            if lost.first_seq <= sequence < lost.end_seq:
                return lost
        return None

    def first_lost_at_or_after(self, sequence: int) -> LostRange | None:
        for lost in self.lost:
            if lost.end_seq > sequence:
                return lost
        return None

    # --- format ---------------------------------------------------------------------------

    def _open_format(self) -> int:
        """The segment format of an existing file. A damaged or torn header is rewritten
        when nothing can be misread by doing so (the file holds no record, or an intact
        first record starts right after the header); otherwise the file is refused."""
        with self.files.use(self.path) as fd:
            size_bytes = os.fstat(fd).st_size
            head = pread_fully(fd, SEGMENT_HEADER_BYTES, 0)
            found = segment_format(head)
            if found is not None and _SEGMENT_FORMAT_FRAMED_ONLY <= found <= SEGMENT_FORMAT_VERSION:
                return found
            # a format-1 file starts with a record; one whose first bytes are junk but whose
            # record base_seq starts right after a header is a format-2 one, header damaged
            if found == _SEGMENT_FORMAT_HEADERLESS:
                if not head or head[0] == FORMAT_VERSION:
                    return found
                if not self._intact_first_record(fd, size_bytes):
                    return found  # junk where a record starts: damage the scan deals with
            elif found is not None:
                raise UnsupportedFormatError(
                    f"{self.path}: segment format {found} was written by a newer LogHub; this "
                    f"one reads formats {_SEGMENT_FORMAT_HEADERLESS} to {SEGMENT_FORMAT_VERSION}"
                )
            elif size_bytes > SEGMENT_HEADER_BYTES and not self._intact_first_record(
                fd, size_bytes
            ):
                raise CorruptSegmentError(
                    f"{self.path}: the segment header is damaged and no intact record follows "
                    "it, so its format cannot be told; the file was left as it is"
                )
        logger.warning("%s: rewriting a damaged or torn segment header", self.path)
        self._write_segment_header()
        return SEGMENT_FORMAT_VERSION

    def _intact_first_record(self, fd: int, size_bytes: int) -> bool:
        """Whether record base_seq starts right after a segment header, intact."""
        header = pread_fully(fd, HEADER_BYTES, SEGMENT_HEADER_BYTES)
        if len(header) < HEADER_BYTES:
            return False
        fields = HEADER.unpack(header)
        if check_header(fields, self.base_seq, self.payload_bytes_max) is not None:
            return False
        record_bytes = HEADER_BYTES + fields[5]
        if SEGMENT_HEADER_BYTES + record_bytes > size_bytes:
            return False
        return record_crc_matches(pread_fully(fd, record_bytes, SEGMENT_HEADER_BYTES))

    def _write_segment_header(self) -> None:
        """Writes the current format's header over the file's first bytes, durably (not
        through the cache's ``O_APPEND`` descriptor, which would write at the end)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            header = encode_segment_header()
            assert os.pwrite(fd, header, 0) == len(header)
            os.fsync(fd)
        finally:
            os.close(fd)

    def upgrade_empty(self) -> None:
        """Gives a file of an older format that holds no record the current format's header
        in place (the active segment of a shard that holds no record), so that new records
        get the new format."""
        assert self.format_version < SEGMENT_FORMAT_VERSION
        assert self.size_bytes == self.data_start and self.next_seq == self.base_seq
        assert self.pins == 0
        self._write_segment_header()
        self.format_version = SEGMENT_FORMAT_VERSION
        self.data_start = SEGMENT_HEADER_BYTES
        self.size_bytes = self.committed_size_bytes = SEGMENT_HEADER_BYTES

    @property
    def current_format(self) -> bool:
        """Whether new records may go into this file (it is in the current format)."""
        return self.format_version == SEGMENT_FORMAT_VERSION

    @property
    def headerless(self) -> bool:
        """Whether the file is in format 1 (no header: written before segment headers)."""
        return self.format_version == _SEGMENT_FORMAT_HEADERLESS

    # --- recovery -----------------------------------------------------------------------

    def recover(self) -> int:
        """The last segment on open: keeps every intact record, notes damaged ranges in the
        middle, cuts a torn tail; returns the bytes cut."""
        file_size = self.path.stat().st_size
        result = self._scan(file_size, None)
        cut_bytes = file_size - result.valid_size_bytes
        with self.files.use(self.path) as fd:
            if cut_bytes:
                logger.warning(
                    "%s: cut %d bytes at position %d (%s)",
                    self.path,
                    cut_bytes,
                    result.valid_size_bytes,
                    result.problem,
                )
                os.ftruncate(fd, result.valid_size_bytes)
                os.fsync(fd)
        self.size_bytes = self.committed_size_bytes = result.valid_size_bytes
        self._adopt(result)
        return cut_bytes

    def epoch_starts(self) -> list[tuple[int, int]]:
        """(leader epoch, sequence) wherever the segment's intact records change epoch,
        for rebuilding the leader-epoch file. A format-1 segment was written before epochs
        were kept, by a single server: epoch 0 from its first intact record, no walk. A
        later one is walked (every header and CRC)."""
        if self.headerless:
            first_seq = self.base_seq
            for lost in self.lost:
                if lost.first_seq == first_seq:
                    first_seq = lost.end_seq
            return [(0, first_seq)] if first_seq < self.next_seq else []
        return self._scan(self.committed_size_bytes, self.next_seq).epoch_starts

    def check_sealed(self, next_seq: int) -> None:
        """Checks an earlier (fsynced) segment holds [base_seq, next_seq); when its indexes
        disagree with its log, rescans the log (noting damaged ranges) and rebuilds them."""
        assert next_seq >= self.base_seq
        self.next_seq = next_seq
        if self._indexes_match_log():
            return
        logger.info("%s: rebuilding its indexes", self.path)
        self.rescan()

    def rescan(self) -> list[LostRange]:
        """Walks the segment's committed bytes, notes its damaged ranges and rebuilds both
        indexes (written; they are a cache, so not fsynced). Nothing is cut: the records it
        spans were acknowledged, so a bad tail here is a lost range up to ``next_seq``.
        Returns the damaged ranges not known before. The caller holds the shard lock and the
        writer role, so that no append moves the segment meanwhile."""
        assert self.next_seq >= self.base_seq
        end_seq = self.next_seq
        result = self._scan(self.committed_size_bytes, end_seq)
        known = set(self.lost)
        lost = list(result.lost)
        if result.next_seq < end_seq:  # the rest of the file is gone or unreadable
            lost.append(
                LostRange(
                    result.next_seq, end_seq, result.valid_size_bytes, self.committed_size_bytes
                )
            )
        self._adopt(result, lost)
        self.next_seq = end_seq
        return [item for item in lost if item not in known]

    def _adopt(self, result: _ScanResult, lost: list[LostRange] | None = None) -> None:
        """Takes a scan's findings: end, lost ranges (logged), and indexes (rewritten when
        they differ from the file's)."""
        self.next_seq = result.next_seq
        self.lost = result.lost if lost is None else lost
        for item in self.lost:
            logger.error(
                "%s: records %d..%d (bytes %d..%d) are damaged and will not be served",
                self.path,
                item.first_seq,
                item.end_seq - 1,
                item.position,
                item.end_position,
            )
        if not self.offset_index.intact or self.offset_index.entries() != result.offset_entries:
            self.offset_index.reset(result.offset_entries, write=True)
        if not self.time_index.intact or self.time_index.entries() != result.time_entries:
            self.time_index.reset(result.time_entries, write=True)

    def _indexes_match_log(self) -> bool:
        count = self.record_count
        if not self.offset_index.is_consistent(self.size_bytes, count, self.data_start):
            return False
        if not self.time_index.is_consistent(count):
            return False
        last = self.offset_index.last()
        if last is None:
            return self.size_bytes == self.data_start
        # Walk the headers after the last entry: they must end exactly at the end of the file.
        relative_sequence, position = last
        sequence = self.base_seq + relative_sequence
        last_time_ms = -1
        with self.files.use(self.path) as fd:
            reader = _ChunkReader(fd, self.size_bytes, _READ_CHUNK_BYTES_MIN)
            while position < self.size_bytes:
                header = reader.view(position, HEADER_BYTES)
                if header is None:
                    return False
                fields = HEADER.unpack(header)
                if check_header(fields, sequence, self.payload_bytes_max) is not None:
                    return False
                last_time_ms = fields[4]
                position += HEADER_BYTES + fields[5]
                sequence += 1
        return (
            position == self.size_bytes
            and sequence == self.next_seq
            and last_time_ms == self.time_index.max_time_ms
        )

    def _scan(self, file_size: int, end_seq: int | None) -> _ScanResult:
        """Walks every record from the start, checking everything. A bad record is skipped
        when an intact one follows it (a lost range); otherwise the walk ends there.
        ``end_seq``, when known (a sealed segment), bounds the sequences accepted."""
        builder = _IndexBuilder(self.base_seq, self.index_interval_bytes, None, None)
        position = self.data_start
        sequence = self.base_seq
        problem: str | None = None
        lost: list[LostRange] = []
        epoch_starts: list[tuple[int, int]] = []
        sequence_limit = _U64_MAX + 1 if end_seq is None else end_seq
        with self.files.use(self.path) as fd:
            reader = _ChunkReader(fd, file_size, _SCAN_CHUNK_BYTES)
            while position < file_size:
                problem, record_bytes, time_ms, epoch = self._check_record(
                    reader, position, sequence, builder.last_time_ms
                )
                if problem is None and sequence >= sequence_limit:
                    problem = f"sequence {sequence} past the segment's end {sequence_limit}"
                if problem is None:
                    if not epoch_starts or epoch_starts[-1][0] != epoch:
                        epoch_starts.append((epoch, sequence))
                    builder.add(sequence, time_ms, position)
                    position += record_bytes
                    sequence += 1
                    continue
                found = self._resync(
                    fd, file_size, position, sequence, sequence_limit, builder.last_time_ms
                )
                if found is None:
                    break
                next_position, next_seq = found
                lost.append(LostRange(sequence, next_seq, position, next_position))
                builder.after_lost_range()
                position, sequence, problem = next_position, next_seq, None
        return _ScanResult(
            valid_size_bytes=position,
            next_seq=sequence,
            offset_entries=builder.offset_entries,
            time_entries=builder.time_entries,
            lost=lost,
            problem=problem,
            epoch_starts=epoch_starts,
        )

    def _check_record(
        self, reader: _ChunkReader, position: int, sequence: int, last_time_ms: int | None
    ) -> tuple[str | None, int, int, int]:
        """(problem or None, record bytes, receive time, leader epoch) of the record at
        ``position``."""
        header = reader.view(position, HEADER_BYTES)
        if header is None:
            return "incomplete header", 0, 0, 0
        fields = HEADER.unpack(header)
        problem = check_header(fields, sequence, self.payload_bytes_max)
        if problem is None and last_time_ms is not None and fields[4] < last_time_ms:
            problem = "receive time went back"
        if problem is not None:
            return problem, 0, 0, 0
        record = reader.view(position, HEADER_BYTES + fields[5])
        if record is None:
            return "incomplete record", 0, 0, 0
        if not record_crc_matches(record):
            return "CRC mismatch", 0, 0, 0
        return None, len(record), fields[4], fields[2]

    def _resync(
        self,
        fd: int,
        file_size: int,
        bad_position: int,
        bad_sequence: int,
        sequence_limit: int,
        last_time_ms: int | None,
    ) -> tuple[int, int] | None:
        """The (position, sequence) of the first intact record after a bad one, or None.

        A candidate must start with the record magic, carry a sequence after the bad one and
        no further than the bytes in between can hold (every record takes at least a header),
        fit the file, keep times non-decreasing and match its CRC."""
        chunk_start = bad_position + 1
        while chunk_start + HEADER_BYTES <= file_size:
            chunk = pread_fully(fd, _SCAN_CHUNK_BYTES + HEADER_BYTES, chunk_start)
            index = chunk.find(_MAGIC)
            while index != -1 and index < _SCAN_CHUNK_BYTES:
                position = chunk_start + index
                if position + HEADER_BYTES > file_size:
                    return None
                header = chunk[index : index + HEADER_BYTES]
                if self._is_resync_point(
                    fd, file_size, header, position, bad_position, bad_sequence, sequence_limit,
                    last_time_ms,
                ):  # fmt: skip
                    return position, HEADER.unpack(header)[3]
                index = chunk.find(_MAGIC, index + 1)
            chunk_start += _SCAN_CHUNK_BYTES
        return None

    def _is_resync_point(
        self,
        fd: int,
        file_size: int,
        header: bytes,
        position: int,
        bad_position: int,
        bad_sequence: int,
        sequence_limit: int,
        last_time_ms: int | None,
    ) -> bool:
        """Cheap checks on the candidate's header first; the CRC only for the survivors."""
        if len(header) < HEADER_BYTES:
            return False
        _version, _attributes, _epoch, sequence, time_ms, length, _crc = HEADER.unpack(header)
        lost_max = (position - bad_position) // HEADER_BYTES
        if not bad_sequence < sequence <= bad_sequence + lost_max or sequence >= sequence_limit:
            return False
        if length > self.payload_bytes_max or position + HEADER_BYTES + length > file_size:
            return False
        if last_time_ms is not None and time_ms < last_time_ms:
            return False
        return record_crc_matches(pread_fully(fd, HEADER_BYTES + length, position))

    # --- writing (the shard log's writer only) -------------------------------------------

    def write(self, records: list[tuple[int, int, bytes, bytes]]) -> list[tuple[int, int, int]]:
        """Appends framed ``(sequence, receive_time_ms, header, payload)`` records with one
        write; returns their ``(sequence, receive_time_ms, position)`` for ``index``."""
        placements: list[tuple[int, int, int]] = []
        parts: list[bytes] = []
        position = self.size_bytes
        for sequence, receive_time_ms, header, payload in records:
            assert sequence == self.next_seq + len(placements)
            assert len(header) == HEADER_BYTES
            placements.append((sequence, receive_time_ms, position))
            parts.append(header)
            parts.append(payload)
            position += HEADER_BYTES + len(payload)
        fd = self.files.acquire(self.path)  # not ``use``: this is the hot path
        try:
            writev_fully(fd, parts)
        finally:
            self.files.release(self.path)
        self.size_bytes = position
        self.next_seq += len(placements)
        return placements

    def index(self, placements: list[tuple[int, int, int]]) -> None:
        """Adds the index entries for records just written (under the shard lock)."""
        builder = _IndexBuilder(
            self.base_seq,
            self.index_interval_bytes,
            self.offset_index.last(),
            self.time_index.max_time_ms,
        )
        for sequence, receive_time_ms, position in placements:
            builder.add(sequence, receive_time_ms, position)
        self.offset_index.extend(builder.offset_entries)
        self.time_index.extend(builder.time_entries)

    def truncate(self, size_bytes: int, next_seq: int) -> None:
        """Cuts the records from ``next_seq`` on, which start at byte ``size_bytes``: records
        written but not acknowledged (a failed batch), or a follower's records after the
        point where its log left the leader's (``ShardLog.truncate_to``). Forgets them in
        memory first (sizes, index entries, lost ranges), so that even when the cut fails
        nothing claims records the file may no longer hold; then ftruncate and fdatasync.
        Under the shard lock, with no read of the cut records under way."""
        assert self.data_start <= size_bytes <= self.size_bytes
        assert self.base_seq <= next_seq <= self.next_seq
        self.size_bytes = size_bytes
        self.committed_size_bytes = min(self.committed_size_bytes, size_bytes)
        self.next_seq = next_seq
        self.lost = [item for item in self.lost if item.first_seq < next_seq]
        self.offset_index.truncate_to(next_seq - self.base_seq)
        self.time_index.truncate_to(next_seq - self.base_seq)
        with self.files.use(self.path) as fd:
            os.ftruncate(fd, size_bytes)
            os.fdatasync(fd)

    def position_of(self, sequence: int) -> int:
        """The byte where record ``sequence`` starts (for ``next_seq``: the end of the
        records), to cut the segment there. From the offset index's entry at or before it,
        the headers in between are walked, each checked for the sequence it must carry, up
        to the record's own: CorruptSegmentError when one fails (the caller rescans and asks
        again). ``sequence`` must not be in a lost range. Under the shard lock."""
        assert self.base_seq <= sequence <= self.next_seq
        assert self.lost_range_at(sequence) is None
        if sequence == self.next_seq:
            return self.size_bytes
        relative_sequence, position = self.offset_index.floor(sequence - self.base_seq)
        current = self.base_seq + relative_sequence
        with self.files.use(self.path) as fd:
            reader = _ChunkReader(fd, self.size_bytes, _READ_CHUNK_BYTES_MIN)
            while True:
                header = reader.view(position, HEADER_BYTES)
                if header is None:
                    raise self._corrupt(position, "incomplete header")
                fields = HEADER.unpack(header)
                problem = check_header(fields, current, self.payload_bytes_max)
                if problem is not None:
                    raise self._corrupt(position, problem)
                if current == sequence:
                    return position
                position += HEADER_BYTES + fields[5]
                current += 1

    def sync(self) -> None:
        with self.files.use(self.path) as fd:
            os.fdatasync(fd)

    def seal(self) -> None:
        """Makes the log and both indexes durable; the segment takes no more records."""
        self.sync()
        self.offset_index.sync()
        self.time_index.sync()

    # --- reading --------------------------------------------------------------------------

    def plan_read(self, start_seq: int, stop_seq: int) -> ReadPlan:
        """Where to read records [start_seq, stop_seq) of this segment (under the shard lock).
        The range must hold no lost record (the shard log stops reads before one)."""
        assert self.base_seq <= start_seq < stop_seq <= self.next_seq
        relative_sequence, position = self.offset_index.floor(start_seq - self.base_seq)
        limit = self.committed_size_bytes
        ceiling = self.offset_index.ceiling_position(stop_seq - self.base_seq)
        if ceiling is not None:
            limit = min(limit, ceiling)
        return ReadPlan(position, self.base_seq + relative_sequence, start_seq, stop_seq, limit)

    def read_into(
        self,
        fd: int,
        plan: ReadPlan,
        count_max: int,
        bytes_max: int,
        out: bytearray,
        out_offset: int,
        *,
        raw: bool,
        take_first: bool,
    ) -> tuple[int, int, int]:
        """Packs the records of ``plan`` into ``out`` from ``out_offset``: at most
        ``count_max`` records and ``bytes_max`` bytes (payload bytes, or whole records when
        ``raw``; the first record is taken regardless when ``take_first``), growing ``out``
        as needed. Returns (records, bytes taken, end of the packed bytes in ``out``); bytes
        of ``out`` after that end are scratch. Raises CorruptSegmentError when a record (or
        the index entry leading to it) is wrong. ``fd`` is the log's descriptor, pinned by
        the caller since before it planned the read, so that retention cannot unlink the
        file between the plan and the read; ``out`` must have no exported views."""
        # A read must not pull in far more of the file than it returns (a pull of 1,000
        # small groups from a long segment would read 16 MiB for 3 MiB), nor stop every
        # few records: the first call reads a modest chunk, later ones what the records seen
        # so far suggest the rest needs, within what the limits allow; a record larger than
        # that makes the walk ask for room for it.
        skip_bytes = self.index_interval_bytes if plan.position_seq < plan.start_seq else 0
        position, sequence = plan.position, plan.position_seq
        count_max = min(count_max, _GATHER_COUNT_MAX)
        count = taken = 0
        out_end = out_offset
        need = 0
        while True:
            left = count_max - count
            allowed = skip_bytes + bytes_max - taken + HEADER_BYTES * (min(left, 1024) + 1)
            guess = skip_bytes + _READ_FIRST_BYTES
            if count:  # by the file bytes per record, and per byte counted so far
                read_so_far = out_end - out_offset + count * HEADER_BYTES
                by_count = left * (read_so_far // count)
                # a kept lz4 block counts as what it expands to, several times its stored
                # size: a pull's raw-byte limit would read that many times too much
                by_bytes = (bytes_max - taken) * read_so_far // max(taken, 1)
                guess = skip_bytes + min(by_count, by_bytes) * 5 // 4
            # at least a header: after a first record over bytes_max, ``allowed`` can be tiny
            room = min(plan.limit_position - position, max(min(allowed, guess), need, HEADER_BYTES))
            # the walk reads ``room`` bytes, not the whole buffer: a kept buffer that once
            # held a 16 MiB pull would otherwise be filled from the file for every small one
            if len(out) < out_end + room:
                out.extend(bytes(out_end + room - len(out)))
            status, stop, sequence, new_end, records, taken_now, loaded_end = gather(
                fd, out, out_end, position, plan.limit_position, sequence, plan.start_seq,
                plan.stop_seq, count_max - count, bytes_max - taken, take_first and not count,
                raw, self.payload_bytes_max, room,
            )  # fmt: skip
            index = out_end + stop - position
            count, taken, position, out_end = count + records, taken + taken_now, stop, new_end
            if status in (DONE, LIMIT):
                return count, taken, out_end
            if status == NEED_ROOM:
                if index + HEADER_BYTES <= loaded_end:
                    need = HEADER_BYTES + HEADER.unpack_from(out, index)[5]
                skip_bytes = 0
                continue
            raise self._corrupt(position, self._damage(status, out, index, sequence))

    def _damage(self, status: int, out: bytearray, index: int, sequence: int) -> str:
        """What the walk found wrong with the record at ``out[index:]``."""
        if status == BAD_HEADER:
            problem = check_header(HEADER.unpack_from(out, index), sequence, self.payload_bytes_max)
            assert problem is not None
            return problem
        return _DAMAGE[status]

    def read_time_ms(self, sequence: int) -> int:
        """The receive time in record ``sequence``'s own header (CRC-checked), so that a
        damaged time index cannot give a wrong answer. Under the shard lock."""
        plan = self.plan_read(sequence, sequence + 1)
        out = bytearray()
        with self.files.use(self.path) as fd:
            count, _, _ = self.read_into(fd, plan, 1, 0, out, 0, raw=True, take_first=True)
        assert count == 1
        return int(HEADER.unpack_from(out, 0)[4])

    def _corrupt(self, position: int, problem: str) -> CorruptSegmentError:
        return CorruptSegmentError(f"{self.path} at position {position}: {problem}")

    # --- life cycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Forgets the cached descriptor; writes the indexes when they changed (a clean close
        spares the next open a rebuild)."""
        if self._closed:
            return
        self._closed = True
        self.files.forget(self.path)
        if not self._deleted:
            try:  # not fsynced: a torn index fails its checksum and is rebuilt
                self.offset_index.sync(durable=False)
                self.time_index.sync(durable=False)
            except OSError as exc:
                logger.warning("%s: indexes not written at close: %r", self.path, exc)

    def delete_files(self) -> None:
        """Unlinks the log first: an index left without its log is ignored and overwritten."""
        self._deleted = True
        self.path.unlink(missing_ok=True)
        self.offset_index.path.unlink(missing_ok=True)
        self.time_index.path.unlink(missing_ok=True)
