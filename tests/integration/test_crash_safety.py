"""An acknowledged write survives SIGKILL of the server, byte for byte.

Producers stream log groups at a real `loghub serve` (fsync=always), recording the exact bytes
of every group the server acknowledged; the test SIGKILLs the server mid-stream, starts it
again on the same data directory, and reads every shard back.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.errors import LogHubError
from loghub.wire.logs import make_log_group

PRODUCERS = 4


def _split_log_group_list(raw: bytes) -> list[bytes]:
    """The serialized groups of a LogGroupList, exactly as stored (field 1 entries)."""
    groups, pos = [], 0
    while pos < len(raw):
        assert raw[pos] == 0x0A, "only field 1 entries are expected"
        pos += 1
        length = shift = 0
        while True:
            byte = raw[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        groups.append(raw[pos : pos + length])
        pos += length
    return groups


def _produce(endpoint: str, producer: int, acked: list[bytes], stop: threading.Event) -> None:
    with LogHubClient(endpoint, timeout_s=10) as client:
        n = 0
        while not stop.is_set():
            records = [
                (1_700_000_000 + n, {"producer": str(producer), "n": str(n), "pad": "x" * (n % 97)})
                for _ in range(1 + n % 20)
            ]
            raw = make_log_group(records, topic=f"p{producer}").SerializeToString()
            try:
                client.put_log_group("crash", "store", raw, compress_type="lz4" if n % 2 else "")
            except LogHubError:
                return  # the server is gone: this write was not acknowledged
            acked.append(raw)
            n += 1


def _stored_groups(endpoint: str) -> list[bytes]:
    stored: list[bytes] = []
    with httpx.Client(base_url=f"http://{endpoint}", headers={"host": "crash.127.0.0.1"}) as http:
        for shard in (0, 1, 2):
            cursor = "MA=="
            while True:
                reply = http.get(
                    f"/logstores/store/shards/{shard}",
                    params={"type": "log", "cursor": cursor, "count": "1000"},
                    headers={"accept-encoding": ""},
                )
                assert reply.status_code == 200, reply.text
                stored.extend(_split_log_group_list(reply.content))
                if reply.headers["x-log-cursor"] == cursor:
                    break
                cursor = reply.headers["x-log-cursor"]
    return stored


def test_acknowledged_writes_survive_sigkill(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        with LogHubClient(server.endpoint) as client:
            client.create_project("crash")
            client.create_logstore("crash", "store", shard_count=3)
        acked: list[list[bytes]] = [[] for _ in range(PRODUCERS)]
        stop = threading.Event()
        threads = [
            threading.Thread(target=_produce, args=(server.endpoint, p, acked[p], stop))
            for p in range(PRODUCERS)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while sum(map(len, acked)) < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        server.kill()  # SIGKILL while the producers are still writing
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        assert sum(map(len, acked)) >= 300, "the producers did not get going"

        server.start()
        stored = _stored_groups(server.endpoint)
        stored_set = set(stored)
        for producer_acked in acked:
            missing = [raw for raw in producer_acked if raw not in stored_set]
            assert not missing, f"{len(missing)} acknowledged groups are gone after SIGKILL"
        assert len(stored) == len(stored_set), "a group is stored twice"
    finally:
        server.stop()
