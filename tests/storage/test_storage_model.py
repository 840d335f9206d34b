"""A property test: random appends, reopens, reads and retention agree with a list in memory."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import FakeClock

from loghub.errors import SequenceOutOfRangeError
from loghub.storage import ShardLog, StorageConfig

CONFIG = StorageConfig(segment_bytes_max=300, index_interval_bytes=50, payload_bytes_max=500)
_directories = itertools.count()

operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 200), st.integers(0, 50)),
        st.tuples(st.just("reopen"), st.just(0), st.just(0)),
        st.tuples(st.just("read"), st.integers(0, 1000), st.integers(0, 1000)),
        st.tuples(st.just("retention"), st.integers(0, 300), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=operations, data=st.data())
def test_shard_log_agrees_with_an_in_memory_model(
    operations: list[tuple[str, int, int]], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "shard"
        clock = FakeClock()
        log = ShardLog.open(path, CONFIG, clock)
        records: list[tuple[bytes, int]] = []  # (payload, stored time) by sequence
        begin = 0
        previous_time: int | None = None
        try:
            for operation, first, second in operations:
                if operation == "append":
                    item = data.draw(st.binary(min_size=first, max_size=first))
                    given_time = 1000 + second * 10
                    time_ms = (
                        given_time if previous_time is None else max(previous_time, given_time)
                    )
                    assert log.append(item, given_time) == len(records)
                    records.append((item, time_ms))
                    previous_time = time_ms
                elif operation == "reopen":
                    log.close()
                    log = ShardLog.open(path, CONFIG, clock)
                    if begin == len(records):
                        previous_time = None  # an emptied shard keeps no time to compare with
                elif operation == "read":
                    check_read(log, records, begin, first, second, data)
                else:
                    now_ms = 1000 + first * 10
                    log.apply_retention(now_ms, ttl_ms=100)
                    # Only expired records may go, and the shard goes empty when all are.
                    deleted = records[begin : log.begin_seq]
                    assert all(time_ms < now_ms - 100 for _item, time_ms in deleted)
                    if records and records[-1][1] < now_ms - 100:
                        assert log.begin_seq == len(records)
                    begin = log.begin_seq
                assert (log.begin_seq, log.end_seq) == (begin, len(records))
            check_read(log, records, begin, 0, 10_000, data)
        finally:
            log.close()


def check_read(
    log: ShardLog,
    records: list[tuple[bytes, int]],
    begin: int,
    count_max: int,
    bytes_max: int,
    data: st.DataObject,
) -> None:
    start = data.draw(st.integers(begin - 1, len(records) + 1))
    if not begin <= start <= len(records):
        try:
            log.read(start, count_max, bytes_max)
        except SequenceOutOfRangeError:
            return
        raise AssertionError(f"read at {start} outside [{begin}, {len(records)}] succeeded")
    end_seq = data.draw(st.one_of(st.none(), st.integers(start, len(records) + 2)))
    batch = log.read(start, count_max, bytes_max, end_seq)
    stop = len(records) if end_seq is None else min(end_seq, len(records))
    expected: list[bytes] = []
    taken = 0
    for item, _time in records[start:stop]:
        if len(expected) == count_max or (expected and taken + len(item) > bytes_max):
            break
        expected.append(item)
        taken += len(item)
    assert (batch.data, batch.count) == (b"".join(expected), len(expected))
    assert batch.next_seq == start + len(expected)
    if start < len(records):
        assert log.receive_time_ms(start) == records[start][1]
        time_ms = records[start][1]
        first = next(seq for seq in range(begin, len(records)) if records[seq][1] >= time_ms)
        assert log.seq_for_time(time_ms) == first
