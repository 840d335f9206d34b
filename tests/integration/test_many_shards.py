"""Descriptors stay bounded however many shards there are.

A real `loghub serve` runs with RLIMIT_NOFILE soft = hard = 1024 (so it cannot raise it) and
1,600 shards over two logstores (the per-logstore limit is 1,024). Every shard is written,
then read back; no request may fail, and the server's descriptors, counted in
/proc/<pid>/fd, must stay well under the limit. Before the file cache, three descriptors per
segment were held for ever and 1,266 of 1,600 shards failed with "Too many open files".
"""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import server_process
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.wire.logs import make_log_group

LOGSTORES = 2
SHARDS_PER_LOGSTORE = 800
OPEN_FILES_LIMIT = 1024


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES_LIMIT, OPEN_FILES_LIMIT))


def _popen_with_limit(real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return real(*args, preexec_fn=_limit_open_files, **kwargs)


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _write_and_read(endpoint: str, logstore: str, shard_ids: range) -> list[int]:
    """Writes one group to each shard and reads it back; returns the groups read per shard."""
    counts = []
    with LogHubClient(endpoint, timeout_s=30) as client:
        for shard_id in shard_ids:
            group = make_log_group([(1_700_000_000, {"shard": str(shard_id)})])
            client.put_log_group("fds", logstore, group, shard_id=shard_id)
        for shard_id in shard_ids:
            counts.append(client.pull_logs("fds", logstore, shard_id, "MA==").count)
    return counts


def test_1600_shards_under_ulimit_1024_are_all_written_and_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        server_process.subprocess, "Popen", partial(_popen_with_limit, subprocess.Popen)
    )
    server = ServerProcess(tmp_path / "data").start()
    monkeypatch.undo()
    try:
        limits = Path(f"/proc/{server.pid}/limits").read_text()
        assert any(
            line.startswith("Max open files") and f"{OPEN_FILES_LIMIT}" in line
            for line in limits.splitlines()
        )
        with LogHubClient(server.endpoint) as client:
            client.create_project("fds")
            for store in range(LOGSTORES):
                client.create_logstore("fds", f"store{store}", shard_count=SHARDS_PER_LOGSTORE)
        # four clients at once, each over a quarter of the shards
        jobs = [
            (f"store{store}", range(start, start + SHARDS_PER_LOGSTORE // 2))
            for store in range(LOGSTORES)
            for start in (0, SHARDS_PER_LOGSTORE // 2)
        ]
        with ThreadPoolExecutor(len(jobs)) as pool:
            results = list(pool.map(lambda job: _write_and_read(server.endpoint, *job), jobs))
        counts = [count for result in results for count in result]
        assert len(counts) == LOGSTORES * SHARDS_PER_LOGSTORE
        assert counts == [1] * len(counts)
        open_files = _open_files(server.pid)
        print(f"server descriptors after writing and reading 1,600 shards: {open_files}")
        assert open_files < OPEN_FILES_LIMIT // 2 + 128
    finally:
        server.stop()
