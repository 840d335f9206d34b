"""What the offset index and the time index share: a file of fixed-size two-field entries
closed by a checksum trailer.

Byte layout: a flat array of big-endian ``(first, second)`` entries whose two fields
strictly increase, then an 8-byte trailer ``b"LHX1"`` + big-endian u32 CRC32C of the entry
bytes. The trailer is what detects an index that was shifted, cut or edited on disk: such a
file is not trusted but rebuilt from the log. (Files from before the trailer existed fail
the check once and are rebuilt.)

The entries live in memory as two arrays; the file is written whole, and only when it must
be: when the segment is sealed (with fsync), closed, or rebuilt. The active
segment's index is rebuilt from its log on open anyway, so it never needs a descriptor.

Thread-safety: not thread-safe; the shard log calls it under its lock.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

import crc32c

from loghub.storage._files import read_whole_file, write_whole_file

__all__ = ["PairIndex"]

_TRAILER = struct.Struct(">4sI")
_TRAILER_MAGIC = b"LHX1"


class PairIndex:
    ENTRY: ClassVar[struct.Struct]
    SEQUENCE_FIELD: ClassVar[int]  # 0 or 1: which field is the relative sequence

    def __init__(self, path: Path, *, create: bool) -> None:
        self.path = path
        self._fields: tuple[array[int], array[int]] = (array("Q"), array("Q"))
        self.intact = True  # the file existed and passed its checksum
        self._dirty = create  # memory differs from the file
        if not create:
            data = read_whole_file(path)
            entries = None if data is None else self._checked_entries(data)
            self.intact = entries is not None
            for first, second in self.ENTRY.iter_unpack(entries or b""):
                self._fields[0].append(first)
                self._fields[1].append(second)

    def _checked_entries(self, data: bytes) -> bytes | None:
        """The entry bytes when the trailer is present and matches, else None."""
        if len(data) < _TRAILER.size or (len(data) - _TRAILER.size) % self.ENTRY.size:
            return None
        magic, crc = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
        entries = data[: len(data) - _TRAILER.size]
        if magic != _TRAILER_MAGIC or crc != crc32c.crc32c(entries):
            return None
        return entries

    def __len__(self) -> int:
        return len(self._fields[0])

    def __getitem__(self, index: int) -> tuple[int, int]:
        return self._fields[0][index], self._fields[1][index]

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._fields[0], self._fields[1], strict=True))

    def extend(self, entries: Iterable[tuple[int, int]]) -> None:
        for first, second in entries:
            if len(self):
                assert first > self._fields[0][-1] and second > self._fields[1][-1]
            self._fields[0].append(first)
            self._fields[1].append(second)
            self._dirty = True

    def _sequence_position(self, relative_sequence: int, *, right: bool) -> int:
        sequences = self._fields[self.SEQUENCE_FIELD]
        search = bisect.bisect_right if right else bisect.bisect_left
        return search(sequences, relative_sequence)

    def _well_formed(self, record_count: int) -> bool:
        """Intact, both fields strictly increasing, the first record indexed first, and no
        entry past the last record."""
        if not self.intact:
            return False
        if record_count == 0:
            return len(self) == 0
        sequences = self._fields[self.SEQUENCE_FIELD]
        if len(self) == 0 or sequences[0] != 0 or sequences[-1] >= record_count:
            return False
        return all(
            column[index] > column[index - 1]
            for column in self._fields
            for index in range(1, len(self))
        )

    def truncate_to(self, record_count: int) -> None:
        """Drops entries of records at or after ``record_count`` (after the log was cut)."""
        keep = self._sequence_position(record_count, right=False)
        if keep < len(self):
            for column in self._fields:
                del column[keep:]
            self._dirty = True

    def reset(self, entries: list[tuple[int, int]], *, write: bool) -> None:
        """Replaces every entry (a rebuild from the log); ``write`` puts the file right now
        (without fsync: the file is a cache of the log)."""
        self._fields = (array("Q", (e[0] for e in entries)), array("Q", (e[1] for e in entries)))
        self.intact = True
        self._dirty = True
        if write:
            write_whole_file(self.path, self._encode(), sync=False)
            self._dirty = False

    def sync(self, *, durable: bool = True) -> None:
        """Writes the file if it differs from memory (and fsyncs it when ``durable``)."""
        if self._dirty:
            write_whole_file(self.path, self._encode(), sync=durable)
            self._dirty = False

    def _encode(self) -> bytes:
        entries = b"".join(self.ENTRY.pack(*entry) for entry in self.entries())
        return entries + _TRAILER.pack(_TRAILER_MAGIC, crc32c.crc32c(entries))
