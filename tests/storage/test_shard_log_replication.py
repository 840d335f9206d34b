"""ShardLog for replication: a high watermark set from outside."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from conftest import OpenLog
from storage_helpers import payload

from loghub.errors import SequenceOutOfRangeError
from loghub.storage import ShardLog
from loghub.storage.segment import HEADER, HEADER_BYTES

PAYLOAD_BYTES = 20


def append_range(log: ShardLog, first: int, end: int, time_ms: int = 1_000) -> None:
    """Appends records ``first``..``end - 1`` (``payload(index)``), one ms apart."""
    for index in range(first, end):
        assert log.append(payload(index, size=PAYLOAD_BYTES), time_ms + index) == index


def records(log: ShardLog) -> list[tuple[int, int, int, bytes]]:
    """(sequence, leader epoch, receive time, payload) of every record up to end_seq."""
    raw = log.read_raw(log.begin_seq, 1 << 30)
    found, position = [], 0
    while position < len(raw):
        fields = HEADER.unpack_from(raw, position)
        end = position + HEADER_BYTES + fields[5]
        found.append((fields[3], fields[2], fields[4], raw[position + HEADER_BYTES : end]))
        position = end
    return found


# --- the high watermark ---------------------------------------------------------------------


def test_a_single_server_log_keeps_the_high_watermark_at_the_end(open_log: OpenLog) -> None:
    log = open_log()
    heard: list[int] = []
    log.end_seq_listener = heard.append
    append_range(log, 0, 12)
    assert not log.is_replicated
    assert log.high_watermark_seq == log.end_seq == 12
    assert heard == list(range(1, 13))
    assert log.read(0, 100, 1 << 20).count == 12
    assert log.seq_for_time(10**9) == 12
    assert log.receive_time_ms(12) == 1_011
    assert log.wait_for_high_watermark(12, timeout_s=0) == 12
    assert log.advance_high_watermark(5) == 12 and not log.is_replicated  # nothing to move
    statistics = log.statistics()
    assert statistics.high_watermark_seq == statistics.end_seq == 12
    append_range(log, 12, 14)
    assert log.high_watermark_seq == 14 and heard[-2:] == [13, 14]


def test_in_replicated_mode_appends_leave_the_high_watermark_and_reads_stop_at_it(
    open_log: OpenLog,
) -> None:
    log = open_log()
    append_range(log, 0, 5)
    log.set_replicated(3)
    assert log.is_replicated and log.high_watermark_seq == 3
    heard: list[int] = []
    log.end_seq_listener = heard.append
    append_range(log, 5, 20)
    assert (log.high_watermark_seq, log.end_seq) == (3, 20)
    assert heard == []  # nothing new is committed: parked pulls stay parked

    batch = log.read(0, 100, 1 << 20)
    assert batch.count == 3 and batch.next_seq == 3
    assert batch.data == b"".join(payload(i, size=PAYLOAD_BYTES) for i in range(3))
    for cursor in (3, 10, 20):  # between the high watermark and the end: valid, empty
        assert log.read(cursor, 100, 1 << 20).count == 0
    with pytest.raises(SequenceOutOfRangeError):
        log.read(21, 100, 1 << 20)
    assert [r[0] for r in records(log)] == list(range(20))  # a follower copies them all

    assert log.seq_for_time(1_001) == 1
    assert log.seq_for_time(1_010) == 3  # record 10 is not committed yet
    assert log.seq_for_time(10**9) == 3
    assert log.receive_time_ms(1) == 1_001
    assert log.receive_time_ms(3) == log.receive_time_ms(15) == 1_002  # the newest committed
    statistics = log.statistics()
    assert (statistics.high_watermark_seq, statistics.end_seq) == (3, 20)
    assert log.seal() == 20


def test_set_replicated_keeps_the_start_within_begin_and_end(
    open_log: OpenLog, tmp_path: Path
) -> None:
    log = open_log()
    append_range(log, 0, 10)
    log.set_replicated(100)
    assert log.high_watermark_seq == 10

    other = open_log(path=tmp_path / "other")
    append_range(other, 0, 30, time_ms=1_000)
    assert other.apply_retention(now_ms=1_015, ttl_ms=0) > 0
    begin_seq = other.begin_seq
    assert 0 < begin_seq < 30
    other.set_replicated(0)
    assert other.high_watermark_seq == begin_seq
    assert other.read(begin_seq, 10, 1 << 20).count == 0


def test_the_high_watermark_never_goes_back_is_capped_at_the_end_and_wakes_listeners(
    open_log: OpenLog,
) -> None:
    log = open_log()
    append_range(log, 0, 10)
    log.set_replicated(2)
    heard: list[int] = []
    log.end_seq_listener = heard.append
    assert log.advance_high_watermark(5) == 5
    assert log.advance_high_watermark(4) == 5  # stale: ignored
    assert log.advance_high_watermark(5) == 5
    assert log.advance_high_watermark(1_000) == 10  # never past end_seq
    assert heard == [5, 10]
    log.set_replicated(3)  # again: only an advance, which this is not
    assert log.high_watermark_seq == 10
    assert log.read(0, 100, 1 << 20).count == 10

    append_range(log, 10, 15)
    assert log.wait_for_high_watermark(12, timeout_s=0.01) == 10
    answers: list[int] = []
    waiter = threading.Thread(target=lambda: answers.append(log.wait_for_high_watermark(12, 5)))
    waiter.start()
    time.sleep(0.02)
    assert answers == []
    log.advance_high_watermark(11)
    log.advance_high_watermark(13)
    waiter.join(5)
    assert answers == [13] and heard == [5, 10, 11, 13]


def test_retention_in_replicated_mode_deletes_only_below_the_high_watermark(
    open_log: OpenLog,
) -> None:
    log = open_log()
    append_range(log, 0, 30)
    log.set_replicated(0)
    assert log.apply_retention(now_ms=10**9, ttl_ms=0) == 0
    log.advance_high_watermark(12)
    log.apply_retention(now_ms=10**9, ttl_ms=0)
    assert 0 < log.begin_seq <= 12 and log.end_seq == 30
    log.advance_high_watermark(30)
    log.apply_retention(now_ms=10**9, ttl_ms=0)
    assert log.begin_seq == log.end_seq == log.high_watermark_seq == 30
