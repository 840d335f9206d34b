"""The bytes of a shard's segment files, as the nemesis damages them and the checker compares
them (the layout is ``loghub.storage.segment``'s, read here independently of it).

A segment file (``<base sequence:020d>.log``) opens with a 12-byte header (``LHSG``, format,
header length, CRC; absent in format 1), then records back to back: a 30-byte header
(``>BBIQQII``: format version, attributes, leader epoch, sequence, receive time, payload
length, CRC32C of the first 26 header bytes then the payload) and the payload.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import crc32c

__all__ = [
    "RECORD_HEADER",
    "SEGMENT_HEADER",
    "Record",
    "copy_difference",
    "read_copy",
    "walk",
]

SEGMENT_HEADER = struct.Struct(">4sHHI")
RECORD_HEADER = struct.Struct(">BBIQQII")

Copy = list[tuple[str, bytes]]  # a node's copy of a shard: (file name, bytes), in name order


@dataclass(frozen=True)
class Record:
    """One whole record of a segment file (positions in that file)."""

    position: int
    epoch: int
    sequence: int
    time_ms: int
    payload_start: int
    end: int
    crc_ok: bool


def walk(data: bytes) -> tuple[list[Record], int]:
    """The whole records of one segment file's bytes, in order, and where the bytes after
    the last of them start (the file's length when nothing follows). The walk trusts each
    header's length (a damaged length ends it); a record whose CRC fails is still listed."""
    position = SEGMENT_HEADER.size if data[:4] == b"LHSG" else 0
    found = []
    while position + RECORD_HEADER.size <= len(data):
        _version, _attributes, epoch, sequence, time_ms, length, crc = RECORD_HEADER.unpack_from(
            data, position
        )
        payload_start = position + RECORD_HEADER.size
        end = payload_start + length
        if end > len(data):
            break
        computed = crc32c.crc32c(
            data[payload_start:end], crc32c.crc32c(data[position : position + 26])
        )
        found.append(
            Record(position, epoch, sequence, time_ms, payload_start, end, computed == crc)
        )
        position = end
    return found, position


def read_copy(shard_dir: Path) -> Copy:
    """A node's segment files of a shard, in name order."""
    return [(p.name, p.read_bytes()) for p in sorted(shard_dir.glob("*.log"))]


def _by_sequence(copy: Copy) -> tuple[dict[int, tuple[bytes, int]], int]:
    """sequence -> (record bytes, epoch), and the bytes that are not whole records."""
    records: dict[int, tuple[bytes, int]] = {}
    loose = 0
    for _name, data in copy:
        walked, end = walk(data)
        loose += len(data) - end
        for record in walked:
            records[record.sequence] = (data[record.position : record.end], record.epoch)
    return records, loose


def copy_difference(reference: Copy, other: Copy) -> str | None:
    """None when the two copies are byte-identical (the files concatenated in name order);
    else what differs, record by record: the first sequence whose bytes differ (and where
    in the record), the sequences only one copy holds, bytes that are not whole records."""
    if b"".join(d for _n, d in reference) == b"".join(d for _n, d in other):
        return None
    mine, mine_loose = _by_sequence(reference)
    theirs, their_loose = _by_sequence(other)
    parts = [f"{len(mine)} vs {len(theirs)} records"]
    names = ([n for n, _d in reference], [n for n, _d in other])
    if names[0] != names[1]:
        parts.append(f"files {names[0]} vs {names[1]}")
    differing = sorted(s for s in mine.keys() & theirs.keys() if mine[s] != theirs[s])
    if differing:
        first = differing[0]
        a, b = mine[first][0], theirs[first][0]
        at = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        where = "header" if at < RECORD_HEADER.size else "payload"
        parts.append(
            f"{len(differing)} records differ, the first seq {first} (epoch {mine[first][1]} vs "
            f"{theirs[first][1]}, byte {at} of the record, in its {where})"
        )
    only_mine = sorted(mine.keys() - theirs.keys())
    only_theirs = sorted(theirs.keys() - mine.keys())
    if only_mine:
        parts.append(f"seq {_span(only_mine)} only in the first")
    if only_theirs:
        parts.append(f"seq {_span(only_theirs)} only in the second")
    if mine_loose or their_loose:
        parts.append(f"{mine_loose} vs {their_loose} bytes outside whole records")
    if len(parts) == 1:
        parts.append("the same records, other bytes between them")
    return "; ".join(parts)


def _span(sequences: list[int]) -> str:
    if len(sequences) == 1:
        return str(sequences[0])
    return f"{sequences[0]}..{sequences[-1]} ({len(sequences)})"
