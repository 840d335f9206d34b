"""Consumer memory against a real server: a worker that falls behind stays within its budget,
and PullLogs' LogHub-only byte bound (``loghub_max_bytes``) does what docs/protocol.md says.

The memory case is the situation the budget exists for: four shards with a backlog several
times the budget, a processor much slower than the pulls, one worker process. Its peak
resident set (``VmHWM``, measured by the kernel) may exceed what it held before it started
by the budget plus a fixed allowance for what the budget does not cover (threads, buffers of
the HTTP client, the allocator's slack); before pulls were reserved and sized it grew with
the backlog instead (several hundred MiB here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.wire.logs import PULL_BYTES_MAX_HEADER, PULL_BYTES_MAX_PARAM, make_log_group

PROJECT = "memory"
HERE = Path(__file__).parent
MIB = 1024 * 1024
BUDGET_BYTES = 8 * MIB
ALLOWANCE_BYTES = 32 * MIB  # above the budget: measured 1 to 5 MiB
LOGS_PER_GROUP = 100


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path_factory.mktemp("memory") / "data", extra_args=("--fsync", "interval")
    ).start()
    try:
        with LogHubClient(process.endpoint) as client:
            client.create_project(PROJECT)
        yield process
    finally:
        process.stop()


def write_backlog(server: ServerProcess, logstore: str, shards: int, groups: int) -> int:
    """``groups`` log groups of 100 access-log-like logs (about 18 KB raw each), spread over
    the shards; returns the raw bytes written."""
    written = 0
    with LogHubClient(server.endpoint) as client:
        client.create_logstore(PROJECT, logstore, shard_count=shards)
        for n in range(groups):
            logs = [
                (
                    1_700_000_000 + n,
                    {
                        "remote_addr": f"10.0.{n % 256}.{i}",
                        "request_uri": f"/api/v1/items/{n * LOGS_PER_GROUP + i}?page={i % 7}",
                        "status": "200",
                        "http_user_agent": "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Firefox",
                        "body_bytes_sent": str(n * 31 + i),
                    },
                )
                for i in range(LOGS_PER_GROUP)
            ]
            group = make_log_group(logs)
            written += group.ByteSize()
            client.put_log_group(PROJECT, logstore, group, shard_id=n % shards)
    return written


def test_a_worker_that_falls_behind_stays_within_its_budget(server: ServerProcess) -> None:
    backlog_bytes = write_backlog(server, "deep", shards=4, groups=2_400)
    assert backlog_bytes > 4 * BUDGET_BYTES
    child = subprocess.run(
        [
            sys.executable,
            str(HERE / "memory_consumer_worker.py"),
            server.endpoint,
            PROJECT,
            "deep",
            str(BUDGET_BYTES),
            "6",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["logs"] > 0, "the worker made progress"
    grown_bytes = result["peak_rss"] - result["idle_rss"]
    assert grown_bytes <= BUDGET_BYTES + ALLOWANCE_BYTES, (
        f"peak RSS grew by {grown_bytes / MIB:.0f} MiB over a budget of {BUDGET_BYTES // MIB} MiB"
    )


def test_a_pull_brings_at_most_loghub_max_bytes(server: ServerProcess) -> None:
    write_backlog(server, "bounded", shards=1, groups=20)
    with LogHubClient(server.endpoint) as client:
        begin = client.get_cursor(PROJECT, "bounded", 0, "begin")
        whole = client.pull_logs_body(PROJECT, "bounded", 0, begin, 1000)
        assert whole.count == 20 and whole.bytes_max is None, "not asked: no bound echoed"
        one_group_bytes = whole.raw_size // 20
        bounded = client.pull_logs_body(
            PROJECT, "bounded", 0, begin, 1000, bytes_max=5 * one_group_bytes + 100
        )
        assert bounded.bytes_max == 5 * one_group_bytes + 100
        assert 4 <= bounded.count <= 5 and bounded.raw_size <= bounded.bytes_max
        tiny = client.pull_logs_body(PROJECT, "bounded", 0, begin, 1000, bytes_max=1)
        assert tiny.count == 1, "the first group comes whatever its size"
        rest = client.pull_logs(PROJECT, "bounded", 0, bounded.next_cursor, 1000)
        assert bounded.count + rest.count == 20, "nothing skipped after a bounded pull"


@pytest.fixture(scope="module")
def begin_cursor(server: ServerProcess) -> str:
    with LogHubClient(server.endpoint) as client:
        client.create_logstore(PROJECT, "badinput", shard_count=1)
        return client.get_cursor(PROJECT, "badinput", 0, "begin")


@pytest.mark.parametrize("value", ["0", "-5", "many", "1e6", "٣", "9" * 30])
def test_a_bad_loghub_max_bytes_is_a_400_in_loghubs_error_format(
    server: ServerProcess, begin_cursor: str, value: str
) -> None:
    reply = httpx.get(
        f"http://{server.endpoint}/logstores/badinput/shards/0",
        params={"type": "log", "cursor": begin_cursor, "count": "10", PULL_BYTES_MAX_PARAM: value},
        headers={"host": f"{PROJECT}.127.0.0.1", "x-log-apiversion": "0.6.0"},
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["errorCode"] == "ParameterInvalid"
    assert PULL_BYTES_MAX_HEADER not in reply.headers
