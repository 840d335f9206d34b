"""The read path's inner loop: one pass over a run of framed records in a segment file that
checks each record and packs the payloads (or whole records) together in a caller's buffer.

Why it exists: a pull used to walk its records in Python (unpack a header, check it, two
CRC32C calls, two buffer views, a list append per record) and then join the views into a new
block of memory. That cost about as much for a group of 16 logs as for one of 4,096, so a pull
of many small groups paid per group what one large group costs; and the join's new 16 MiB
block was faulted in page by page on every pull (the server maps large blocks on their own,
see ``loghub.server.memory``). Here the file's bytes are read with one ``pread`` straight into
the caller's buffer (which a caller can reuse) and the payloads are moved down over the
headers in place, so nothing is allocated per record or per pull.

    gather(fd, out, out_offset, position, limit, sequence, start_seq, stop_seq, count_max,
           bytes_max, take_first, raw, payload_bytes_max, read_max)
        -> (status, position, sequence, out_end, count, taken_bytes, loaded_end)

The bytes of the file from ``position`` (a record boundary holding record ``sequence``) up to
``limit``, or as many as fit in ``out`` after ``out_offset``, and never more than ``read_max``,
are read to ``out[out_offset:]``. ``read_max`` is what the caller expects the walk to need: a
reused buffer may be far larger, and filling it would read (and copy from the page cache)
megabytes for a pull that returns kilobytes.
Records before ``start_seq`` are walked (header checked) and skipped; from ``start_seq`` on,
each record's header and CRC32C are checked and its payload (the whole record when ``raw``)
is moved to ``out_end``, until ``stop_seq``, ``count_max`` records, or ``bytes_max`` bytes
(a record is left for the next read when it would pass ``bytes_max``, unless it is the first
one and ``take_first``). The walk stops at the first record it cannot take and returns:

- ``status``: ``DONE`` (``stop_seq`` or ``count_max`` reached), ``LIMIT`` (``bytes_max``),
  ``NEED_ROOM`` (the next header or record is not wholly in ``out``: grow it and call again
  from ``position`` and ``out_end``), or a damage status: ``INCOMPLETE_HEADER`` and
  ``INCOMPLETE_RECORD`` (the bytes end before ``limit`` says they should: a short file),
  ``BAD_HEADER`` (see ``segment.check_header``) or ``CRC_MISMATCH``;
- ``position``, ``sequence``: the record where it stopped; its bytes start at buffer index
  ``out_offset + position - <the position given>`` and are intact, so the caller can read
  its header for an error message or for the room it needs;
- ``out_end``: one past the last byte moved; ``count``, ``taken_bytes``: records moved and
  what they count against ``bytes_max`` (whole records when ``raw``; else payload bytes, an
  lz4 entry of ``loghub.wire.stored`` counting as the framed entry it expands to, so that a
  pull's limit stays in the bytes its reader gets); ``loaded_end``: one past the last
  byte read into ``out``.

A compiled twin (``_gather_c.c``) does the same walk with the GIL released for the whole
call (the ``pread``, the CRC32C with the CPU's instruction where it has one, the moves); it is
used when it was built. ``tests/unit/test_gather.py`` holds the two to the same answers on
intact and damaged files. Thread-safety: pure apart from reading ``fd`` and writing ``out``;
concurrent calls need their own buffers.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Final

import crc32c

__all__ = [
    "BAD_HEADER",
    "CRC_MISMATCH",
    "DONE",
    "IMPLEMENTATION",
    "INCOMPLETE_HEADER",
    "INCOMPLETE_RECORD",
    "LIMIT",
    "NEED_ROOM",
    "Gathered",
    "gather",
    "gather_python",
]

DONE: Final = 0
LIMIT: Final = 1
NEED_ROOM: Final = 2
INCOMPLETE_HEADER: Final = 3
BAD_HEADER: Final = 4
INCOMPLETE_RECORD: Final = 5
CRC_MISMATCH: Final = 6

# The record header of ``loghub.storage.segment`` (kept in step with it; a test compares).
_HEADER = struct.Struct(">BBIQQII")
_HEADER_BYTES = 30
_CRC_COVERED_BYTES = 26
_FORMAT_VERSION = 1
# An lz4 entry of ``loghub.wire.stored`` counts as the framed entry it expands to.
_LZ4_ENTRY_MARK = 0xFF
_LZ4_ENTRY_HEAD_BYTES = 13

Gathered = tuple[int, int, int, int, int, int, int]
GatherFunction = Callable[
    [int, bytearray, int, int, int, int, int, int, int, int, bool, bool, int, int], Gathered
]


def _pread_into(fd: int, out: bytearray, out_offset: int, size_bytes: int, position: int) -> int:
    """Reads up to ``size_bytes`` at ``position`` into ``out[out_offset:]``; fewer only at the
    end of the file. Returns the bytes read."""
    got = 0
    while got < size_bytes:
        data = os.pread(fd, size_bytes - got, position + got)
        if not data:
            break
        out[out_offset + got : out_offset + got + len(data)] = data
        got += len(data)
    return got


def _payload_cost(out: bytearray, at: int, length: int) -> int:
    """What a payload of ``length`` bytes at ``out[at]`` counts against ``bytes_max``: an lz4
    entry its expanded size (a pull's byte limit is in raw bytes), any other its length."""
    if out[at] != _LZ4_ENTRY_MARK:
        return length
    raw_size = int.from_bytes(out[at + 1 : at + 5], "little")
    varint_bytes = 1
    while raw_size >> (7 * varint_bytes):
        varint_bytes += 1
    return 1 + varint_bytes + raw_size


def gather_python(
    fd: int,
    out: bytearray,
    out_offset: int,
    position: int,
    limit: int,
    sequence: int,
    start_seq: int,
    stop_seq: int,
    count_max: int,
    bytes_max: int,
    take_first: bool,
    raw: bool,
    payload_bytes_max: int,
    read_max: int,
) -> Gathered:
    """The pure-Python twin of the compiled walk (see the module docstring)."""
    assert 0 <= out_offset <= len(out) and 0 <= position <= limit and read_max >= 0
    if sequence >= stop_seq or count_max <= 0:
        return DONE, position, sequence, out_offset, 0, 0, out_offset
    wanted = limit - position
    room = min(len(out) - out_offset, read_max)
    to_read = min(room, wanted)
    got = _pread_into(fd, out, out_offset, to_read, position)
    loaded_end = out_offset + got
    room_limited = got == to_read and room < wanted
    short = NEED_ROOM if room_limited else INCOMPLETE_HEADER
    index = out_offset
    out_end = out_offset
    count = taken = 0
    status = DONE
    view = memoryview(out)
    try:
        while sequence < stop_seq and count < count_max:
            if index + _HEADER_BYTES > loaded_end:
                status = short
                break
            version, attributes, _epoch, record_seq, _time, length, stored_crc = (
                _HEADER.unpack_from(out, index)
            )
            if (
                version != _FORMAT_VERSION
                or attributes != 0
                or record_seq != sequence
                or length > payload_bytes_max
            ):
                status = BAD_HEADER
                break
            record_bytes = _HEADER_BYTES + length
            if sequence >= start_seq:
                cost = record_bytes if raw else length
                if not raw and length >= _LZ4_ENTRY_HEAD_BYTES:
                    if index + _HEADER_BYTES + 5 > loaded_end:
                        status = NEED_ROOM if room_limited else INCOMPLETE_RECORD
                        break
                    cost = _payload_cost(out, index + _HEADER_BYTES, length)
                if (count or not take_first) and taken + cost > bytes_max:
                    status = LIMIT
                    break
                if index + record_bytes > loaded_end:
                    status = NEED_ROOM if room_limited else INCOMPLETE_RECORD
                    break
                covered = crc32c.crc32c(view[index : index + _CRC_COVERED_BYTES])
                payload = view[index + _HEADER_BYTES : index + record_bytes]
                if crc32c.crc32c(payload, covered) != stored_crc:
                    status = CRC_MISMATCH
                    break
                source, moved = (index, record_bytes) if raw else (index + _HEADER_BYTES, length)
                view[out_end : out_end + moved] = view[source : source + moved]
                out_end += moved
                taken += cost
                count += 1
            index += record_bytes
            position += record_bytes
            sequence += 1
    finally:
        view.release()
    return status, position, sequence, out_end, count, taken, loaded_end


gather: GatherFunction
try:
    from loghub.storage._gather_c import gather as _gather_compiled  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # built without a C compiler: the same answers, slower
    gather = gather_python
    IMPLEMENTATION = "python"
else:
    gather = _gather_compiled
    IMPLEMENTATION = "compiled"
