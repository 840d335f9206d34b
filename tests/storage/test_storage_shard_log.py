"""ShardLog: appends, reads, limits, reopen, group commit, times, retention, raw records."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from conftest import OpenLog
from storage_helpers import SMALL, FakeClock, payload

import loghub.storage
from loghub.errors import (
    CorruptSegmentError,
    DiskFullError,
    LogSealedError,
    RecordTooLargeError,
    SequenceOutOfRangeError,
    StorageClosedError,
    StorageError,
)
from loghub.storage import ShardLog, StorageConfig
from loghub.storage._gather import gather_python
from loghub.storage.segment import HEADER_BYTES, segment_base_sequences


def append_many(log: ShardLog, count: int, time_ms: int = 1000) -> list[bytes]:
    payloads = [payload(index) for index in range(log.end_seq, log.end_seq + count)]
    for item in payloads:
        log.append(item, time_ms)
    return payloads


def test_storage_all_is_sorted_and_names_what_the_package_exports() -> None:
    assert loghub.storage.__all__ == sorted(loghub.storage.__all__)
    for name in loghub.storage.__all__:
        assert getattr(loghub.storage, name) is not None


def test_appended_records_read_back_byte_for_byte_across_segments(open_log: OpenLog) -> None:
    log = open_log()
    payloads = [payload(index) for index in range(60)]
    sequences = [log.append(item, 1000 + index) for index, item in enumerate(payloads)]

    assert sequences == list(range(60))
    assert log.statistics().segment_count > 5
    batch = log.read(0, 1000, 1 << 20)
    assert (batch.data, batch.count, batch.next_seq) == (b"".join(payloads), 60, 60)
    for start in range(60):
        batch = log.read(start, 7, 1 << 20)
        assert batch.data == b"".join(payloads[start : start + 7])
        assert batch.next_seq == min(start + 7, 60)


def test_read_stops_at_count_max_bytes_max_and_end_seq(open_log: OpenLog) -> None:
    log = open_log()
    payloads = [payload(index, size=20) for index in range(30)]
    for item in payloads:
        log.append(item, 1000)

    assert log.read(3, 4, 1 << 20).data == b"".join(payloads[3:7])
    by_bytes = log.read(3, 100, 50)
    assert (by_bytes.count, by_bytes.data) == (2, b"".join(payloads[3:5]))
    assert log.read(3, 100, 1).count == 1  # always at least one record
    up_to = log.read(3, 100, 1 << 20, end_seq=11)
    assert (up_to.count, up_to.next_seq, up_to.data) == (8, 11, b"".join(payloads[3:11]))
    assert log.read(3, 100, 1 << 20, end_seq=2).count == 0
    assert log.read(3, 100, 1 << 20, end_seq=1000).next_seq == 30
    assert log.read(3, 0, 1 << 20).count == 0


def test_read_at_end_is_empty_and_outside_range_is_invalid_cursor(open_log: OpenLog) -> None:
    log = open_log()
    append_many(log, 5)

    at_end = log.read(5, 10, 1000)
    assert (at_end.data, at_end.count, at_end.next_seq) == (b"", 0, 5)
    with pytest.raises(SequenceOutOfRangeError):
        log.read(6, 10, 1000)
    with pytest.raises(SequenceOutOfRangeError):
        log.read(-1, 10, 1000)
    with pytest.raises(SequenceOutOfRangeError):
        log.receive_time_ms(6)


def test_empty_shard_reads_nothing(open_log: OpenLog) -> None:
    log = open_log()
    assert (log.begin_seq, log.end_seq) == (0, 0)
    assert log.read(0, 10, 1000) == loghub.storage.ReadBatch(b"", 0, 0)


def test_empty_payload_is_a_record(open_log: OpenLog) -> None:
    log = open_log()
    assert log.append(b"", 1) == 0
    assert log.append(b"a", 1) == 1
    assert log.read(0, 10, 1000).count == 2
    assert log.read(0, 10, 1000).data == b"a"


def test_record_larger_than_a_segment_gets_a_segment_of_its_own(open_log: OpenLog) -> None:
    log = open_log()
    big = payload(1, size=1000)
    log.append(b"small", 1)
    log.append(big, 1)
    log.append(b"after", 1)

    assert log.read(0, 10, 1 << 20).data == b"small" + big + b"after"
    assert segment_base_sequences(log.path) == [0, 1, 2]


def test_payload_over_the_limit_is_refused(open_log: OpenLog) -> None:
    log = open_log()
    with pytest.raises(RecordTooLargeError):
        log.append(b"x" * (SMALL.payload_bytes_max + 1), 1)
    assert log.end_seq == 0


def test_reopen_keeps_every_record_and_sequences_continue(open_log: OpenLog) -> None:
    log = open_log()
    payloads = append_many(log, 40)
    log.close()

    reopened = open_log()
    assert reopened.end_seq == 40
    assert reopened.read(0, 100, 1 << 20).data == b"".join(payloads)
    assert reopened.append(b"next", 2000) == 40
    assert reopened.receive_time_ms(40) == 2000


def test_closed_log_refuses_appends_and_reads(open_log: OpenLog) -> None:
    log = open_log()
    log.append(b"a", 1)
    log.close()
    log.close()
    with pytest.raises(StorageClosedError):
        log.append(b"b", 1)
    with pytest.raises(StorageClosedError):
        log.read(0, 1, 1)


def test_concurrent_appends_get_distinct_contiguous_sequences_with_fewer_fsyncs(
    open_log: OpenLog,
) -> None:
    log = open_log(StorageConfig())
    threads_count, appends_per_thread = 16, 40
    results: dict[int, bytes] = {}
    start = threading.Barrier(threads_count)

    def worker(worker_id: int) -> None:
        start.wait()
        for index in range(appends_per_thread):
            item = f"w{worker_id}-{index}".encode()
            results[log.append(item, 1000)] = item

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    total = threads_count * appends_per_thread
    assert sorted(results) == list(range(total))
    statistics = log.statistics()
    assert statistics.append_count == total
    assert 0 < statistics.fsync_count < total
    assert log.read(0, total, 1 << 20).data == b"".join(results[seq] for seq in range(total))


def test_reads_run_beside_appends_and_see_only_whole_records(open_log: OpenLog) -> None:
    log = open_log()
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                end = log.end_seq
                batch = log.read(log.begin_seq, 1000, 1 << 20)
                assert batch.next_seq >= end
                expected = b"".join(payload(index) for index in range(batch.next_seq))
                assert batch.data == expected
            except BaseException as exc:  # reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    append_many(log, 150)
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []


def test_interval_policy_acknowledges_after_write_and_syncs_in_background(
    open_log: OpenLog,
) -> None:
    log = open_log(StorageConfig(fsync_policy="interval", fsync_interval_ms=5))
    assert log.append(b"a", 1) == 0
    assert log.read(0, 10, 100).data == b"a"
    wakeup = threading.Event()
    for _ in range(1000):  # up to ~10 s; normally a few ms
        if log.statistics().fsync_count > 0:
            break
        wakeup.wait(0.01)
    assert log.statistics().fsync_count > 0


def test_receive_times_are_stored_non_decreasing(open_log: OpenLog) -> None:
    log = open_log()
    for time_ms in [100, 300, 200, 300, 50, 400]:
        log.append(b"x", time_ms)

    assert [log.receive_time_ms(seq) for seq in range(6)] == [100, 300, 300, 300, 300, 400]


def test_seq_for_time_finds_the_first_record_at_or_after_a_time(open_log: OpenLog) -> None:
    log = open_log()
    times = [100, 100, 200, 200, 200, 350, 350, 400] * 1
    for index, time_ms in enumerate(times):
        log.append(payload(index, size=40), time_ms)

    assert log.statistics().segment_count > 1
    assert log.seq_for_time(0) == 0
    assert log.seq_for_time(100) == 0
    assert log.seq_for_time(101) == 2
    assert log.seq_for_time(200) == 2
    assert log.seq_for_time(300) == 5
    assert log.seq_for_time(400) == 7
    assert log.seq_for_time(401) == 8


def test_receive_time_of_end_is_the_newest_record_or_the_clock_when_empty(
    open_log: OpenLog, clock: FakeClock
) -> None:
    log = open_log()
    assert log.receive_time_ms(0) == clock.wall_ms()
    assert log.seq_for_time(0) == 0
    log.append(b"x", 500)
    log.append(b"y", 700)
    assert log.receive_time_ms(2) == 700
    assert log.receive_time_ms(0) == 500


def test_retention_deletes_whole_old_segments_from_the_front(open_log: OpenLog) -> None:
    log = open_log()
    old = [payload(index, size=40) for index in range(12)]
    for item in old:
        log.append(item, 1000)
    log.append(payload(12, size=40), 5000)
    segments_before = log.statistics().segment_count

    deleted = log.apply_retention(now_ms=5000, ttl_ms=1000)

    assert deleted == segments_before - 1
    assert log.begin_seq == 12
    assert log.read(12, 10, 1000).data == payload(12, size=40)
    with pytest.raises(SequenceOutOfRangeError):
        log.read(11, 10, 1000)
    assert log.append(b"later", 5000) == 13
    assert log.apply_retention(now_ms=5000, ttl_ms=1000) == 0


def test_fully_expired_shard_is_empty_keeps_its_sequences_and_takes_appends(
    open_log: OpenLog, clock: FakeClock
) -> None:
    log = open_log()
    append_many(log, 20, time_ms=1000)

    assert log.apply_retention(now_ms=10_000, ttl_ms=1000) > 0

    assert (log.begin_seq, log.end_seq) == (20, 20)
    assert log.read(20, 10, 1000).count == 0
    assert log.receive_time_ms(20) == clock.wall_ms()
    assert log.seq_for_time(0) == 20
    assert log.append(b"new", 10_000) == 20
    log.close()
    reopened = open_log()
    assert (reopened.begin_seq, reopened.end_seq) == (20, 21)
    assert reopened.read(20, 10, 1000).data == b"new"


def test_retention_keeps_segments_with_a_recent_record(open_log: OpenLog) -> None:
    log = open_log()
    append_many(log, 20, time_ms=1000)
    assert log.apply_retention(now_ms=1500, ttl_ms=1000) == 0
    assert log.begin_seq == 0


def test_read_raw_then_append_raw_copies_a_log_exactly(open_log: OpenLog, tmp_path: Path) -> None:
    leader = open_log()
    payloads = append_many(leader, 30)
    follower = open_log(path=tmp_path / "follower")

    while follower.end_seq < leader.end_seq:
        chunk = leader.read_raw(follower.end_seq, 200)
        assert chunk
        follower.append_raw(chunk)

    assert follower.read(0, 100, 1 << 20).data == b"".join(payloads)
    assert follower.read_raw(0, 1 << 20) == leader.read_raw(0, 1 << 20)


def test_append_raw_refuses_gaps_and_bad_crcs(open_log: OpenLog, tmp_path: Path) -> None:
    leader = open_log()
    append_many(leader, 3)
    follower = open_log(path=tmp_path / "follower")
    with pytest.raises(StorageError):
        follower.append_raw(leader.read_raw(1, 1 << 20))
    damaged = bytearray(leader.read_raw(0, 1 << 20))
    damaged[HEADER_BYTES + 2] ^= 0xFF
    with pytest.raises(CorruptSegmentError):
        follower.append_raw(bytes(damaged))
    assert follower.end_seq == 0


def test_failed_write_raises_and_leaves_no_partial_record(
    open_log: OpenLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log()
    append_many(log, 3)
    size_before = log.statistics().size_bytes

    def disk_full(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "writev", disk_full)
        with pytest.raises(DiskFullError):
            log.append(b"lost", 1000)

    assert log.end_seq == 3
    assert log.statistics().size_bytes == size_before
    assert log.append(b"kept", 1000) == 3
    log.close()
    assert open_log().read(0, 10, 1 << 20).data.endswith(b"kept")


def test_failed_write_across_a_roll_takes_back_the_whole_batch(
    open_log: OpenLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader = open_log(path=tmp_path / "leader")
    append_many(leader, 20)
    raw = leader.read_raw(2, 1 << 20)
    log = open_log()
    append_many(log, 2)
    real_writev = os.writev
    log_writes = {"count": 0}

    def fail_second_log_write(fd: int, buffers: list[memoryview]) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            log_writes["count"] += 1
            if log_writes["count"] == 2:
                raise OSError(28, "No space left on device")
        return real_writev(fd, buffers)

    with monkeypatch.context() as patch:
        patch.setattr(os, "writev", fail_second_log_write)
        # One raw batch larger than a segment: first chunk written, roll, second write fails.
        with pytest.raises(DiskFullError):
            log.append_raw(raw)

    assert log_writes["count"] == 2
    assert log.end_seq == 2
    assert segment_base_sequences(log.path) == [0]
    assert log.append_raw(raw) == 20
    log.close()
    assert open_log().read(0, 100, 1 << 20).data == b"".join(payload(i) for i in range(20))


def test_seal_fixes_the_end_and_refuses_appends_until_unsealed(tmp_path: Path) -> None:
    log = ShardLog.open(tmp_path / "shard", StorageConfig(), FakeClock())
    for i in range(3):
        log.append(b"r%d" % i, 1_000)
    assert log.seal() == 3
    assert log.sealed
    assert log.seal() == 3  # idempotent
    with pytest.raises(LogSealedError):
        log.append(b"late", 1_000)
    assert log.end_seq == 3
    assert log.read(0, 10, 1 << 20).data == b"r0r1r2"
    log.unseal()
    assert log.append(b"r3", 1_000) == 3
    log.close()


def test_seal_waits_for_concurrent_appends_and_every_acknowledged_one_is_before_the_end(
    tmp_path: Path,
) -> None:
    log = ShardLog.open(tmp_path / "shard", StorageConfig(), FakeClock())
    acknowledged: list[int] = []
    refused = 0
    lock = threading.Lock()

    def writer() -> None:
        nonlocal refused
        for _ in range(200):
            try:
                sequence = log.append(b"x" * 100, 1_000)
            except LogSealedError:
                with lock:
                    refused += 1
                return
            with lock:
                acknowledged.append(sequence)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for thread in threads:
        thread.start()
    while log.end_seq < 50:
        time.sleep(0.001)
    end = log.seal()
    for thread in threads:
        thread.join()
    assert sorted(acknowledged) == list(range(end))
    assert log.end_seq == end
    log.close()


def test_a_planned_read_survives_retention_and_descriptor_eviction(open_log: OpenLog) -> None:
    """The read pins the log's descriptor when it plans, so neither retention unlinking the
    file nor the file cache's bound (one idle descriptor here) can pull it away."""
    config = StorageConfig(
        segment_bytes_max=256, index_interval_bytes=64, payload_bytes_max=4096, open_files_max=1
    )
    log = open_log(config)
    payloads = append_many(log, 30, time_ms=1_000)
    with log._lock:
        plans = log._plan_reads(0, 3)
    (segment, plan), *_ = plans
    assert log.apply_retention(now_ms=10_000, ttl_ms=1_000) > 0  # unlinks the planned file
    assert not segment.path.exists()
    for index in range(3):  # other files through the one-descriptor cache
        log.append(payload(100 + index), 20_000)

    out = bytearray()
    count, _, end = segment.read_into(
        segment.read_fd, plan, 3, 1 << 20, out, 0, raw=False, take_first=True
    )

    assert count > 0 and bytes(out[:end]) == b"".join(payloads[:count])
    with log._lock:
        for planned, _plan in plans:
            log._unpin(planned)


@pytest.mark.parametrize("walk", ["compiled", "python"])
def test_reads_into_one_reused_buffer_return_the_bytes_of_fresh_reads(
    open_log: OpenLog, walk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if walk == "python":  # the fallback where no C compiler was found
        monkeypatch.setattr(loghub.storage.segment, "gather", gather_python)
    # small records past the first chunk a read takes (256 KiB), one record larger than the
    # chunk, and reads that start between offset index entries: the walk asks for room and
    # goes on, and the reused buffer's old bytes never leak into a later read
    config = StorageConfig(fsync_policy="interval", index_interval_bytes=4096)
    log = open_log(config)
    sizes = [200] * 2000 + [600_000] + [150] * 1500
    for index, size in enumerate(sizes):
        log.append(payload(index, size), 1_000)
    buffer = bytearray()
    for start, count, bytes_max in ((0, 1000, 16 << 20), (7, 3, 500), (1990, 1000, 16 << 20),
                                    (1995, 1000, 100_000), (2000, 2, 1000), (2001, 1000, 1 << 20),
                                    (3000, 1000, 16 << 20)):  # fmt: skip
        expected = log.read(start, count, bytes_max)
        read = log.read_into(buffer, start, count, bytes_max)
        assert (read.count, read.next_seq) == (expected.count, expected.next_seq)
        assert bytes(buffer[: read.size_bytes]) == expected.data
        assert expected.data == b"".join(
            payload(index, sizes[index]) for index in range(start, expected.next_seq)
        )


@pytest.mark.timeout(20)
@pytest.mark.parametrize("walk", ["compiled", "python"])
def test_a_first_record_far_over_the_byte_limit_ends_the_read_after_it(
    open_log: OpenLog, walk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a raw read's first record fits the first chunk but passes bytes_max by more than the
    # room kept for headers: the walk must still get room for the next header (it asked for
    # none, and waited for it forever)
    if walk == "python":
        monkeypatch.setattr(loghub.storage.segment, "gather", gather_python)
    log = open_log(StorageConfig(fsync_policy="interval"))
    first = payload(0, 30_810)
    log.append(first, 1_000)
    log.append(payload(1, 50), 1_000)

    records = log.read_raw(0, 100)

    assert records[HEADER_BYTES:] == first
