"""The offset index: where a record starts in its segment's log, for a sparse set of records.

Byte layout of ``<base_seq:020d>.index``: a flat array of 8-byte entries, big-endian
``(relative_sequence u32, position u32)``, where relative_sequence = sequence - base_seq and
position is the record's first byte in the ``.log`` file. The first entry is always ``(0, 0)``
(the segment's first record); a new entry is added for the first record that starts at least
``index_interval_bytes`` after the last indexed one. Both fields strictly increase. To find
record ``s``: take the last entry with relative_sequence <= s - base_seq and walk record
headers forward from its position (less than one interval plus one record).

Who writes it: the shard log's single writer appends entries after the records they describe
are written. Entries are kept in memory as arrays and appended to the file without fsync; the
file is fsynced when the segment is rolled (sealed).

After a crash: the log is the truth. The last segment's index is rebuilt from its log on open;
an earlier segment's index is checked (``is_consistent``) and rebuilt if missing, truncated or
inconsistent.

Thread-safety: not thread-safe; the shard log calls it under its lock.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from collections.abc import Iterable
from pathlib import Path

from loghub.storage._files import IndexFile

__all__ = ["OffsetIndex"]

_ENTRY = struct.Struct(">II")


class OffsetIndex:
    """Sparse (relative sequence -> file position) entries of one segment."""

    ENTRY_BYTES = _ENTRY.size

    def __init__(self, path: Path, *, create: bool) -> None:
        self._file = IndexFile(path, create=create)
        self._relative_sequences: array[int] = array("Q")
        self._positions: array[int] = array("Q")
        self.intact = True
        if not create:
            data = self._file.read_all()
            whole = len(data) - len(data) % _ENTRY.size
            self.intact = self._file.existed and whole == len(data)
            for relative_sequence, position in _ENTRY.iter_unpack(data[:whole]):
                self._relative_sequences.append(relative_sequence)
                self._positions.append(position)

    @property
    def path(self) -> Path:
        return self._file.path

    def __len__(self) -> int:
        return len(self._relative_sequences)

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._relative_sequences, self._positions, strict=True))

    def last(self) -> tuple[int, int] | None:
        if not self._relative_sequences:
            return None
        return self._relative_sequences[-1], self._positions[-1]

    def extend(self, entries: Iterable[tuple[int, int]]) -> None:
        encoded = []
        for relative_sequence, position in entries:
            last = self.last()
            assert last is None or (relative_sequence > last[0] and position > last[1])
            assert last is not None or (relative_sequence, position) == (0, 0)
            self._relative_sequences.append(relative_sequence)
            self._positions.append(position)
            encoded.append(_ENTRY.pack(relative_sequence, position))
        if encoded:
            self._file.append(b"".join(encoded))

    def floor(self, relative_sequence: int) -> tuple[int, int]:
        """The last entry at or before ``relative_sequence``."""
        index = bisect.bisect_right(self._relative_sequences, relative_sequence) - 1
        assert index >= 0, "the first record of a segment is always indexed"
        return self._relative_sequences[index], self._positions[index]

    def ceiling_position(self, relative_sequence: int) -> int | None:
        """The position of the first indexed record at or after ``relative_sequence``."""
        index = bisect.bisect_left(self._relative_sequences, relative_sequence)
        if index == len(self._positions):
            return None
        return self._positions[index]

    def is_consistent(self, log_size_bytes: int, record_count: int) -> bool:
        if not self.intact:
            return False
        if record_count == 0:
            return len(self) == 0
        if len(self) == 0 or self.last() is None or (self[0]) != (0, 0):
            return False
        for index in range(1, len(self)):
            if self._relative_sequences[index] <= self._relative_sequences[index - 1]:
                return False
            if self._positions[index] <= self._positions[index - 1]:
                return False
        last_relative_sequence, last_position = self[len(self) - 1]
        return last_relative_sequence < record_count and last_position < log_size_bytes

    def __getitem__(self, index: int) -> tuple[int, int]:
        return self._relative_sequences[index], self._positions[index]

    def truncate_to(self, record_count: int) -> None:
        """Drops entries of records at or after ``record_count`` (after the log was cut)."""
        keep = bisect.bisect_left(self._relative_sequences, record_count)
        if keep < len(self):
            del self._relative_sequences[keep:]
            del self._positions[keep:]
            self._file.rewrite(self._encode())

    def reset(self, entries: list[tuple[int, int]]) -> None:
        """Replaces every entry (a rebuild from the log)."""
        self._relative_sequences = array("Q", (entry[0] for entry in entries))
        self._positions = array("Q", (entry[1] for entry in entries))
        self._file.rewrite(self._encode())
        self.intact = True

    def sync(self) -> None:
        self._file.sync(self._encode)

    def close(self) -> None:
        self._file.close()

    def _encode(self) -> bytes:
        return b"".join(_ENTRY.pack(*entry) for entry in self.entries())
