"""The time index: the first record of each receive time, for one segment.

Byte layout of ``<base_seq:020d>.timeindex``: a flat array of 12-byte entries
(then the 8-byte checksum trailer of ``_pair_index``), big-endian
``(receive_time_ms u64, relative_sequence u32)``. Receive times are non-decreasing within a
shard, and an entry is appended whenever a record's time is greater than the last entry's (so
the segment's first record always has one). Both fields strictly increase, which makes the
index exact, not merely a hint: the first record with time >= t is the record of the first
entry with time >= t, and record s has the time of the last entry with relative_sequence <= s.
The last entry holds the segment's newest time, which retention compares with its cut-off.

Who writes it: the shard log's single writer, after the records are written. Kept in memory
as arrays; the file (entries, then the checksum trailer described in ``_pair_index``) is
written when the segment is sealed (and fsynced) or closed. Answers are checked on use: the
shard log compares ``first_at_or_after`` with the records' own headers, and reads a record's
time from its header, not from here.

After a crash: rebuilt from the log for the last segment; checked and rebuilt if missing,
truncated or inconsistent for earlier segments.

Thread-safety: not thread-safe; the shard log calls it under its lock.
"""

from __future__ import annotations

import bisect
import struct

from loghub.storage._pair_index import PairIndex

__all__ = ["TimeIndex"]


class TimeIndex(PairIndex):
    """(receive time -> first relative sequence with that time) entries of one segment."""

    ENTRY = struct.Struct(">QI")
    SEQUENCE_FIELD = 1

    @property
    def max_time_ms(self) -> int | None:
        """The newest receive time in the segment, None when it holds no record."""
        return self[len(self) - 1][0] if len(self) else None

    def time_of(self, relative_sequence: int) -> int:
        """The receive time of the record at ``relative_sequence`` (which must exist)."""
        index = self._sequence_position(relative_sequence, right=True) - 1
        assert index >= 0, "the first record of a segment always has a time entry"
        return self[index][0]

    def first_at_or_after(self, time_ms: int) -> int | None:
        """The relative sequence of the first record with receive time >= ``time_ms``."""
        index = bisect.bisect_left(self._fields[0], time_ms)
        return None if index == len(self) else self[index][1]

    def is_consistent(self, record_count: int) -> bool:
        return self._well_formed(record_count)
