"""ShardLog for replication: a high watermark set from outside, and a follower's truncation."""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path

import crc32c
import pytest
from conftest import OpenLog
from storage_helpers import SMALL, FakeClock, payload

from loghub.errors import LogSealedError, SequenceOutOfRangeError, StorageError
from loghub.storage import ShardLog, StorageConfig
from loghub.storage import shard_log as shard_log_module
from loghub.storage.leader_epochs import (
    LEADER_EPOCHS_FILE_NAME,
    EpochEntry,
    decode_leader_epochs,
)
from loghub.storage.segment import (
    HEADER,
    HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    segment_base_sequences,
)

ONE_SEGMENT = StorageConfig(segment_bytes_max=1 << 20, index_interval_bytes=64)
PAYLOAD_BYTES = 20
RECORD_BYTES = HEADER_BYTES + PAYLOAD_BYTES


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


def epoch_file(path: Path) -> list[EpochEntry] | None:
    return decode_leader_epochs((path / LEADER_EPOCHS_FILE_NAME).read_bytes())


def assert_reopens_the_same(
    log: ShardLog, open_log: OpenLog, path: Path, config: StorageConfig = SMALL
) -> ShardLog:
    """Closes ``log``, opens its directory again and checks records and epochs match."""
    before = records(log), log.leader_epochs(), log.end_seq, log.begin_seq
    log.close()
    reopened = open_log(config, path=path)
    assert (records(reopened), reopened.leader_epochs()) == before[:2]
    assert (reopened.end_seq, reopened.begin_seq) == before[2:]
    assert epoch_file(path) == before[1]  # nothing past the end left in the file
    return reopened


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
    assert log.truncate_to(7) == 7
    assert log.high_watermark_seq == log.end_seq == 7
    append_range(log, 7, 9)
    assert log.high_watermark_seq == 9 and heard[-2:] == [8, 9]


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


# --- truncation -----------------------------------------------------------------------------


def test_truncate_in_the_middle_of_a_segment(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    append_range(log, 0, 30)
    bases = segment_base_sequences(tmp_path / "shard")
    assert len(bases) >= 4
    seq = bases[1] + 2
    assert seq < bases[2]
    kept = records(log)[:seq]

    assert log.truncate_to(seq) == seq
    assert log.end_seq == log.high_watermark_seq == seq
    assert records(log) == kept
    assert segment_base_sequences(tmp_path / "shard") == bases[:2]
    assert log.receive_time_ms(seq) == 1_000 + seq - 1
    with pytest.raises(SequenceOutOfRangeError):
        log.read(seq + 1, 10, 1 << 20)
    assert log.append(b"new", 500) == seq  # times stay non-decreasing from the record left
    assert log.receive_time_ms(seq) == 1_000 + seq - 1
    assert_reopens_the_same(log, open_log, tmp_path / "shard")


def test_truncate_exactly_at_a_segment_boundary(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    append_range(log, 0, 30)
    bases = segment_base_sequences(tmp_path / "shard")
    seq = bases[2]
    kept = records(log)[:seq]

    assert log.truncate_to(seq) == seq
    assert records(log) == kept
    assert log.statistics().segment_count == 3  # the segment at seq is left empty
    assert segment_base_sequences(tmp_path / "shard") == bases[:3]
    log = assert_reopens_the_same(log, open_log, tmp_path / "shard")
    append_range(log, seq, seq + 3)
    assert [r[0] for r in records(log)] == list(range(seq + 3))


def test_truncate_across_several_segments_deletes_their_files(
    open_log: OpenLog, tmp_path: Path
) -> None:
    shard = tmp_path / "shard"
    log = open_log()
    append_range(log, 0, 60)
    bases = segment_base_sequences(shard)
    assert len(bases) >= 8
    seq = bases[1] + 1
    assert log.truncate_to(seq) == seq
    assert segment_base_sequences(shard) == bases[:2]
    for base in bases[2:]:
        for suffix in (".log", ".index", ".timeindex"):
            assert not (shard / f"{base:020d}{suffix}").exists()
    assert log.statistics().segment_count == 2
    assert [r[0] for r in records(log)] == list(range(seq))
    assert log.truncate_to(0) == 0  # everything
    assert log.end_seq == log.begin_seq == 0 and records(log) == []
    assert_reopens_the_same(log, open_log, shard)


def test_a_follower_truncates_its_diverged_tail_and_copies_the_leaders(
    open_log: OpenLog, tmp_path: Path
) -> None:
    """Records 0..9 are common (epoch 1); the follower then appended 10..19 in epoch 2 (later
    times), which never became committed; the new leader has 10..24 in epoch 3."""
    leader = open_log(path=tmp_path / "leader")
    follower = open_log(path=tmp_path / "follower")
    for log in (leader, follower):
        log.set_leader_epoch(1)
        append_range(log, 0, 10)
    follower.set_leader_epoch(2)
    for index in range(10, 20):
        follower.append(b"diverged %d" % index, 5_000)
    leader.set_leader_epoch(3)
    for index in range(10, 25):
        leader.append(payload(index), 2_000)
    follower.set_replicated(10)
    assert follower.leader_epochs() == [(1, 0), (2, 10)]

    assert follower.truncate_to(10) == 10
    assert follower.leader_epochs() == [(1, 0)]
    assert epoch_file(tmp_path / "follower") == [(1, 0)]
    assert follower.high_watermark_seq == 10
    assert follower.append_raw(leader.read_raw(10, 1 << 20)) == 25
    assert records(follower) == records(leader)
    assert follower.leader_epochs() == leader.leader_epochs() == [(1, 0), (3, 10)]
    assert follower.high_watermark_seq == 10
    follower.advance_high_watermark(25)
    assert follower.read(0, 100, 1 << 20) == leader.read(0, 100, 1 << 20)
    follower = assert_reopens_the_same(follower, open_log, tmp_path / "follower")
    assert follower.leader_epochs() == [(1, 0), (3, 10)]
    assert not follower.is_replicated  # the mode is not stored: set again after each open


def test_truncate_in_replicated_mode_clamps_the_high_watermark(open_log: OpenLog) -> None:
    log = open_log()
    append_range(log, 0, 20)
    log.set_replicated(8)
    assert log.truncate_to(12) == 12 and log.high_watermark_seq == 8
    assert log.truncate_to(5) == 5 and log.high_watermark_seq == 5
    append_range(log, 5, 9)
    assert log.high_watermark_seq == 5 and log.advance_high_watermark(9) == 9


def test_truncate_is_refused_on_a_sealed_log_and_outside_the_log(
    open_log: OpenLog, tmp_path: Path
) -> None:
    log = open_log()
    append_range(log, 0, 30)
    log.apply_retention(now_ms=1_012, ttl_ms=0)
    begin_seq = log.begin_seq
    assert begin_seq > 0
    for seq in (begin_seq - 1, 31, 10**6):
        with pytest.raises(SequenceOutOfRangeError):
            log.truncate_to(seq)
    assert log.truncate_to(30) == 30  # the end: nothing to cut
    assert log.end_seq == 30
    log.seal()
    with pytest.raises(LogSealedError):
        log.truncate_to(20)
    assert log.end_seq == 30 and len(records(log)) == 30 - begin_seq
    log.unseal()
    assert log.truncate_to(begin_seq) == begin_seq
    assert_reopens_the_same(log, open_log, tmp_path / "shard")


def test_a_crash_before_the_epoch_file_is_written_recovers_a_consistent_log(
    open_log: OpenLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Data cut, epoch file not yet written (the I/O fails there): the log refuses writes,
    serves what is left, and reopening drops the epochs past the end from the file."""
    shard = tmp_path / "shard"
    log = open_log()
    log.set_leader_epoch(1)
    append_range(log, 0, 10)
    log.set_leader_epoch(4)
    append_range(log, 10, 20)
    assert epoch_file(shard) == [(1, 0), (4, 10)]

    def fail(directory: Path, entries: list[EpochEntry]) -> None:
        raise OSError(5, "simulated crash")

    monkeypatch.setattr(shard_log_module, "write_leader_epochs", fail)
    with pytest.raises(StorageError, match="truncation failed"):
        log.truncate_to(8)
    monkeypatch.undo()
    assert epoch_file(shard) == [(1, 0), (4, 10)]
    assert log.end_seq == 8 and log.leader_epochs() == [(1, 0)]
    assert [r[0] for r in records(log)] == list(range(8))
    with pytest.raises(StorageError, match="refuses writes"):
        log.append(b"x", 2_000)
    log.close()

    reopened = open_log()
    assert reopened.end_seq == 8 and reopened.leader_epochs() == [(1, 0)]
    assert epoch_file(shard) == [(1, 0)]
    append_range(reopened, 8, 15)  # still epoch 1: must not be taken for epoch 4's
    reopened.close()
    assert open_log().leader_epochs() == [(1, 0)]


def test_truncate_waits_for_reads_of_the_segments_it_cuts(open_log: OpenLog) -> None:
    log = open_log()
    append_range(log, 0, 30)
    last = log._segments[-1]
    with log._lock:
        log._pin(last)  # a read under way in the last segment
    done: list[int] = []
    cutter = threading.Thread(target=lambda: done.append(log.truncate_to(3)))
    cutter.start()
    time.sleep(0.05)
    assert done == [] and log.end_seq == 30
    with log._lock:
        log._unpin(last)
    cutter.join(5)
    assert done == [3] and log.end_seq == 3


def test_truncate_inside_a_damaged_range_cuts_where_the_damage_begins(
    open_log: OpenLog, tmp_path: Path
) -> None:
    shard = tmp_path / "shard"
    log = open_log(ONE_SEGMENT)
    append_range(log, 0, 10)
    log.close()
    with open(shard / f"{0:020d}.log", "r+b") as file:
        for sequence in (4, 5):  # a payload byte of each: two records fail their CRC
            file.seek(SEGMENT_HEADER_BYTES + sequence * RECORD_BYTES + HEADER_BYTES + 3)
            file.write(b"\xff")
    log = open_log(ONE_SEGMENT)
    assert log.lost_ranges() == [(4, 6)]
    assert log.truncate_to(5) == 4
    assert log.lost_ranges() == [] and log.statistics().lost_record_count == 0
    assert [r[0] for r in records(log)] == list(range(4))
    append_range(log, 4, 12)
    assert_reopens_the_same(log, open_log, shard, ONE_SEGMENT)


def test_truncating_a_first_format_segment_starts_a_current_format_one(tmp_path: Path) -> None:
    shard = tmp_path / "shard"
    shard.mkdir()
    data = b""
    for sequence in range(5):
        body = b"group %d" % sequence
        covered = struct.pack(">BBIQQI", 1, 0, 0, sequence, 1_000 + sequence, len(body))
        data += covered + struct.pack(">I", crc32c.crc32c(body, crc32c.crc32c(covered))) + body
    (shard / f"{0:020d}.log").write_bytes(data)
    log = ShardLog.open(shard, ONE_SEGMENT, FakeClock())
    try:
        assert segment_base_sequences(shard) == [0, 5]
        assert log.truncate_to(2) == 2
        assert segment_base_sequences(shard) == [0, 2]
        assert (shard / f"{0:020d}.log").read_bytes() == data[: len(data) * 2 // 5]
        assert log.append(b"group 2'", 2_000) == 2
    finally:
        log.close()
    reopened = ShardLog.open(shard, ONE_SEGMENT, FakeClock())
    try:
        expected = b"group 0group 1group 2'"
        assert reopened.read(0, 10, 1 << 20).data == expected
    finally:
        reopened.close()
