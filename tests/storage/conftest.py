"""Fixtures for the storage tests: a fake clock and small shard logs in tmp_path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from storage_helpers import SMALL, FakeClock

from loghub.storage import ShardLog, StorageConfig


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


OpenLog = Callable[..., ShardLog]


@pytest.fixture
def open_log(tmp_path: Path, clock: FakeClock) -> Iterator[OpenLog]:
    """Opens the shard log in ``tmp_path / "shard"`` (closing every one at teardown)."""
    opened: list[ShardLog] = []

    def open_(config: StorageConfig = SMALL, path: Path | None = None) -> ShardLog:
        log = ShardLog.open(path or tmp_path / "shard", config, clock)
        opened.append(log)
        return log

    yield open_
    for log in opened:
        log.close()
