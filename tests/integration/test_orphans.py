"""A server leaves no process behind, because it starts none to check PutLogs bodies.

Earlier releases checked large bodies in worker processes, started on the first large body
(the first such request after a start stalled while they spawned) and obliged to notice on
their own that a SIGKILLed server was gone. The check now runs in the server process: after
large PutLogs on a fresh server with 1,000 shards, the server has no child at all. The
latency of the first PutLogs is printed (a figure, not an assertion: the machine is shared).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import httpx
import lz4.block
from server_process import ServerProcess

from loghub.wire.logs import make_log_group

PROJECT = "orphans"
SHARDS = 1000


def _ppid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0]


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _ppid_and_state(int(entry))) is not None:
            parents[int(entry)] = found[0]
    family: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        family |= frontier
    return family


def _create_logstore(data_dir: Path) -> None:
    server = ServerProcess(data_dir).start()
    try:
        base = f"http://{server.endpoint}"
        headers = {"host": f"{PROJECT}.127.0.0.1"}
        with httpx.Client(trust_env=False, timeout=60) as http:
            assert http.post(base + "/", headers=headers, json={"projectName": PROJECT}).is_success
            reply = http.post(
                base + "/logstores",
                headers=headers,
                json={"logstoreName": "store", "shardCount": SHARDS, "ttl": 1},
            )
            assert reply.is_success, reply.text
    finally:
        server.stop()


def test_a_fresh_server_checks_large_bodies_without_a_child_process(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    _create_logstore(data_dir)
    # over the 64 KiB that earlier releases checked in place, and over the size at which the
    # compiled check lets go of the GIL
    rng = random.Random(11)
    records = [(1_700_000_000, {"line": rng.randbytes(100).hex()}) for _ in range(2000)]
    raw = make_log_group(records).SerializeToString()
    body = lz4.block.compress(raw, store_size=False)
    assert len(body) > 256 * 1024
    server = ServerProcess(data_dir).start()
    try:
        base = f"http://{server.endpoint}"
        headers = {
            "host": f"{PROJECT}.127.0.0.1",
            "x-log-compresstype": "lz4",
            "x-log-bodyrawsize": str(len(raw)),
        }
        with httpx.Client(trust_env=False, timeout=30) as http:
            latencies_ms = []
            for shard in ("0", "lb", str(SHARDS - 1)):
                started = time.perf_counter()
                reply = http.post(
                    f"{base}/logstores/store/shards/{shard}", headers=headers, content=body
                )
                latencies_ms.append((time.perf_counter() - started) * 1000)
                assert reply.is_success, reply.text
            raw_reply = http.post(
                f"{base}/logstores/store/shards/0",
                headers={"host": f"{PROJECT}.127.0.0.1", "x-log-bodyrawsize": str(len(raw))},
                content=raw,
            )
            assert raw_reply.is_success, raw_reply.text
        print(
            f"first PutLogs after a start, {SHARDS} shards, {len(raw)} raw bytes: "
            f"{latencies_ms[0]:.1f} ms (then {latencies_ms[1]:.1f}, {latencies_ms[2]:.1f} ms)"
        )
        assert _descendants(server.pid) == set()
    finally:
        server.kill()
