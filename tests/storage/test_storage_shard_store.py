"""ShardStore: one directory per logstore and shard, lazily opened, dropped as a whole."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_helpers import SMALL, FakeClock, payload

from loghub.errors import StorageClosedError
from loghub.storage import ShardStore, StorageConfig
from loghub.storage._files import FileCache


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[ShardStore]:
    shard_store = ShardStore(tmp_path / "data", SMALL, clock)
    yield shard_store
    shard_store.close()


def test_shards_live_in_their_own_directories_and_are_cached(
    store: ShardStore, tmp_path: Path
) -> None:
    log = store.shard("project/logstore-1a2b3c4d", 0)
    other = store.shard("project/logstore-1a2b3c4d", 1)

    assert store.shard("project/logstore-1a2b3c4d", 0) is log
    assert other is not log
    assert log.path == tmp_path / "data" / "project" / "logstore-1a2b3c4d" / "0"
    log.append(b"zero", 1)
    assert other.end_seq == 0


def test_concurrent_first_use_opens_one_log(store: ShardStore) -> None:
    logs = []
    threads = [
        threading.Thread(target=lambda: logs.append(store.shard("p/l", 3))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(log) for log in logs}) == 1


def test_drop_logstore_closes_its_logs_and_deletes_the_directory(
    store: ShardStore, tmp_path: Path
) -> None:
    log = store.shard("p/gone", 0)
    log.append(b"x", 1)
    kept = store.shard("p/kept", 0)
    kept.append(b"y", 1)

    store.drop_logstore("p/gone")

    assert not (tmp_path / "data" / "p" / "gone").exists()
    with pytest.raises(StorageClosedError):
        log.append(b"x", 1)
    assert store.shard("p/gone", 0).end_seq == 0  # a new, empty log
    assert kept.read(0, 10, 100).data == b"y"


def test_retention_applies_to_each_listed_shard(store: ShardStore) -> None:
    for shard_id in (0, 1):
        for _ in range(20):
            store.shard("p/l", shard_id).append(b"0123456789" * 4, 1000)

    deleted = store.apply_retention("p/l", [0, 1], now_ms=100_000, ttl_ms=1000)

    assert deleted > 2
    for shard_id in (0, 1):
        log = store.shard("p/l", shard_id)
        assert log.begin_seq == log.end_seq == 20


def test_retention_skips_a_listed_shard_this_store_does_not_hold(
    store: ShardStore, tmp_path: Path
) -> None:
    """In a cluster the list names every shard of the logstore; a node holds only some."""
    store.shard("p/l", 0).append(b"x", 1000)

    store.apply_retention("p/l", [0, 1, 2], now_ms=100_000, ttl_ms=1000)

    assert sorted(p.name for p in (tmp_path / "data" / "p" / "l").iterdir()) == ["0"]


def test_drop_shard_closes_its_log_and_deletes_only_its_directory(
    store: ShardStore, tmp_path: Path
) -> None:
    gone = store.shard("p/l", 0)
    gone.append(b"x", 1)
    kept = store.shard("p/l", 1)
    kept.append(b"y", 1)

    assert store.drop_shard("p/l", 0) is True

    assert not (tmp_path / "data" / "p" / "l" / "0").exists()
    with pytest.raises(StorageClosedError):
        gone.append(b"x", 1)
    assert kept.read(0, 10, 100).data == b"y"
    assert store.drop_shard("p/l", 0) is False  # nothing left to drop
    assert store.drop_shard("p/l", 7) is False
    assert store.shard("p/l", 0).end_seq == 0  # a new, empty log if it comes back


@pytest.mark.parametrize("key", ["../escape", "/absolute", "p/../q", ""])
def test_logstore_keys_must_be_relative_paths_without_parent_steps(
    store: ShardStore, key: str
) -> None:
    with pytest.raises(AssertionError):
        store.shard(key, 0)


def test_closed_store_refuses_shards(store: ShardStore) -> None:
    log = store.shard("p/l", 0)
    store.close()
    with pytest.raises(StorageClosedError):
        store.shard("p/l", 0)
    with pytest.raises(StorageClosedError):
        log.read(0, 1, 1)


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_descriptors_stay_within_open_files_max_however_many_shards(
    tmp_path: Path, clock: FakeClock
) -> None:
    config = StorageConfig(
        segment_bytes_max=256, index_interval_bytes=64, payload_bytes_max=4096, open_files_max=4
    )
    store = ShardStore(tmp_path / "data", config, clock)
    before = _open_descriptors()
    try:
        for shard_id in range(40):
            log = store.shard("p/l", shard_id)
            for index in range(12):  # several segments per shard
                log.append(payload(index), 1000)
        for shard_id in range(40):
            data = store.shard("p/l", shard_id).read(0, 100, 1 << 20).data
            assert data == b"".join(payload(index) for index in range(12))
        statistics = store.statistics()
        assert statistics.open_shard_count == 40
        assert statistics.open_file_count <= 4
        assert _open_descriptors() - before <= 4
    finally:
        store.close()
    assert _open_descriptors() <= before


def test_file_cache_never_closes_a_descriptor_in_use(tmp_path: Path) -> None:
    files = FileCache(open_files_max=1)
    paths = [tmp_path / f"{index}.log" for index in range(3)]
    for path in paths:
        path.write_bytes(path.name.encode())
    in_use = [files.acquire(path) for path in paths]  # three pinned, over the bound of one
    assert [os.pread(fd, 10, 0) for fd in in_use] == [path.name.encode() for path in paths]
    for path in paths:
        files.release(path)
    assert files.open_count == 1  # the idle ones beyond the bound were closed
    files.forget(paths[2])
    files.close()
    assert files.open_count == 0
