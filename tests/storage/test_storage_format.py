"""The on-disk format version: segment headers, upgrade in place, refusal of newer formats.

A format-1 shard (records from byte 0, as every release before segment headers wrote them)
is made here byte by byte, so these tests do not depend on the code that reads it.
"""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest
from storage_helpers import FakeClock

from loghub.errors import CorruptSegmentError, UnsupportedFormatError
from loghub.storage import ShardLog, ShardStore, StorageConfig
from loghub.storage.segment import (
    HEADER_BYTES,
    SEGMENT_FORMAT_VERSION,
    SEGMENT_HEADER_BYTES,
    encode_header,
    encode_segment_header,
    segment_base_sequences,
    segment_format,
)

CONFIG = StorageConfig(segment_bytes_max=1 << 20, index_interval_bytes=64, payload_bytes_max=4096)


def body(sequence: int) -> bytes:
    return b"group %d" % sequence


def format_1_records(first_seq: int, count: int) -> bytes:
    """Records as the first format framed them (epoch 0), back to back."""
    data = b""
    for sequence in range(first_seq, first_seq + count):
        covered = struct.pack(">BBIQQI", 1, 0, 0, sequence, 1_000 + sequence, len(body(sequence)))
        crc = crc32c.crc32c(body(sequence), crc32c.crc32c(covered))
        data += covered + struct.pack(">I", crc) + body(sequence)
    return data


def make_format_1_shard(shard: Path, segments: list[tuple[int, int]]) -> dict[str, bytes]:
    """Format-1 segment files of (base, count) with no index files (they are rebuilt);
    returns every file's bytes by name."""
    shard.mkdir(parents=True)
    files = {}
    for base, count in segments:
        name = f"{base:020d}.log"
        files[name] = format_1_records(base, count)
        (shard / name).write_bytes(files[name])
    return files


def future_header(version: int) -> bytes:
    """A header as a later format would lay it out: same magic, version and checksum."""
    covered = b"LHSG" + struct.pack(">HH", version, 64)
    return covered + struct.pack(">I", crc32c.crc32c(covered))


def format_2_header() -> bytes:
    """The header of a segment written before producers' LZ4 blocks were kept (format 2)."""
    covered = b"LHSG" + struct.pack(">HH", 2, SEGMENT_HEADER_BYTES)
    return covered + struct.pack(">I", crc32c.crc32c(covered))


def make_format_2_segment(shard: Path, base: int, count: int) -> bytes:
    """A format-2 segment file of ``count`` records from ``base``; returns its bytes."""
    shard.mkdir(parents=True, exist_ok=True)
    data = format_2_header() + b"".join(
        encode_header(sequence, 1_000 + sequence, body(sequence)) + body(sequence)
        for sequence in range(base, base + count)
    )
    (shard / f"{base:020d}.log").write_bytes(data)
    return data


def all_bodies(log: ShardLog) -> bytes:
    return log.read(log.begin_seq, 1 << 20, 1 << 30).data


def test_segment_format_reads_the_first_bytes_of_a_file() -> None:
    assert segment_format(encode_segment_header()) == SEGMENT_FORMAT_VERSION
    assert segment_format(b"") == 1
    assert segment_format(format_1_records(0, 1)[:SEGMENT_HEADER_BYTES]) == 1
    assert segment_format(future_header(SEGMENT_FORMAT_VERSION + 1)) == SEGMENT_FORMAT_VERSION + 1
    assert segment_format(format_2_header()) == 2
    assert segment_format(encode_segment_header()[:5]) is None  # torn while created
    damaged = bytearray(encode_segment_header())
    damaged[5] ^= 0x01
    assert segment_format(bytes(damaged)) is None  # the checksum tells damage from a version


def test_new_segments_start_with_the_header_and_hold_records_after_it(tmp_path: Path) -> None:
    log = ShardLog.open(tmp_path / "shard", CONFIG, FakeClock())
    try:
        log.append(b"first", 1_000)
    finally:
        log.close()
    data = (tmp_path / "shard" / f"{0:020d}.log").read_bytes()
    assert data[:SEGMENT_HEADER_BYTES] == encode_segment_header()
    assert data[SEGMENT_HEADER_BYTES:] == encode_header(0, 1_000, b"first") + b"first"


def test_a_format_1_shard_upgrades_in_place_and_reads_as_before(tmp_path: Path) -> None:
    shard = tmp_path / "shard"
    old_files = make_format_1_shard(shard, [(0, 4), (4, 3)])
    expected = b"".join(body(sequence) for sequence in range(7))

    log = ShardLog.open(shard, CONFIG, FakeClock())
    try:
        assert (log.begin_seq, log.end_seq) == (0, 7)
        assert all_bodies(log) == expected
        assert log.append(b"new 7", 5_000) == 7
        assert log.append(b"new 8", 5_001) == 8
    finally:
        log.close()

    # the old files are untouched; the new records went to a new segment of the new format
    assert segment_base_sequences(shard) == [0, 4, 7]
    for name, data in old_files.items():
        assert (shard / name).read_bytes() == data
    new_segment = (shard / f"{7:020d}.log").read_bytes()
    assert new_segment[:SEGMENT_HEADER_BYTES] == encode_segment_header()

    reopened = ShardLog.open(shard, CONFIG, FakeClock())
    try:
        assert reopened.end_seq == 9
        assert all_bodies(reopened) == expected + b"new 7new 8"
        assert reopened.seq_for_time(1_005) == 5
        assert reopened.leader_epochs() == [(0, 0)]
    finally:
        reopened.close()


@pytest.mark.parametrize("older", [1, 2])
def test_an_empty_active_segment_of_an_older_format_gets_the_header_in_place(
    tmp_path: Path, older: int
) -> None:
    shard = tmp_path / "shard"
    if older == 1:
        make_format_1_shard(shard, [(0, 3), (3, 0)])  # retention left an empty active segment
    else:
        make_format_2_segment(shard, 0, 3)
        make_format_2_segment(shard, 3, 0)

    log = ShardLog.open(shard, CONFIG, FakeClock())
    try:
        assert log.append(b"after", 2_000) == 3
    finally:
        log.close()

    assert segment_base_sequences(shard) == [0, 3]
    data = (shard / f"{3:020d}.log").read_bytes()
    assert data == encode_segment_header() + encode_header(3, 2_000, b"after") + b"after"


def test_a_format_2_segment_is_read_as_before_and_new_records_go_to_a_format_3_one(
    tmp_path: Path,
) -> None:
    """An older LogHub refuses format 3, whose payloads may be kept lz4 blocks: records are
    never added to a format-2 file, so that it stays readable by the version that wrote it."""
    shard = tmp_path / "shard"
    old = make_format_2_segment(shard, 0, 4)
    log = ShardLog.open(shard, CONFIG, FakeClock())
    try:
        assert all_bodies(log) == b"".join(body(sequence) for sequence in range(4))
        assert log.append(b"new 4", 5_000) == 4
    finally:
        log.close()
    assert (shard / f"{0:020d}.log").read_bytes() == old
    assert segment_base_sequences(shard) == [0, 4]
    new = (shard / f"{4:020d}.log").read_bytes()
    assert new[:SEGMENT_HEADER_BYTES] == encode_segment_header()
    assert segment_format(new) == SEGMENT_FORMAT_VERSION == 3


@pytest.mark.parametrize("position", ["active", "sealed"])
def test_a_segment_of_a_newer_format_is_refused_and_left_as_it_is(
    tmp_path: Path, position: str
) -> None:
    shard = tmp_path / "shard"
    make_format_1_shard(shard, [(0, 3)])
    base = 3 if position == "active" else 0
    newer = future_header(SEGMENT_FORMAT_VERSION + 1) + b"\x99" * 200
    if position == "sealed":
        (shard / f"{3:020d}.log").write_bytes(format_1_records(3, 2))
    (shard / f"{base:020d}.log").write_bytes(newer)

    refused = f"segment format {SEGMENT_FORMAT_VERSION + 1} was written by a newer LogHub"
    with pytest.raises(UnsupportedFormatError, match=refused):
        ShardLog.open(shard, CONFIG, FakeClock())
    assert (shard / f"{base:020d}.log").read_bytes() == newer  # nothing cut


def test_the_shard_store_refuses_a_newer_format_before_any_shard_opens(tmp_path: Path) -> None:
    shard = tmp_path / "shards" / "project" / "store-0a1b2c3d" / "0"
    make_format_1_shard(shard, [(0, 3)])
    store = ShardStore(tmp_path / "shards", CONFIG, FakeClock())
    try:
        assert store.check_formats() == 1
        (shard / f"{3:020d}.log").write_bytes(future_header(7))
        with pytest.raises(UnsupportedFormatError, match=r"00000000000000000003\.log"):
            store.check_formats()
    finally:
        store.close()


def test_a_damaged_segment_header_is_rewritten_when_the_first_record_proves_it(
    tmp_path: Path,
) -> None:
    log = ShardLog.open(tmp_path / "shard", CONFIG, FakeClock())
    for index in range(3):
        log.append(body(index), 1_000)
    log.close()
    path = tmp_path / "shard" / f"{0:020d}.log"
    data = bytearray(path.read_bytes())
    data[0:4] = b"\x00\xff\x00\xff"  # the magic
    path.write_bytes(bytes(data))

    reopened = ShardLog.open(tmp_path / "shard", CONFIG, FakeClock())
    try:
        assert all_bodies(reopened) == body(0) + body(1) + body(2)
        assert reopened.lost_ranges() == []
    finally:
        reopened.close()
    assert path.read_bytes()[:SEGMENT_HEADER_BYTES] == encode_segment_header()


def test_a_header_torn_while_the_segment_was_created_is_rewritten(tmp_path: Path) -> None:
    shard = tmp_path / "shard"
    make_format_1_shard(shard, [(0, 3)])
    (shard / f"{3:020d}.log").write_bytes(encode_segment_header()[:5])

    log = ShardLog.open(shard, CONFIG, FakeClock())
    try:
        assert log.end_seq == 3
        assert log.append(b"next", 2_000) == 3
        assert all_bodies(log) == body(0) + body(1) + body(2) + b"next"
    finally:
        log.close()


def test_a_damaged_header_before_a_damaged_record_is_refused(tmp_path: Path) -> None:
    log = ShardLog.open(tmp_path / "shard", CONFIG, FakeClock())
    for index in range(3):
        log.append(body(index), 1_000)
    log.close()
    path = tmp_path / "shard" / f"{0:020d}.log"
    data = bytearray(path.read_bytes())
    data[5] ^= 0x01  # the version: the header's checksum fails
    data[SEGMENT_HEADER_BYTES + HEADER_BYTES] ^= 0xFF  # the first record's payload
    path.write_bytes(bytes(data))

    with pytest.raises(CorruptSegmentError, match="segment header is damaged"):
        ShardLog.open(tmp_path / "shard", CONFIG, FakeClock())
    assert path.read_bytes() == bytes(data)
