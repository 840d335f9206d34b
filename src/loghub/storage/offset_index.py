"""The offset index: where a record starts in its segment's log, for a sparse set of records.

Byte layout of ``<base_seq:020d>.index``: a flat array of 8-byte entries
(then the 8-byte checksum trailer of ``_pair_index``), big-endian
``(relative_sequence u32, position u32)``, where relative_sequence = sequence - base_seq and
position is the record's first byte in the ``.log`` file. The first entry is always
``(0, data start)`` (the segment's first record: byte 0 of a format-1 file, right after the
segment header of a format-2 one); a new entry is added for the first record that starts at
least ``index_interval_bytes`` after the last indexed one. Both fields strictly increase. To find
record ``s``: take the last entry with relative_sequence <= s - base_seq and walk record
headers forward from its position (less than one interval plus one record). Damage changes
two things: the first intact record after a lost range always gets an entry (so no walk
crosses damaged bytes), and when the segment's first record is lost the first entry is that
of the first intact record (such an index never passes ``is_consistent``, so the segment is
rescanned on each open). An entry is checked on use: the walk compares every header's
sequence with the one expected, and a mismatch makes the shard log rescan the segment.

Who writes it: the shard log's single writer appends entries after the records they describe
are written. Entries are kept in memory as arrays; the file (entries, then the checksum trailer
described in ``_pair_index``) is written when the segment is sealed (and fsynced) or closed.

After a crash: the log is the truth. The last segment's index is rebuilt from its log on open;
an earlier segment's index is checked (``is_consistent``) and rebuilt if missing, truncated or
inconsistent.

Thread-safety: not thread-safe; the shard log calls it under its lock.
"""

from __future__ import annotations

import struct

from loghub.storage._pair_index import PairIndex

__all__ = ["OffsetIndex"]


class OffsetIndex(PairIndex):
    """Sparse (relative sequence -> file position) entries of one segment."""

    ENTRY = struct.Struct(">II")
    SEQUENCE_FIELD = 0

    def last(self) -> tuple[int, int] | None:
        return self[len(self) - 1] if len(self) else None

    def floor(self, relative_sequence: int) -> tuple[int, int]:
        """The last entry at or before ``relative_sequence``."""
        index = self._sequence_position(relative_sequence, right=True) - 1
        assert index >= 0, "the first record of a segment is always indexed"
        return self[index]

    def ceiling_position(self, relative_sequence: int) -> int | None:
        """The position of the first indexed record at or after ``relative_sequence``."""
        index = self._sequence_position(relative_sequence, right=False)
        return None if index == len(self) else self[index][1]

    def is_consistent(self, log_size_bytes: int, record_count: int, data_start: int) -> bool:
        """Whether the entries can describe a log of this size and record count whose first
        record starts at ``data_start``."""
        if not self._well_formed(record_count):
            return False
        if record_count == 0:
            return True
        return self[0] == (0, data_start) and self[len(self) - 1][1] < log_size_bytes
