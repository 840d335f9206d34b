"""A full disk refuses writes with 507 StorageFull, keeps reads, and loses nothing.

A real `loghub serve` keeps its data on an 8 MiB tmpfs mounted by the test (root only; the
test is skipped elsewhere). The test writes until the disk is full, then checks: the refused
write gets 507 with the StorageFull code (never a bare 500), every acknowledged group still
reads back, writes resume by themselves once space is freed (with the next sequence: the
refused write left no half record), and after a SIGKILL and restart every acknowledged group
is still there.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess
from test_damage import split_log_group_list

from loghub.client import LogHubClient
from loghub.errors import StorageFull
from loghub.wire.cursor import encode_cursor
from loghub.wire.logs import make_log_group

DISK_BYTES = 8 * 1024 * 1024
BALLAST_BYTES = 2 * 1024 * 1024
GROUP_VALUE_BYTES = 100 * 1024


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "data"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount_point)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace')}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def group(index: int) -> bytes:
    value = os.urandom(GROUP_VALUE_BYTES // 2).hex()
    return make_log_group([(1_700_000_000, {"n": str(index), "v": value})]).SerializeToString()


def pull_everything(client: LogHubClient) -> list[bytes]:
    groups: list[bytes] = []
    cursor = "MA=="
    while True:
        result = client.pull_logs_raw("full", "store", 0, cursor, count=10, compress_type="")
        groups.extend(split_log_group_list(result.data))
        if result.next_cursor == cursor:
            return groups
        cursor = result.next_cursor


def test_full_disk_refuses_writes_with_507_keeps_reads_and_resumes(small_disk: Path) -> None:
    server = ServerProcess(small_disk).start()
    try:
        ballast = small_disk / "ballast"
        ballast.write_bytes(b"\0" * BALLAST_BYTES)
        acked: list[bytes] = []
        with LogHubClient(server.endpoint) as client:
            client.create_project("full")
            client.create_logstore("full", "store", shard_count=1)
            refused = None
            for index in range(DISK_BYTES // GROUP_VALUE_BYTES + 10):
                raw = group(index)
                try:
                    client.put_log_group("full", "store", raw, shard_id=0, compress_type="")
                except StorageFull as exc:
                    refused = exc
                    break
                acked.append(raw)
            assert refused is not None, "the disk never filled"
            assert refused.status == 507
            assert str(small_disk) not in refused.message
            assert len(acked) > 10
            with httpx.Client(trust_env=False) as http:
                reply = http.post(
                    f"http://{server.endpoint}/logstores/store/shards/0",
                    headers={"host": "full.127.0.0.1", "content-type": "application/x-protobuf",
                             "x-log-bodyrawsize": str(len(raw))},
                    content=raw,
                )  # fmt: skip
            assert (reply.status_code, reply.json()["errorCode"]) == (507, "StorageFull")

            assert pull_everything(client) == acked  # reads go on while the disk is full

            ballast.unlink()  # space returns
            late = group(-1)
            client.put_log_group("full", "store", late, shard_id=0, compress_type="")
            acked.append(late)
            newest = client.pull_logs_raw("full", "store", 0, encode_cursor(len(acked) - 1))
            assert split_log_group_list(newest.data) == [late]
        server.kill()

        server.start()
        with LogHubClient(server.endpoint) as client:
            assert pull_everything(client) == acked
            assert client.get_cursor("full", "store", 0, "end") == encode_cursor(len(acked))
    finally:
        server.stop()
