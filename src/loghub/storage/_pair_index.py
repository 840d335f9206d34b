"""What the offset index and the time index share: a file of fixed-size two-field entries.

Both are flat arrays of big-endian ``(first, second)`` entries whose two fields strictly
increase, kept in memory as two arrays and appended to their file without fsync (the log is
the truth; the file is fsynced when its segment is sealed and rebuilt from the log when it is
missing, truncated or inconsistent). The subclasses give the fields their meaning and say
which of the two is the relative sequence.

Thread-safety: not thread-safe; the shard log calls it under its lock.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

from loghub.storage._files import IndexFile

__all__ = ["PairIndex"]


class PairIndex:
    ENTRY: ClassVar[struct.Struct]
    SEQUENCE_FIELD: ClassVar[int]  # 0 or 1: which field is the relative sequence

    def __init__(self, path: Path, *, create: bool) -> None:
        self._file = IndexFile(path, create=create)
        self._fields: tuple[array[int], array[int]] = (array("Q"), array("Q"))
        self.intact = True
        if not create:
            data = self._file.read_all()
            whole = len(data) - len(data) % self.ENTRY.size
            self.intact = self._file.existed and whole == len(data)
            for first, second in self.ENTRY.iter_unpack(data[:whole]):
                self._fields[0].append(first)
                self._fields[1].append(second)

    @property
    def path(self) -> Path:
        return self._file.path

    def __len__(self) -> int:
        return len(self._fields[0])

    def __getitem__(self, index: int) -> tuple[int, int]:
        return self._fields[0][index], self._fields[1][index]

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._fields[0], self._fields[1], strict=True))

    def extend(self, entries: Iterable[tuple[int, int]]) -> None:
        encoded = []
        for first, second in entries:
            if len(self):
                assert first > self._fields[0][-1] and second > self._fields[1][-1]
            else:
                assert (first, second)[self.SEQUENCE_FIELD] == 0, "first record first"
            self._fields[0].append(first)
            self._fields[1].append(second)
            encoded.append(self.ENTRY.pack(first, second))
        if encoded:
            self._file.append(b"".join(encoded))

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
            self._file.rewrite(self._encode())

    def reset(self, entries: list[tuple[int, int]]) -> None:
        """Replaces every entry (a rebuild from the log)."""
        self._fields = (array("Q", (e[0] for e in entries)), array("Q", (e[1] for e in entries)))
        self._file.rewrite(self._encode())
        self.intact = True

    def sync(self) -> None:
        self._file.sync(self._encode)

    def close(self) -> None:
        self._file.close()

    def _encode(self) -> bytes:
        return b"".join(self.ENTRY.pack(*entry) for entry in self.entries())
