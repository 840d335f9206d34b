"""Producers' LZ4 blocks kept as they came, against a real `loghub serve` child.

A PutLogs body sent as lz4 (the SDK's default) is stored as its block; other bodies, and
writes marked by LogHub's idempotent client, are stored framed. Whatever a shard holds, a pull
in every codec returns the same LogGroupList, byte for byte, with its raw size in
``x-log-bodyrawsize``; ``loghub_max_bytes`` counts raw bytes; the disk holds the compressed
blocks; and the data survives a SIGKILL and a restart (recovery walks the stored blocks like
any record).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import lz4.block
import pytest
from aliyun.log import LogClient, LogItem, PutLogsRequest
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.wire.logs import frame_log_group, make_log_group
from loghub.wire.producer_ids import WriteId, marked

PROJECT = "blocks"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("stored-blocks") / "data").start()
    try:
        yield process
    finally:
        process.stop()


def _group(rng: random.Random, logs: int) -> bytes:
    records = []
    for i in range(logs):
        agent = rng.choice(["curl/8", "Mozilla/5.0 (X11)"]) * rng.randrange(1, 4)
        fields = {"path": f"/api/{rng.randrange(50)}", "status": str(rng.choice([200, 404]))}
        records.append((1_700_000_000 + i, {**fields, "agent": agent}))
    return bytes(make_log_group(records, topic="t", source="10.0.0.1").SerializeToString())


def _pull_all(client: LogHubClient, store: str, codec: str, bytes_max: int | None = None) -> bytes:
    cursor = client.get_cursor(PROJECT, store, 0, "begin")
    data = b""
    while True:
        pulled = client.pull_logs_body(PROJECT, store, 0, cursor, 1000, None, codec, bytes_max)
        if not pulled.count:
            return data
        raw = pulled.decompress()
        assert len(raw) == pulled.raw_size
        data += raw
        cursor = pulled.next_cursor


def test_every_codec_pulls_the_same_log_group_list_from_a_mixed_shard(
    server: ServerProcess,
) -> None:
    with LogHubClient(server.endpoint) as client:
        _write_mixed_and_pull_in_every_codec(client)


def _write_mixed_and_pull_in_every_codec(client: LogHubClient) -> None:
    client.create_project(PROJECT)
    client.create_logstore(PROJECT, "mixed", shard_count=1)
    rng = random.Random(3)
    expected = b""
    for index in range(60):
        raw = _group(rng, rng.choice([1, 3, 16, 200]))
        codec = ["lz4", "lz4", "lz4", "", "deflate", "zstd"][index % 6]
        write_id = WriteId("blocks-test", index) if index % 7 == 0 else None
        client.put_log_group(PROJECT, "mixed", raw, shard_id=0, compress_type=codec,
                             write_id=write_id)  # fmt: skip
        expected += frame_log_group(raw if write_id is None else marked(raw, write_id))
    for codec in ("lz4", "", "zstd", "deflate"):
        assert _pull_all(client, "mixed", codec) == expected, codec
    # a byte limit counts the groups' raw bytes, not what the disk holds
    limited = client.pull_logs_body(
        PROJECT, "mixed", 0, client.get_cursor(PROJECT, "mixed", 0, "begin"), 1000, None,
        "lz4", 3_000,
    )  # fmt: skip
    assert 0 < limited.raw_size <= 3_000 or limited.count == 1
    assert limited.raw_size == len(limited.decompress())


def _sdk(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> LogClient:
    """The official SDK pointed at ``server`` (it sends ``Host: <project>.<endpoint>``; the
    server takes proxy-form requests)."""
    monkeypatch.setenv("HTTP_PROXY", f"http://{server.endpoint}")
    monkeypatch.setenv("http_proxy", f"http://{server.endpoint}")
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return LogClient(server.endpoint, "ak", "sk")


def test_sdk_writes_are_kept_compressed_and_read_back_after_a_sigkill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir).start()
    try:
        sdk = _sdk(server, monkeypatch)
        sdk.create_project(PROJECT, "blocks")
        sdk.create_logstore(PROJECT, "sdk", ttl=7, shard_count=1)
        rng = random.Random(5)
        sent = []
        for batch in range(20):
            items = []
            for i in range(100):
                item = LogItem(timestamp=1_700_000_000 + i)
                number = str(batch * 100 + i)
                item.set_contents([("path", f"/api/{rng.randrange(50)}"), ("n", number)])
                items.append(item)
                sent.append(number)
            sdk.put_logs(PutLogsRequest(PROJECT, "sdk", "t", "", items))
        with LogHubClient(server.endpoint) as client:
            raw_total = len(_pull_all(client, "sdk", ""))
            before = _pull_all(client, "sdk", "lz4")
        on_disk = sum(path.stat().st_size for path in data_dir.rglob("*.log"))
        assert on_disk < raw_total / 2, (on_disk, raw_total)  # the blocks, not the groups
        server.kill()
        server = ServerProcess(data_dir).start()
        with LogHubClient(server.endpoint) as client:
            assert _pull_all(client, "sdk", "lz4") == before
            assert _pull_all(client, "sdk", "") == before
        assert _sdk_pull(_sdk(server, monkeypatch), "sdk") == sent
    finally:
        server.stop()


def _sdk_pull(sdk: LogClient, store: str) -> list[str]:
    """Every log's ``n`` as the official SDK reads it back (its own lz4 decoding)."""
    cursor = sdk.get_cursor(PROJECT, store, 0, "begin").get_cursor()
    found = []
    while True:
        reply = sdk.pull_logs(PROJECT, store, 0, cursor, 1000)
        if not reply.get_loggroup_count():
            return found
        for group in reply.get_loggroup_list().LogGroups:
            for log in group.Logs:
                found += [c.Value for c in log.Contents if c.Key == "n"]
        cursor = reply.get_next_cursor()


def test_a_joined_reply_is_what_lz4_would_decode_from_the_stored_blocks() -> None:
    """The reply's block, decoded by the reference decoder, is the list; no block is ever
    decompressed to make it (the stored bytes are copied with a few token bytes changed)."""
    from loghub.wire import stored

    rng = random.Random(11)
    raws = [_group(rng, 50) for _ in range(30)]
    data = b"".join(
        stored.stored_entry("lz4", lz4.block.compress(r, store_size=False), r) for r in raws
    )
    block, raw_size = stored.lz4_reply(data)
    assert lz4.block.decompress(block, uncompressed_size=raw_size) == b"".join(
        frame_log_group(r) for r in raws
    )
