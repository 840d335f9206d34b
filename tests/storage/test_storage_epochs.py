"""Leader epochs in record headers and in the leader-epoch file; the high watermark."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import FakeClock, payload

from loghub.errors import StorageError
from loghub.storage import ShardLog, StorageConfig
from loghub.storage import shard_log as shard_log_module
from loghub.storage.leader_epochs import (
    LEADER_EPOCHS_FILE_NAME,
    EpochEntry,
    decode_leader_epochs,
    encode_leader_epochs,
    fit_to_log,
    merge_epoch_starts,
    write_leader_epochs,
)
from loghub.storage.segment import HEADER, HEADER_BYTES, encode_header

CONFIG = StorageConfig(segment_bytes_max=600, index_interval_bytes=64, payload_bytes_max=4096)


def record_epochs(raw: bytes) -> list[tuple[int, int]]:
    """(sequence, leader epoch) of every framed record in ``raw``."""
    found, position = [], 0
    while position < len(raw):
        fields = HEADER.unpack_from(raw, position)
        found.append((fields[3], fields[2]))
        position += HEADER_BYTES + fields[5]
    return found


def open_log(path: Path) -> ShardLog:
    return ShardLog.open(path, CONFIG, FakeClock())


def test_appends_are_stamped_with_the_current_epoch_and_the_file_records_each_change(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "shard")
    try:
        assert log.leader_epoch == 0 and log.leader_epochs() == []
        for index in range(5):
            log.append(payload(index), 1_000)
        log.set_leader_epoch(3)
        for index in range(5, 12):
            log.append(payload(index), 1_000)
        staged = log.stage_append([(payload(12), 1_000), (payload(13), 1_000)])
        log.complete_append(staged)
        log.set_leader_epoch(4)
        assert log.leader_epochs() == [(0, 0), (3, 5)]  # epoch 4 has appended nothing yet
        raw = log.read_raw(0, 1 << 20)
    finally:
        log.close()
    assert record_epochs(raw) == [(s, 0) for s in range(5)] + [(s, 3) for s in range(5, 14)]
    file_bytes = (tmp_path / "shard" / LEADER_EPOCHS_FILE_NAME).read_bytes()
    assert decode_leader_epochs(file_bytes) == [(0, 0), (3, 5)]

    reopened = open_log(tmp_path / "shard")
    try:
        assert reopened.leader_epochs() == [(0, 0), (3, 5)]
        assert reopened.leader_epoch == 3
        assert reopened.read(0, 100, 1 << 20).data == b"".join(payload(i) for i in range(14))
    finally:
        reopened.close()


def test_the_epoch_file_is_written_once_per_epoch_not_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[list[EpochEntry]] = []

    def counting(directory: Path, entries: list[EpochEntry]) -> None:
        writes.append(entries)
        write_leader_epochs(directory, entries)

    monkeypatch.setattr(shard_log_module, "write_leader_epochs", counting)
    log = open_log(tmp_path / "shard")
    try:
        for index in range(20):
            log.append(payload(index), 1_000)
        log.set_leader_epoch(1)
        for index in range(20):
            log.append(payload(index), 1_000)
    finally:
        log.close()
    assert writes == [[(0, 0)], [(0, 0), (1, 20)]]


@pytest.mark.parametrize("damage", ["junk", "checksum", "cut short", "missing", "empty"])
def test_a_damaged_or_missing_epoch_file_is_rebuilt_from_the_record_headers(
    tmp_path: Path, damage: str
) -> None:
    log = open_log(tmp_path / "shard")
    for epoch, count in ((0, 4), (2, 9), (5, 6)):  # several segments (600-byte ones)
        log.set_leader_epoch(epoch)
        for index in range(count):
            log.append(payload(index, size=40), 1_000)
    log.close()
    epoch_file = tmp_path / "shard" / LEADER_EPOCHS_FILE_NAME
    good = epoch_file.read_bytes()
    assert decode_leader_epochs(good) == [(0, 0), (2, 4), (5, 13)]
    if damage == "junk":
        epoch_file.write_bytes(b"\xff\x00 not an epoch file")
    elif damage == "checksum":
        epoch_file.write_bytes(good.replace(b"2 4\n", b"2 5\n"))
    elif damage == "cut short":
        epoch_file.write_bytes(good[: len(good) // 2])
    elif damage == "missing":
        epoch_file.unlink()
    else:
        epoch_file.write_bytes(b"")

    reopened = open_log(tmp_path / "shard")
    try:
        assert reopened.leader_epochs() == [(0, 0), (2, 4), (5, 13)]
        assert reopened.leader_epoch == 5
    finally:
        reopened.close()
    assert epoch_file.read_bytes() == good  # written again


def test_an_entry_whose_records_never_became_durable_is_dropped_on_open(tmp_path: Path) -> None:
    """The file is written before the records of a new epoch: a crash between the two
    leaves an entry at the log's end, which must not claim records it does not have."""
    log = open_log(tmp_path / "shard")
    for index in range(3):
        log.append(payload(index), 1_000)
    log.close()
    write_leader_epochs(tmp_path / "shard", [(0, 0), (4, 3)])

    reopened = open_log(tmp_path / "shard")
    try:
        assert reopened.leader_epochs() == [(0, 0)]
        assert reopened.append(b"again", 1_000) == 3
        assert reopened.leader_epochs() == [(0, 0)]
    finally:
        reopened.close()


def test_retention_folds_the_epochs_before_the_new_beginning(tmp_path: Path) -> None:
    clock = FakeClock()
    log = ShardLog.open(tmp_path / "shard", CONFIG, clock)
    try:
        for epoch in (0, 1, 2):  # 8 records each, 7 to a segment: segments mix epochs
            log.set_leader_epoch(epoch)
            for index in range(8):
                log.append(payload(index, size=50), clock.wall_ms())
            clock.advance(60_000)
        assert log.leader_epochs() == [(0, 0), (1, 8), (2, 16)]
        assert log.apply_retention(clock.wall_ms(), 150_000) == 1  # records 0..6
        assert log.begin_seq == 7
        assert log.leader_epochs() == [(0, 7), (1, 8), (2, 16)]
        log.set_leader_epoch(3)
        log.append(b"later", clock.wall_ms())
    finally:
        log.close()
    epoch_file = (tmp_path / "shard" / LEADER_EPOCHS_FILE_NAME).read_bytes()
    assert decode_leader_epochs(epoch_file) == [(0, 7), (1, 8), (2, 16), (3, 24)]
    reopened = open_log(tmp_path / "shard")
    try:
        assert reopened.leader_epochs() == [(0, 7), (1, 8), (2, 16), (3, 24)]
    finally:
        reopened.close()


def test_raw_appends_keep_the_leaders_epochs_and_refuse_one_going_back(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    try:
        for epoch in (0, 2, 7):
            leader.set_leader_epoch(epoch)
            for index in range(3):
                leader.append(payload(index), 1_000)
        raw = leader.read_raw(0, 1 << 20)
        assert follower.append_raw(raw) == 9
        assert follower.leader_epochs() == [(0, 0), (2, 3), (7, 6)]
        assert follower.read_raw(0, 1 << 20) == raw

        stale = encode_header(9, 1_000, b"x", leader_epoch=5) + b"x"
        with pytest.raises(StorageError, match="epoch 5"):
            follower.append_raw(stale)
        assert follower.end_seq == 9
    finally:
        leader.close()
        follower.close()


def test_reads_stop_at_the_high_watermark_and_raw_reads_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path / "shard")
    try:
        for index in range(6):
            log.append(payload(index), 1_000)
        assert log.high_watermark_seq == log.end_seq == 6  # one server: all is committed
        monkeypatch.setattr(ShardLog, "_high_watermark_seq", lambda self: 4)
        assert log.high_watermark_seq == 4
        assert log.read(0, 100, 1 << 20).count == 4
        assert log.read(2, 100, 1 << 20, end_seq=10).next_seq == 4
        assert log.read(5, 100, 1 << 20).count == 0
        assert len(record_epochs(log.read_raw(0, 1 << 20))) == 6
    finally:
        log.close()


_ENTRIES = st.lists(
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)), max_size=20
).map(lambda pairs: merge_epoch_starts([], sorted(pairs)))


@settings(derandomize=True, max_examples=200, deadline=None)
@given(entries=_ENTRIES, begin=st.integers(0, 2**64 - 1), length=st.integers(0, 2**20))
def test_the_epoch_file_codec_round_trips_and_fitting_keeps_it_well_formed(
    entries: list[EpochEntry], begin: int, length: int
) -> None:
    assert decode_leader_epochs(encode_leader_epochs(entries)) == entries
    end = min(begin + length, 2**64 - 1)
    fitted = fit_to_log(entries, begin, end)
    assert decode_leader_epochs(encode_leader_epochs(fitted)) == fitted
    assert all(begin <= start < end for _epoch, start in fitted)
    for epoch, start in fitted:  # each record of [begin, end) keeps the epoch it had
        before = [e for e, s in entries if s <= start]
        assert before and before[-1] == epoch
