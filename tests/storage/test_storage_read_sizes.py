"""Reads of every shape agree with a list in memory: record sizes from empty to past the
first chunk a read takes (256 KiB), byte limits inside, at and far below a record, raw and
payload reads, starts between offset index entries, the compiled walk and its fallback."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples
from storage_helpers import FakeClock

import loghub.storage._gather
import loghub.storage.segment
from loghub.storage import ShardLog, StorageConfig
from loghub.storage._gather import gather_python
from loghub.storage.segment import HEADER_BYTES

_SIZES = [0, 1, 30, 200, 4_000, 30_810, 70_000, 300_000]


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ShardLog, list[bytes]]]:
    rng = random.Random(7)
    config = StorageConfig(
        fsync_policy="interval", segment_bytes_max=1 << 20, index_interval_bytes=4096
    )
    log = ShardLog.open(tmp_path_factory.mktemp("sizes") / "shard", config, FakeClock())
    payloads = [rng.randbytes(rng.choice(_SIZES)) for _ in range(60)]
    for payload in payloads:
        log.append(payload, 1_000)
    yield log, payloads
    log.close()


def expected(payloads: list[bytes], start: int, count_max: int, bytes_max: int, raw: bool) -> int:
    """How many records a read takes: at least one, then while the limits allow."""
    taken = count = 0
    for payload in payloads[start:]:
        cost = len(payload) + (HEADER_BYTES if raw else 0)
        if count == count_max or (count and taken + cost > bytes_max):
            break
        taken += cost
        count += 1
    return count


@pytest.mark.timeout(120)
@settings(max_examples=examples(150), deadline=None)
@given(
    start=st.integers(0, 59),
    count_max=st.integers(1, 70),
    bytes_max=st.one_of(st.integers(0, 5_000), st.integers(0, 2_000_000)),
    python=st.booleans(),
)
def test_a_read_of_any_shape_returns_the_records_a_model_says(
    stored: tuple[ShardLog, list[bytes]], start: int, count_max: int, bytes_max: int, python: bool
) -> None:
    log, payloads = stored
    walk = gather_python if python else loghub.storage.segment.gather
    original = loghub.storage.segment.gather
    loghub.storage.segment.gather = walk  # type: ignore[assignment]
    try:
        count = expected(payloads, start, count_max, bytes_max, raw=False)
        batch = log.read(start, count_max, bytes_max)
        assert (batch.count, batch.data) == (count, b"".join(payloads[start : start + count]))
        buffer = bytearray(random.Random(start).randbytes(start * 100))  # stale bytes
        read = log.read_into(buffer, start, count_max, bytes_max)
        assert bytes(buffer[: read.size_bytes]) == batch.data
        raw = log.read_raw(start, bytes_max)
        raw_count = expected(payloads, start, 2**62, bytes_max, raw=True)
        position, found = 0, []
        while position < len(raw):
            length = int.from_bytes(raw[position + 22 : position + 26], "big")
            found.append(raw[position + HEADER_BYTES : position + HEADER_BYTES + length])
            position += HEADER_BYTES + length
        assert found == payloads[start : start + raw_count]
    finally:
        loghub.storage.segment.gather = original  # type: ignore[assignment]


def test_a_small_read_into_a_large_kept_buffer_reads_no_more_of_the_file(
    stored: tuple[ShardLog, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server keeps its read buffers between pulls, so one grown by a 16 MiB pull serves
    the small ones after it. The walk must read what the read needs, not fill the buffer:
    that cost every small pull a copy of megabytes from the page cache."""
    log, _payloads = stored
    read: list[int] = []
    pread = os.pread

    def counting_pread(fd: int, size: int, position: int) -> bytes:
        data = pread(fd, size, position)
        read.append(len(data))
        return data

    monkeypatch.setattr(loghub.storage.segment, "gather", gather_python)
    monkeypatch.setattr(loghub.storage._gather.os, "pread", counting_pread)
    for start in (0, 17, 40):
        read.clear()
        fresh = log.read_into(bytearray(), start, 3, 1_000)
        read_fresh = sum(read)
        read.clear()
        large = bytearray(16 << 20)
        kept = log.read_into(large, start, 3, 1_000)
        assert (kept.count, kept.size_bytes) == (fresh.count, fresh.size_bytes)
        assert sum(read) == read_fresh < 1 << 20
