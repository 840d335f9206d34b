"""Recovery on open: torn or corrupt tails are cut, indexes are rebuilt from the log."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from conftest import OpenLog
from storage_helpers import SMALL, FakeClock, payload

from loghub.errors import RecordsLostError
from loghub.storage import ShardLog, StorageConfig
from loghub.storage._files import FileCache
from loghub.storage.segment import (
    HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    Segment,
    segment_base_sequences,
)

BIG_SEGMENTS = StorageConfig(
    segment_bytes_max=1 << 20, index_interval_bytes=64, payload_bytes_max=4096
)


def fill(open_log: OpenLog, count: int, size: int = 20) -> tuple[Path, list[bytes]]:
    """``count`` records of ``size`` bytes in one segment; returns its log file and payloads."""
    log = open_log(BIG_SEGMENTS)
    payloads = [payload(index, size=size) for index in range(count)]
    for item in payloads:
        log.append(item, 1000)
    log.close()
    return log.path / "00000000000000000000.log", payloads


def record_bytes(size: int) -> int:
    return HEADER_BYTES + size


def position(index: int, size: int = 20) -> int:
    """Where record ``index`` of a segment of ``size``-byte payloads starts."""
    return SEGMENT_HEADER_BYTES + index * record_bytes(size)


def test_junk_over_the_tail_is_cut_and_the_records_before_it_kept(
    open_log: OpenLog, caplog: pytest.LogCaptureFixture
) -> None:
    log_file, payloads = fill(open_log, 10)
    keep = 7
    with open(log_file, "r+b") as file:
        file.seek(position(keep))
        file.write(b"\xde\xad\xbe\xef" * 30)  # over records 7..9 and past the end
    size_before = log_file.stat().st_size

    with caplog.at_level(logging.WARNING, logger="loghub.storage"):
        log = open_log(BIG_SEGMENTS)

    assert log.end_seq == keep
    assert log.read(0, 100, 1 << 20).data == b"".join(payloads[:keep])
    assert log_file.stat().st_size == position(keep)
    cut = size_before - position(keep)
    assert f"cut {cut} bytes" in caplog.text
    assert log.append(b"next", 1000) == keep


def test_recover_returns_the_bytes_it_cut(open_log: OpenLog) -> None:
    log_file, _payloads = fill(open_log, 5)
    with open(log_file, "ab") as file:
        file.write(b"junk" * 10)
    segment = Segment.open(
        log_file.parent, 0, index_interval_bytes=64, payload_bytes_max=4096, files=FileCache(4)
    )
    try:
        assert segment.recover() == 40
        assert segment.recover() == 0
        assert segment.record_count == 5
    finally:
        segment.close()


def test_file_cut_mid_record_keeps_the_whole_records(open_log: OpenLog) -> None:
    log_file, payloads = fill(open_log, 10)
    os.truncate(log_file, position(6) + HEADER_BYTES + 5)

    log = open_log(BIG_SEGMENTS)

    assert log.end_seq == 6
    assert log.read(0, 100, 1 << 20).data == b"".join(payloads[:6])
    assert log_file.stat().st_size == position(6)


def test_file_cut_mid_header_keeps_the_whole_records(open_log: OpenLog) -> None:
    log_file, payloads = fill(open_log, 10)
    os.truncate(log_file, position(4) + 3)

    log = open_log(BIG_SEGMENTS)

    assert log.end_seq == 4
    assert log.read(0, 100, 1 << 20).data == b"".join(payloads[:4])


def test_one_damaged_byte_in_the_last_segment_costs_only_its_record(open_log: OpenLog) -> None:
    log_file, payloads = fill(open_log, 10)
    with open(log_file, "r+b") as file:
        file.seek(position(3) + HEADER_BYTES + 4)  # inside record 3's payload
        file.write(b"X")

    log = open_log(BIG_SEGMENTS)

    assert log.end_seq == 10
    assert log.lost_ranges() == [(3, 4)]
    assert log.read(0, 100, 1 << 20).data == b"".join(payloads[:3])
    with pytest.raises(RecordsLostError) as caught:
        log.read(3, 100, 1 << 20)
    assert (caught.value.first_seq, caught.value.end_seq) == (3, 4)
    assert log.read(4, 100, 1 << 20).data == b"".join(payloads[4:])
    assert log_file.stat().st_size == position(10)
    assert log.append(b"next", 1000) == 10


def test_corrupt_first_record_costs_only_the_first_record(open_log: OpenLog) -> None:
    log_file, payloads = fill(open_log, 3)
    with open(log_file, "r+b") as file:
        file.seek(position(0))
        file.write(b"\x07")  # format version 7

    log = open_log(BIG_SEGMENTS)

    assert (log.begin_seq, log.end_seq) == (0, 3)
    assert log.read(1, 10, 1 << 20).data == b"".join(payloads[1:])
    assert log.append(b"fresh", 1) == 3


@pytest.mark.parametrize("damage", ["missing", "truncated", "junk"])
def test_damaged_index_files_of_the_last_segment_are_rebuilt(
    open_log: OpenLog, damage: str
) -> None:
    log_file, payloads = fill(open_log, 40)
    index_files = [log_file.with_suffix(".index"), log_file.with_suffix(".timeindex")]
    expected = [path.read_bytes() for path in index_files]
    for path in index_files:
        if damage == "missing":
            path.unlink()
        elif damage == "truncated":
            os.truncate(path, path.stat().st_size - 3)
        else:
            path.write_bytes(b"\xff" * 24)

    log = open_log(BIG_SEGMENTS)

    assert [path.read_bytes() for path in index_files] == expected
    for start in range(40):
        assert log.read(start, 1, 1 << 20).data == payloads[start]
    assert log.seq_for_time(1000) == 0


@pytest.mark.parametrize("damage", ["missing", "junk", "stale"])
def test_damaged_index_files_of_a_sealed_segment_are_rebuilt(
    open_log: OpenLog, damage: str
) -> None:
    log = open_log()
    payloads = [payload(index) for index in range(40)]
    for index, item in enumerate(payloads):
        log.append(item, 1000 + index)
    log.close()
    bases = segment_base_sequences(log.path)
    assert len(bases) > 3
    first = log.path / f"{bases[0]:020d}.log"
    index_files = [first.with_suffix(".index"), first.with_suffix(".timeindex")]
    expected = [path.read_bytes() for path in index_files]
    for path in index_files:
        if damage == "missing":
            path.unlink()
        elif damage == "junk":
            path.write_bytes(b"\x00\x00\x00\x09" * 6)
        else:  # a valid prefix, as if the last entries never reached the disk
            os.truncate(path, path.stat().st_size - (8 if path.suffix == ".index" else 12))

    reopened = open_log()

    assert [path.read_bytes() for path in index_files] == expected
    assert reopened.read(0, 100, 1 << 20).data == b"".join(payloads)
    assert [reopened.receive_time_ms(seq) for seq in range(40)] == [1000 + i for i in range(40)]


def test_corrupt_sealed_segment_whose_index_is_lost_still_opens(open_log: OpenLog) -> None:
    log = open_log()
    payloads = [payload(index) for index in range(20)]
    for item in payloads:
        log.append(item, 1000)
    log.close()
    first = log.path / "00000000000000000000.log"
    first.with_suffix(".index").unlink()
    with open(first, "r+b") as file:
        file.seek(HEADER_BYTES + 2)
        file.write(b"?")

    reopened = ShardLog.open(log.path, SMALL, FakeClock())
    try:
        assert reopened.lost_ranges() == [(0, 1)]
        assert reopened.read(1, 100, 1 << 20).data == b"".join(payloads[1:])
        assert reopened.append(b"more", 1000) == 20
    finally:
        reopened.close()


def test_damage_found_by_a_read_stops_reads_before_it_and_refuses_reads_in_it(
    open_log: OpenLog,
) -> None:
    log = open_log(BIG_SEGMENTS)
    payloads = [payload(index, size=20) for index in range(5)]
    for item in payloads:
        log.append(item, 1000)
    with open(log.path / "00000000000000000000.log", "r+b") as file:
        file.seek(2 * record_bytes(20) + HEADER_BYTES)
        file.write(b"!")

    assert log.read(0, 2, 1 << 20).count == 2
    assert log.read(0, 5, 1 << 20).data == b"".join(payloads[:2])
    with pytest.raises(RecordsLostError):
        log.read(2, 5, 1 << 20)
    assert log.read(3, 5, 1 << 20).data == b"".join(payloads[3:])
    assert log.statistics().lost_record_count == 1
