"""Damage on disk costs the damaged record, never the acknowledged records after it.

Each test writes 300 records, damages one (a payload byte, a bit of its length field, its
sequence field), in the active segment or in a closed one, or cuts a closed segment short, or
edits an index, and then checks: every other record reads back byte for byte, end_seq and
the sequences after the damage are unchanged, the next write gets sequence 300, a read that
starts in the lost range gets RecordsLostError naming the range, and one that starts before it
stops at its start.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import crc32c
import pytest
from conftest import OpenLog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import FakeClock, payload

from loghub.errors import RecordsLostError
from loghub.storage import ShardLog, StorageConfig
from loghub.storage.segment import (
    HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    encode_header,
    segment_base_sequences,
)

RECORDS = 300
DAMAGED = 100
PAYLOAD_BYTES = 40
RECORD_BYTES = HEADER_BYTES + PAYLOAD_BYTES
# One segment for everything, or segments of 64 records, so that record 100 is in a closed one.
ONE_SEGMENT = StorageConfig(
    segment_bytes_max=1 << 20, index_interval_bytes=256, payload_bytes_max=4096
)
SEGMENTS_OF_64 = StorageConfig(
    segment_bytes_max=64 * RECORD_BYTES, index_interval_bytes=256, payload_bytes_max=4096
)


def write_records(log: ShardLog) -> list[bytes]:
    payloads = [payload(index, size=PAYLOAD_BYTES) for index in range(RECORDS)]
    for index, item in enumerate(payloads):
        assert log.append(item, 1_000 + index) == index
    return payloads


def record_position(shard: Path, sequence: int) -> tuple[Path, int]:
    """The log file holding ``sequence`` and the record's position in it."""
    bases = segment_base_sequences(shard)
    base = max(base for base in bases if base <= sequence)
    return shard / f"{base:020d}.log", SEGMENT_HEADER_BYTES + (sequence - base) * RECORD_BYTES


def flip(path: Path, position: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        byte = file.read(1)[0]
        file.seek(position)
        file.write(bytes([byte ^ mask]))


def assert_only_lost(log: ShardLog, payloads: list[bytes], lost: range) -> None:
    """Every record outside ``lost`` reads back; reads stop before it and fail inside it."""
    assert log.end_seq == RECORDS
    before = log.read(0, RECORDS, 1 << 30)  # damage in a closed segment is found here
    assert log.lost_ranges() == [(lost.start, lost.stop)]
    assert before.data == b"".join(payloads[: lost.start])
    assert before.next_seq == lost.start
    for sequence in lost:
        with pytest.raises(RecordsLostError) as caught:
            log.read(sequence, 10, 1 << 30)
        assert (caught.value.first_seq, caught.value.end_seq) == (lost.start, lost.stop)
        assert "/" not in caught.value.message  # names the shard, not a path
    after = log.read(lost.stop, RECORDS, 1 << 30)
    assert after.data == b"".join(payloads[lost.stop :])
    for sequence in (0, lost.start - 1, lost.stop, 150, RECORDS - 1):
        assert log.read(sequence, 1, 1 << 30).data == payloads[sequence]
        assert log.receive_time_ms(sequence) == 1_000 + sequence
    assert log.seq_for_time(1_000 + 150) == 150
    assert log.append(b"after the damage", 5_000) == RECORDS


@pytest.mark.parametrize("config", [ONE_SEGMENT, SEGMENTS_OF_64], ids=["active", "closed"])
@pytest.mark.parametrize(
    "damage",
    ["payload byte", "length low bit", "length high bit", "sequence field", "magic byte"],
)
def test_one_damaged_record_costs_that_record_alone(
    open_log: OpenLog, tmp_path: Path, config: StorageConfig, damage: str
) -> None:
    writer = open_log(config)
    payloads = write_records(writer)
    writer.close()
    log_file, position = record_position(tmp_path / "shard", DAMAGED)
    offsets = {
        "payload byte": (HEADER_BYTES + 7, 0xFF),
        "length low bit": (22 + 3, 0x01),
        "length high bit": (22, 0x80),
        "sequence field": (6 + 7, 0x04),
        "magic byte": (0, 0xFF),
    }
    offset, mask = offsets[damage]
    flip(log_file, position + offset, mask)

    assert_only_lost(open_log(config), payloads, range(DAMAGED, DAMAGED + 1))


def test_damage_made_while_the_shard_is_open_is_found_by_the_read(
    open_log: OpenLog, tmp_path: Path
) -> None:
    log = open_log(SEGMENTS_OF_64)
    payloads = write_records(log)
    log_file, position = record_position(tmp_path / "shard", DAMAGED)
    flip(log_file, position + HEADER_BYTES + 3)

    assert_only_lost(log, payloads, range(DAMAGED, DAMAGED + 1))


def test_truncated_closed_segment_loses_its_tail_and_nothing_else(
    open_log: OpenLog, tmp_path: Path
) -> None:
    writer = open_log(SEGMENTS_OF_64)
    payloads = write_records(writer)
    writer.close()
    log_file, position = record_position(tmp_path / "shard", DAMAGED)
    os.truncate(log_file, position + 5)  # record 100 cut mid-header; 101..127 gone
    next_base = min(b for b in segment_base_sequences(tmp_path / "shard") if b > DAMAGED)

    assert_only_lost(open_log(SEGMENTS_OF_64), payloads, range(DAMAGED, next_base))


def test_only_an_unacknowledged_torn_tail_is_cut(open_log: OpenLog, tmp_path: Path) -> None:
    writer = open_log(ONE_SEGMENT)
    payloads = write_records(writer)
    writer.close()
    log_file = tmp_path / "shard" / "00000000000000000000.log"
    with open(log_file, "ab") as file:  # half of a record that was never acknowledged
        file.write(encode_header(RECORDS, 2_000, b"x" * 100) + b"x" * 10)

    log = open_log(ONE_SEGMENT)

    assert log.end_seq == RECORDS
    assert log.lost_ranges() == []
    assert log_file.stat().st_size == SEGMENT_HEADER_BYTES + RECORDS * RECORD_BYTES
    assert log.read(0, RECORDS, 1 << 30).data == b"".join(payloads)


@pytest.mark.parametrize("index_suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("edit", ["shifted", "entry edited, checksum redone"])
def test_a_shifted_or_edited_index_is_never_trusted(
    open_log: OpenLog, tmp_path: Path, index_suffix: str, edit: str
) -> None:
    writer = open_log(SEGMENTS_OF_64)
    payloads = write_records(writer)
    writer.close()
    log_file, _ = record_position(tmp_path / "shard", DAMAGED)
    index_file = log_file.with_suffix(index_suffix)
    data = index_file.read_bytes()
    entries = data[:-8]
    entry_bytes = 8 if index_suffix == ".index" else 12
    if edit == "shifted":
        index_file.write_bytes(b"\x00" * 4 + data)
    else:  # move entry 2 one record on (as a bug writing it would), with a valid checksum
        first, second = struct.unpack_from(">II" if entry_bytes == 8 else ">QI", entries, 16)
        changed = (first + 1, second + RECORD_BYTES) if entry_bytes == 8 else (first, second + 1)
        packed = struct.pack(">II" if entry_bytes == 8 else ">QI", *changed)
        start = 2 * entry_bytes
        entries = entries[:start] + packed + entries[start + entry_bytes :]
        index_file.write_bytes(entries + b"LHX1" + struct.pack(">I", crc32c.crc32c(entries)))

    log = open_log(SEGMENTS_OF_64)

    assert log.lost_ranges() == []
    for sequence in range(RECORDS):
        assert log.read(sequence, 1, 1 << 30).data == payloads[sequence]
    assert log.read(0, RECORDS, 1 << 30).data == b"".join(payloads)
    for sequence in range(0, RECORDS, 7):
        assert log.seq_for_time(1_000 + sequence) == sequence
        assert log.receive_time_ms(sequence) == 1_000 + sequence


def test_a_segment_written_by_the_first_format_opens_and_reads(tmp_path: Path) -> None:
    """Bytes as the first release wrote them: records with the 30-byte header, index files
    without the checksum trailer (so they are rebuilt once)."""
    shard = tmp_path / "shard"
    shard.mkdir()
    records, offsets, times = b"", b"", b""
    for sequence in range(5):
        body = b"group %d" % sequence
        covered = struct.pack(">BBIQQI", 1, 0, 0, sequence, 1_000 + sequence, len(body))
        crc = crc32c.crc32c(body, crc32c.crc32c(covered))
        if sequence == 0:
            offsets += struct.pack(">II", 0, 0)
        times += struct.pack(">QI", 1_000 + sequence, sequence)
        records += covered + struct.pack(">I", crc) + body
    (shard / "00000000000000000000.log").write_bytes(records)
    (shard / "00000000000000000000.index").write_bytes(offsets)
    (shard / "00000000000000000000.timeindex").write_bytes(times)

    log = ShardLog.open(shard, ONE_SEGMENT, FakeClock())
    try:
        assert log.end_seq == 5
        assert log.read(0, 10, 1 << 20).data == b"".join(b"group %d" % i for i in range(5))
        assert log.seq_for_time(1_003) == 3
        assert log.append(b"group 5", 2_000) == 5
    finally:
        log.close()
    assert (shard / "00000000000000000000.index").read_bytes()[-8:-4] == b"LHX1"


@settings(
    derandomize=True,
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    sequence=st.integers(0, 58),
    offset=st.integers(0, RECORD_BYTES - 1),
    mask=st.integers(1, 255),
    closed=st.booleans(),
)
def test_any_single_damaged_byte_costs_at_most_its_own_record(
    tmp_path_factory: pytest.TempPathFactory,
    sequence: int,
    offset: int,
    mask: int,
    closed: bool,
) -> None:
    shard = tmp_path_factory.mktemp("shard")
    config = StorageConfig(
        segment_bytes_max=(20 if closed else 1000) * RECORD_BYTES,
        index_interval_bytes=128,
        payload_bytes_max=4096,
    )
    payloads = [payload(index, size=PAYLOAD_BYTES) for index in range(60)]
    log = ShardLog.open(shard, config, FakeClock())
    for index, item in enumerate(payloads):
        log.append(item, 1_000 + index)
    log.close()
    log_file, position = record_position(shard, sequence)
    flip(log_file, position + offset, mask)

    log = ShardLog.open(shard, config, FakeClock())
    try:
        assert log.end_seq == 60
        assert log.lost_ranges() in ([], [(sequence, sequence + 1)])
        for index in range(60):
            if index != sequence:
                assert log.read(index, 1, 1 << 20).data == payloads[index]
        assert log.append(b"next", 9_000) == 60
    finally:
        log.close()
