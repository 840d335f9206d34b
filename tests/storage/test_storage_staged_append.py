"""ShardLog.stage_append / complete_append: a batched append in two halves (written, then
synced and published), as the server's commit queue uses it across shards."""

from __future__ import annotations

import os
import threading

import pytest
from conftest import OpenLog
from storage_helpers import payload

from loghub.errors import DiskFullError, LogSealedError, RecordTooLargeError, StorageError


def test_staged_records_are_readable_only_once_completed(open_log: OpenLog) -> None:
    log = open_log()
    log.append(payload(0), 1000)
    staged = log.stage_append([(payload(1), 1000), (payload(2), 1000)])
    assert staged.first_seq == 1
    assert log.end_seq == 1  # written, not published
    assert log.read(0, 10, 1 << 20).count == 1
    assert log.complete_append(staged) == 1
    assert log.end_seq == 3
    assert log.read(0, 10, 1 << 20).data == payload(0) + payload(1) + payload(2)
    assert log.statistics().fsync_count == 2  # one per batch, "always"
    log.close()
    assert open_log().read(0, 10, 1 << 20).count == 3


def test_a_staged_batch_holds_the_writer_role_until_completed(open_log: OpenLog) -> None:
    log = open_log()
    staged = log.stage_append([(payload(0), 1000)])
    appended: list[int] = []
    other = threading.Thread(target=lambda: appended.append(log.append(payload(1), 1000)))
    other.start()
    other.join(timeout=0.2)
    assert other.is_alive() and not appended  # one writer per shard
    log.complete_append(staged)
    other.join(timeout=10)
    assert appended == [1]


def test_a_failed_sync_takes_the_batch_back_and_frees_the_writer_role(
    open_log: OpenLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log()
    log.append(payload(0), 1000)
    size_before = log.statistics().size_bytes
    staged = log.stage_append([(payload(1), 1000)])

    real_fdatasync, failures = os.fdatasync, [OSError(28, "No space left on device")]

    def disk_full(fd: int) -> None:  # the first sync fails; the roll back's own syncs work
        if failures:
            raise failures.pop()
        real_fdatasync(fd)

    with monkeypatch.context() as patch:
        patch.setattr(os, "fdatasync", disk_full)
        with pytest.raises(DiskFullError):
            log.complete_append(staged)
    assert log.end_seq == 1
    assert log.statistics().size_bytes == size_before
    assert log.append(b"next", 1000) == 1  # the role is free and the sequence not used


def test_a_failed_write_raises_from_stage_and_leaves_nothing(
    open_log: OpenLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log()

    def broken(fd: int, data: object) -> int:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(os, "writev", broken)
        with pytest.raises(StorageError):
            log.stage_append([(payload(0), 1000)])
    assert log.append(payload(0), 1000) == 0


def test_abort_takes_a_staged_batch_back(open_log: OpenLog) -> None:
    log = open_log()
    log.abort_append(log.stage_append([(payload(0), 1000)]))
    assert log.end_seq == 0
    assert log.append(payload(1), 1000) == 0
    assert log.read(0, 10, 1 << 20).data == payload(1)


def test_stage_refuses_a_sealed_log_and_checks_sizes_up_front(open_log: OpenLog) -> None:
    log = open_log()
    with pytest.raises(RecordTooLargeError):
        log.check_payload_size(4097)  # SMALL's payload_bytes_max is 4096
    log.check_payload_size(4096)
    log.seal()
    with pytest.raises(LogSealedError):
        log.stage_append([(payload(0), 1000)])
    log.unseal()
    assert log.complete_append(log.stage_append([(payload(0), 1000)])) == 0
