"""The on-disk formats: record header, offset index and time index entries."""

from __future__ import annotations

import struct

import crc32c
import pytest
from conftest import OpenLog

from loghub.errors import RecordsLostError
from loghub.storage import StorageConfig
from loghub.storage.segment import (
    HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    encode_header,
    encode_segment_header,
    record_crc_matches,
)


def test_record_header_layout_is_big_endian_with_crc_over_header_and_payload() -> None:
    header = encode_header(sequence=7, receive_time_ms=1234, payload=b"hello", leader_epoch=3)

    fields = struct.unpack(">BBIQQII", header)
    assert fields[:6] == (1, 0, 3, 7, 1234, 5)
    assert fields[6] == crc32c.crc32c(b"hello", crc32c.crc32c(header[:26]))
    assert len(header) == HEADER_BYTES == 30
    assert record_crc_matches(header + b"hello")
    assert not record_crc_matches(header + b"jello")


def test_segment_files_hold_exactly_the_framed_records_and_index_entries(
    open_log: OpenLog,
) -> None:
    config = StorageConfig(segment_bytes_max=1 << 20, index_interval_bytes=100)
    log = open_log(config)
    for index in range(10):
        log.append(b"p" * 40, 1000 + index // 3)  # times 1000 x3, 1001 x3, 1002 x3, 1003

    log.close()  # the index files are written whole when a segment is sealed or closed
    log_file = log.path / "00000000000000000000.log"
    data = log_file.read_bytes()
    assert len(data) == SEGMENT_HEADER_BYTES + 10 * (HEADER_BYTES + 40)
    assert data[:SEGMENT_HEADER_BYTES] == encode_segment_header()
    first = data[SEGMENT_HEADER_BYTES : SEGMENT_HEADER_BYTES + HEADER_BYTES]
    assert first == encode_header(0, 1000, b"p" * 40)
    offsets = list(struct.iter_unpack(">II", log_file.with_suffix(".index").read_bytes()[:-8]))
    assert offsets == [(0, 12), (2, 152), (4, 292), (6, 432), (8, 572)]
    times = list(struct.iter_unpack(">QI", log_file.with_suffix(".timeindex").read_bytes()[:-8]))
    assert times == [(1000, 0), (1001, 3), (1002, 6), (1003, 9)]


def test_records_larger_than_one_read_chunk_are_read_whole(open_log: OpenLog) -> None:
    config = StorageConfig(segment_bytes_max=1 << 20, payload_bytes_max=200_000)
    log = open_log(config)
    payloads = [bytes([index]) * 100_000 for index in range(5)]
    for item in payloads:
        log.append(item, 1)

    assert log.read(0, 10, 1).data == payloads[0]
    assert log.read(1, 10, 150_000).data == payloads[1]
    assert log.read(0, 10, 10**7).data == b"".join(payloads)
    assert log.read(3, 10, 10**7).data == b"".join(payloads[3:])


def test_a_record_with_the_wrong_sequence_is_lost_on_read(open_log: OpenLog) -> None:
    log = open_log(StorageConfig(segment_bytes_max=1 << 20))
    log.append(b"a", 1)
    log.append(b"b", 1)
    with open(log.path / "00000000000000000000.log", "r+b") as file:
        file.seek(SEGMENT_HEADER_BYTES + HEADER_BYTES + 1 + 6)  # the second record's sequence
        file.write(struct.pack(">Q", 5))

    assert log.read(0, 2, 100).data == b"a"
    with pytest.raises(RecordsLostError):
        log.read(1, 2, 100)
    assert log.end_seq == 2
    assert log.append(b"c", 1) == 2
