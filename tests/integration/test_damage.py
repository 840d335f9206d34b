"""One damaged byte on disk costs one log group, through a real server and a real restart.

The test writes 300 groups to one shard of a real `loghub serve`, takes a cursor, SIGKILLs
the server, flips one byte of group 100's record (a payload byte, or a bit of its length
field) in the active segment or in a closed one (the log file is split at group 200 as a
roll would have split it), and starts the server again. Then: every other acknowledged group
reads back byte for byte, the end cursor is still 300, the next write gets 300, the cursor
taken before still reads the same groups, a pull at group 100 gets 410 DataCorrupted (never a
5xx, never a server path) naming the cursor to resume from, and /metrics counts the loss.
"""

from __future__ import annotations

import struct
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.storage.segment import SEGMENT_HEADER_BYTES, encode_segment_header
from loghub.wire.cursor import encode_cursor
from loghub.wire.logs import make_log_group

GROUPS = 300
DAMAGED = 100
HEADER = struct.Struct(">BBIQQII")


def split_log_group_list(raw: bytes) -> list[bytes]:
    """The serialized groups of a LogGroupList (field 1 entries), exactly as stored."""
    groups, position = [], 0
    while position < len(raw):
        assert raw[position] == 0x0A
        position += 1
        length = shift = 0
        while True:
            byte = raw[position]
            position += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        groups.append(raw[position : position + length])
        position += length
    return groups


def record_positions(log_file: Path) -> list[int]:
    data = log_file.read_bytes()
    positions = []
    position = SEGMENT_HEADER_BYTES if data.startswith(encode_segment_header()) else 0
    while position < len(data):
        positions.append(position)
        position += HEADER.size + HEADER.unpack_from(data, position)[5]
    return positions


def make_closed_segment(shard_dir: Path, at_group: int) -> Path:
    """Splits the only segment at ``at_group`` as a roll would have: the first part becomes a
    closed segment (its indexes are rebuilt on open). Returns the closed segment's file."""
    log_file = shard_dir / f"{0:020d}.log"
    data = log_file.read_bytes()
    cut = record_positions(log_file)[at_group]
    log_file.write_bytes(data[:cut])
    (shard_dir / f"{at_group:020d}.log").write_bytes(encode_segment_header() + data[cut:])
    for suffix in (".index", ".timeindex"):
        log_file.with_suffix(suffix).unlink(missing_ok=True)
    return log_file


def pull_all(client: LogHubClient, cursor: str) -> tuple[list[bytes], str]:
    groups: list[bytes] = []
    while True:
        result = client.pull_logs_raw("damage", "store", 0, cursor, compress_type="")
        groups.extend(split_log_group_list(result.data))
        if result.next_cursor == cursor:
            return groups, cursor
        cursor = result.next_cursor


@pytest.mark.parametrize("segment", ["active", "closed"])
@pytest.mark.parametrize("damage", ["payload byte", "length bit"])
def test_a_flipped_byte_after_sigkill_costs_exactly_one_group(
    tmp_path: Path, segment: str, damage: str
) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        with LogHubClient(server.endpoint) as client:
            client.create_project("damage")
            client.create_logstore("damage", "store", shard_count=1)
            acked = []
            for index in range(GROUPS):
                raw = make_log_group(
                    [(1_700_000_000, {"n": str(index), "pad": "x" * (index % 50)})]
                ).SerializeToString()
                client.put_log_group("damage", "store", raw, shard_id=0, compress_type="")
                acked.append(raw)
            cursor_150 = client.pull_logs_raw("damage", "store", 0, "MA==", count=150).next_cursor
            before = client.pull_logs_raw("damage", "store", 0, cursor_150, count=10).data
        server.kill()

        (shard_dir,) = (tmp_path / "data" / "shards" / "damage").glob("store-*/0")
        log_file = shard_dir / f"{0:020d}.log"
        if segment == "closed":
            log_file = make_closed_segment(shard_dir, 200)
        position = record_positions(log_file)[DAMAGED]
        offset, mask = (HEADER.size + 5, 0xFF) if damage == "payload byte" else (25, 0x02)
        data = bytearray(log_file.read_bytes())
        data[position + offset] ^= mask
        log_file.write_bytes(bytes(data))

        server.start()
        with LogHubClient(server.endpoint) as client:
            first = client.pull_logs_raw("damage", "store", 0, "MA==", count=1000)
            assert split_log_group_list(first.data) == acked[:DAMAGED]
            assert first.next_cursor == encode_cursor(DAMAGED)
            rest, end = pull_all(client, encode_cursor(DAMAGED + 1))
            assert rest == acked[DAMAGED + 1 :]
            assert end == encode_cursor(GROUPS)
            assert client.get_cursor("damage", "store", 0, "end") == encode_cursor(GROUPS)
            assert client.pull_logs_raw("damage", "store", 0, cursor_150, count=10).data == before

            late = make_log_group([(1_700_000_001, {"n": "late"})]).SerializeToString()
            client.put_log_group("damage", "store", late, shard_id=0, compress_type="")
            newest = client.pull_logs_raw("damage", "store", 0, encode_cursor(GROUPS))
            assert split_log_group_list(newest.data) == [late]

        with httpx.Client(
            base_url=f"http://{server.endpoint}", headers={"host": "damage.127.0.0.1"}
        ) as http:
            for query in (
                {"type": "log", "cursor": encode_cursor(DAMAGED), "count": "10"},
                {"type": "cursor_time", "cursor": encode_cursor(DAMAGED)},
            ):
                reply = http.get("/logstores/store/shards/0", params=query)
                assert reply.status_code == 410, reply.text
                body = reply.json()
                assert body["errorCode"] == "DataCorrupted"
                assert encode_cursor(DAMAGED + 1) in body["errorMessage"]
                assert str(tmp_path) not in body["errorMessage"]
            metrics = http.get("/metrics").text
        assert "loghub_storage_lost_records 1.0" in metrics
        assert "loghub_storage_lost_ranges 1.0" in metrics
    finally:
        server.stop()


def test_invalid_cursor_names_the_shard_not_the_server_path(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        with LogHubClient(server.endpoint) as client:
            client.create_project("damage")
            client.create_logstore("damage", "store", shard_count=1)
        with httpx.Client(
            base_url=f"http://{server.endpoint}", headers={"host": "damage.127.0.0.1"}
        ) as http:
            reply = http.get(
                "/logstores/store/shards/0",
                params={"type": "log", "cursor": encode_cursor(5), "count": "10"},
            )
        assert reply.status_code == 400
        message = reply.json()["errorMessage"]
        assert reply.json()["errorCode"] == "InvalidCursor"
        assert str(tmp_path) not in message and "/" not in message
        assert "shard 0" in message
    finally:
        server.stop()
