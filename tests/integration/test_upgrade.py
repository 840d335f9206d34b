"""A data directory written before segment files had a header opens and upgrades in place.

``tests/fixtures/data_dir_v1.tar.gz`` was written by a real ``loghub serve`` of the release
before (``tests/fixtures/make_data_dir_v1.py``): two logstores, 2 KiB segments, so each busy
shard has sealed segments and an active one, and ``expected.json`` with what every shard's
pulls returned then. A real server of this code must serve the same bytes, take new writes,
survive SIGKILL and serve everything again, without rewriting a byte of the old segments.
"""

from __future__ import annotations

import base64
import json
import tarfile
from pathlib import Path

import crc32c
import pytest
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.storage.leader_epochs import LEADER_EPOCHS_FILE_NAME, decode_leader_epochs
from loghub.storage.segment import SEGMENT_FORMAT_VERSION, encode_segment_header
from loghub.wire.logs import make_log_group

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "data_dir_v1.tar.gz"
PROJECT = "upgrade"
SEGMENT_ARGS = ("--segment-bytes-max", "2048")  # as the fixture was written
SHARDS = [("store", 0), ("store", 1), ("quiet", 0)]


def unpack(tmp_path: Path) -> tuple[Path, dict[str, dict[str, list[str]]]]:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    expected = json.loads((tmp_path / "expected.json").read_text())
    return tmp_path / "data", expected


def pulled_bytes(client: LogHubClient, logstore: str, shard: int) -> bytes:
    """Every group of the shard as one serialized LogGroupList (pull batches concatenate)."""
    parts = []
    cursor = client.get_cursor(PROJECT, logstore, shard, "begin")
    while True:
        pulled = client.pull_logs_raw(PROJECT, logstore, shard, cursor, count=7)
        if pulled.count == 0:
            return b"".join(parts)
        parts.append(pulled.data)
        cursor = pulled.next_cursor


def segment_files(data_dir: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in sorted(data_dir.glob("shards/*/*/*/*.log"))}


def test_a_data_dir_of_the_first_format_reads_back_takes_writes_and_survives_a_crash(
    tmp_path: Path,
) -> None:
    data_dir, expected = unpack(tmp_path)
    old_segments = segment_files(data_dir)
    assert len(old_segments) == 11 and not any(
        data.startswith(encode_segment_header()) for data in old_segments.values()
    )
    server = ServerProcess(data_dir, extra_args=SEGMENT_ARGS).start()
    new_groups: dict[tuple[str, int], list[bytes]] = {}
    try:
        with LogHubClient(server.endpoint, timeout_s=10) as client:
            for logstore, shard in SHARDS:
                # the same pulls, answered with the same bytes
                cursor = client.get_cursor(PROJECT, logstore, shard, "begin")
                for body in expected[logstore][str(shard)]:
                    pulled = client.pull_logs_raw(PROJECT, logstore, shard, cursor, count=7)
                    assert pulled.data == base64.b64decode(body)
                    cursor = pulled.next_cursor
                assert client.pull_logs_raw(PROJECT, logstore, shard, cursor).count == 0
            for logstore, shard in SHARDS:
                groups = [
                    make_log_group(
                        [(1_800_000_000 + n, {"after": "upgrade", "n": str(n), "pad": "z" * n})],
                        topic="new",
                    ).SerializeToString()
                    for n in range(30)
                ]
                for raw in groups:
                    client.put_log_group(
                        PROJECT, logstore, raw, shard_id=shard, compress_type="lz4"
                    )
                new_groups[(logstore, shard)] = groups
    finally:
        server.kill()  # a crash, not a clean stop

    server = ServerProcess(data_dir, extra_args=SEGMENT_ARGS).start()
    try:
        with LogHubClient(server.endpoint, timeout_s=10) as client:
            for logstore, shard in SHARDS:
                old = b"".join(base64.b64decode(body) for body in expected[logstore][str(shard)])
                new = b"".join(_list_entry(raw) for raw in new_groups[(logstore, shard)])
                assert pulled_bytes(client, logstore, shard) == old + new
    finally:
        server.stop()

    for path, data in old_segments.items():
        if data:  # the empty active segment of "quiet" took the header and new records
            assert path.read_bytes() == data, path
    for path, data in segment_files(data_dir).items():
        if path not in old_segments or not old_segments[path]:
            assert data.startswith(encode_segment_header()), path
    for shard_dir in data_dir.glob("shards/*/*/*"):
        epochs = decode_leader_epochs((shard_dir / LEADER_EPOCHS_FILE_NAME).read_bytes())
        assert epochs == [(0, 0)]


def test_a_data_dir_with_a_segment_of_a_newer_format_is_refused_at_start(
    tmp_path: Path,
) -> None:
    data_dir, _expected = unpack(tmp_path)
    shard_dir = next(data_dir.glob("shards/upgrade/store-*/1"))
    newer = encode_segment_header().replace(
        SEGMENT_FORMAT_VERSION.to_bytes(2, "big"), (SEGMENT_FORMAT_VERSION + 1).to_bytes(2, "big")
    )
    newer = newer[:8] + _crc(newer[:8])
    (shard_dir / f"{40:020d}.log").write_bytes(newer + b"\x5a" * 100)
    before = segment_files(data_dir)

    server = ServerProcess(data_dir, extra_args=SEGMENT_ARGS)
    try:
        with pytest.raises(RuntimeError, match="server exited with 2") as caught:
            server.start(timeout_s=30)
    finally:
        server.stop()  # a server that started after all is not left running
    assert f"segment format {SEGMENT_FORMAT_VERSION + 1} was written by a newer" in str(
        caught.value
    )
    assert segment_files(data_dir) == before  # nothing cut, nothing added


def _list_entry(raw: bytes) -> bytes:
    """``raw`` as one entry (field 1) of a serialized LogGroupList."""
    length, prefix = len(raw), bytearray([0x0A])
    while True:
        byte = length & 0x7F
        length >>= 7
        prefix.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(prefix) + raw


def _crc(covered: bytes) -> bytes:
    return crc32c.crc32c(covered).to_bytes(4, "big")
