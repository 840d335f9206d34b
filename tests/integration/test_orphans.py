"""A SIGKILLed server leaves no process behind.

The server checks large PutLogs bodies in worker processes. A server killed with SIGKILL
cannot stop them, so they must notice on their own: every child of the server (found by
scanning /proc for its parent pid before the kill) must be gone within a few seconds after.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
from server_process import ServerProcess

from loghub.wire.logs import make_log_group

PROJECT = "orphans"


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


def _alive(pid: int) -> bool:
    found = _ppid_and_state(pid)
    return found is not None and found[1] != "Z"  # a zombie has ended; only its entry is left


def test_worker_processes_die_with_a_sigkilled_server(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        base = f"http://{server.endpoint}"
        headers = {"host": f"{PROJECT}.127.0.0.1"}
        with httpx.Client(trust_env=False, timeout=30) as http:
            assert http.post(base + "/", headers=headers, json={"projectName": PROJECT}).is_success
            reply = http.post(
                base + "/logstores",
                headers=headers,
                json={"logstoreName": "store", "shardCount": 1, "ttl": 1},
            )
            assert reply.is_success, reply.text
            # a body over parse_inline_bytes_max (64 KiB) is checked by the workers
            records = [(1_700_000_000, {"line": f"{i:06d} " + "x" * 200}) for i in range(2000)]
            body = make_log_group(records).SerializeToString()
            assert len(body) > 256 * 1024
            reply = http.post(
                base + "/logstores/store/shards/lb",
                headers={**headers, "x-log-bodyrawsize": str(len(body))},
                content=body,
            )
            assert reply.is_success, reply.text
        children = _descendants(server.pid)
        assert children, "the server started no worker process"
    finally:
        server.kill()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.1)
    survivors = sorted(pid for pid in children if _alive(pid))
    for pid in survivors:  # clean up after a failure: these are ours
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"processes outlived the server: {survivors}"
