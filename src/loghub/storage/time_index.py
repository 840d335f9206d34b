"""The time index: the first record of each receive time, for one segment.

Byte layout of ``<base_seq:020d>.timeindex``: a flat array of 12-byte entries, big-endian
``(receive_time_ms u64, relative_sequence u32)``. Receive times are non-decreasing within a
shard, and an entry is appended whenever a record's time is greater than the last entry's (so
the segment's first record always has one). Both fields strictly increase, which makes the
index exact, not merely a hint: the first record with time >= t is the record of the first
entry with time >= t, and record s has the time of the last entry with relative_sequence <= s.
The last entry holds the segment's newest time, which retention compares with its cut-off.

Who writes it: the shard log's single writer, after the records are written. Kept in memory
as arrays, appended to the file without fsync; fsynced when the segment is sealed.

After a crash: rebuilt from the log for the last segment; checked and rebuilt if missing,
truncated or inconsistent for earlier segments.

Thread-safety: not thread-safe; the shard log calls it under its lock.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from collections.abc import Iterable
from pathlib import Path

from loghub.storage._files import IndexFile

__all__ = ["TimeIndex"]

_ENTRY = struct.Struct(">QI")


class TimeIndex:
    """(receive time -> first relative sequence with that time) entries of one segment."""

    ENTRY_BYTES = _ENTRY.size

    def __init__(self, path: Path, *, create: bool) -> None:
        self._file = IndexFile(path, create=create)
        self._times_ms: array[int] = array("Q")
        self._relative_sequences: array[int] = array("Q")
        self.intact = True
        if not create:
            data = self._file.read_all()
            whole = len(data) - len(data) % _ENTRY.size
            self.intact = self._file.existed and whole == len(data)
            for time_ms, relative_sequence in _ENTRY.iter_unpack(data[:whole]):
                self._times_ms.append(time_ms)
                self._relative_sequences.append(relative_sequence)

    @property
    def path(self) -> Path:
        return self._file.path

    def __len__(self) -> int:
        return len(self._times_ms)

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._times_ms, self._relative_sequences, strict=True))

    @property
    def max_time_ms(self) -> int | None:
        """The newest receive time in the segment, None when it holds no record."""
        return self._times_ms[-1] if self._times_ms else None

    def extend(self, entries: Iterable[tuple[int, int]]) -> None:
        encoded = []
        for time_ms, relative_sequence in entries:
            if self._times_ms:
                assert time_ms > self._times_ms[-1]
                assert relative_sequence > self._relative_sequences[-1]
            else:
                assert relative_sequence == 0
            self._times_ms.append(time_ms)
            self._relative_sequences.append(relative_sequence)
            encoded.append(_ENTRY.pack(time_ms, relative_sequence))
        if encoded:
            self._file.append(b"".join(encoded))

    def time_of(self, relative_sequence: int) -> int:
        """The receive time of the record at ``relative_sequence`` (which must exist)."""
        index = bisect.bisect_right(self._relative_sequences, relative_sequence) - 1
        assert index >= 0, "the first record of a segment always has a time entry"
        return self._times_ms[index]

    def first_at_or_after(self, time_ms: int) -> int | None:
        """The relative sequence of the first record with receive time >= ``time_ms``."""
        index = bisect.bisect_left(self._times_ms, time_ms)
        if index == len(self._times_ms):
            return None
        return self._relative_sequences[index]

    def is_consistent(self, record_count: int) -> bool:
        if not self.intact:
            return False
        if record_count == 0:
            return len(self) == 0
        if len(self) == 0 or self._relative_sequences[0] != 0:
            return False
        for index in range(1, len(self)):
            if self._relative_sequences[index] <= self._relative_sequences[index - 1]:
                return False
            if self._times_ms[index] <= self._times_ms[index - 1]:
                return False
        return self._relative_sequences[-1] < record_count

    def truncate_to(self, record_count: int) -> None:
        keep = bisect.bisect_left(self._relative_sequences, record_count)
        if keep < len(self):
            del self._times_ms[keep:]
            del self._relative_sequences[keep:]
            self._file.rewrite(self._encode())

    def reset(self, entries: list[tuple[int, int]]) -> None:
        self._times_ms = array("Q", (entry[0] for entry in entries))
        self._relative_sequences = array("Q", (entry[1] for entry in entries))
        self._file.rewrite(self._encode())
        self.intact = True

    def sync(self) -> None:
        self._file.sync(self._encode)

    def close(self) -> None:
        self._file.close()

    def _encode(self) -> bytes:
        return b"".join(_ENTRY.pack(*entry) for entry in self.entries())
