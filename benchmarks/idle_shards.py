"""Many idle shards: a server's descriptors, and its first requests after a start.

A real ``loghub serve`` child gets a logstore of ``--shards`` shards with a little data in
each (``--groups`` log groups of 16 access logs per shard), and is stopped. Then, ``--runs``
times, a server starts on that data directory and the benchmark measures:

- its descriptors (``/proc/<pid>/fd``) once it answers ``/health``;
- the latency of its first PutLogs (to one shard) and of its first PullLogs (of another),
  each on a connection opened beforehand, so the figure is the server's part;
- its descriptors after every shard has been read once from its start.

Goals: at most one descriptor per idle shard (1,000 shards: ≤ 1,100 descriptors, with the
database, sockets and the interpreter's own), first request ≤ 100 ms.

    python benchmarks/idle_shards.py [--shards 1000] [--runs 3] [--smoke]
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import time
from pathlib import Path

from _common import (
    LOGSTORE,
    PROJECT,
    ServerChild,
    _put_headers,
    build_batches,
    create_logstore,
    machine_summary,
    make_data_dir,
    remove_tree,
)
from _results import Row, save

PULL_HEADERS = {
    "Host": f"{PROJECT}.127.0.0.1",
    "x-log-apiversion": "0.6.0",
    "Accept-Encoding": "lz4",
}


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def timed(conn: http.client.HTTPConnection, method: str, path: str, **kwargs: object) -> float:
    """ms from sending the request to having read the whole reply; the reply must be 200."""
    started = time.perf_counter()
    conn.request(method, path, **kwargs)  # type: ignore[arg-type]
    response = conn.getresponse()
    data = response.read()
    took_ms = (time.perf_counter() - started) * 1e3
    if response.status != 200:
        raise RuntimeError(f"{method} {path} answered {response.status}: {data[:300]!r}")
    return took_ms


def fill(server: ServerChild, shards: int, groups: int) -> None:
    """``groups`` log groups in every shard, written one shard after another."""
    batches = build_batches(min(64, shards * groups), 16)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        for shard_id in range(shards):
            for index in range(groups):
                batch = batches[(shard_id * groups + index) % len(batches)]
                path = f"/logstores/{LOGSTORE}/shards/{shard_id}"
                timed(conn, "POST", path, body=batch.body, headers=_put_headers(batch))
    finally:
        conn.close()


def pull_path(shard_id: int) -> str:
    return f"/logstores/{LOGSTORE}/shards/{shard_id}?type=log&cursor=MA%3D%3D&count=1000"


def one_start(data_dir: Path, shards: int) -> dict[str, float]:
    """Starts a server on the filled data, measures, stops it."""
    server = ServerChild(data_dir).start()
    try:
        figures = {"fds_after_start": float(open_fds(server.pid))}
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        try:
            conn.request("GET", "/health", headers={"Host": "127.0.0.1"})
            conn.getresponse().read()
            batch = build_batches(1, 16, seed=7)[0]
            figures["first_put_ms"] = timed(
                conn, "POST", f"/logstores/{LOGSTORE}/shards/0",
                body=batch.body, headers=_put_headers(batch),
            )  # fmt: skip
            figures["first_pull_ms"] = timed(conn, "GET", pull_path(1), headers=PULL_HEADERS)
            started = time.perf_counter()
            for shard_id in range(shards):
                timed(conn, "GET", pull_path(shard_id), headers=PULL_HEADERS)
            figures["read_all_s"] = time.perf_counter() - started
        finally:
            conn.close()
        figures["fds_after_reading"] = float(open_fds(server.pid))
        return figures
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=2, help="log groups per shard")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--smoke", action="store_true", help="a tiny run that only checks")
    args = parser.parse_args()
    if args.smoke:
        args.shards, args.groups, args.runs = 8, 1, 1

    print(machine_summary())
    root = make_data_dir(args.data_dir, "loghub-bench-idle-")
    data_dir = root / "data"
    try:
        filler = ServerChild(data_dir).start()
        try:
            create_logstore(filler.port, args.shards)
            fill(filler, args.shards, args.groups)
        finally:
            filler.stop()
        print(f"{args.shards} shards, {args.groups} log groups of 16 logs each; restarts:")
        runs = []
        for run in range(args.runs):
            figures = one_start(data_dir, args.shards)
            runs.append(figures)
            print(
                f"  run {run + 1}: {figures['fds_after_start']:.0f} fds after start, "
                f"{figures['fds_after_reading']:.0f} after reading every shard "
                f"({figures['read_all_s']:.1f} s); first PutLogs "
                f"{figures['first_put_ms']:.1f} ms, first PullLogs "
                f"{figures['first_pull_ms']:.1f} ms"
            )
    finally:
        remove_tree(root)

    def values(key: str) -> list[float]:
        return [figures[key] for figures in runs]

    fd_goal = f"≤ {args.shards + args.shards // 10} fds"
    rows = [
        Row(f"{args.shards} idle shards, after start", "fds", values("fds_after_start"),
            higher_is_better=False, goal=fd_goal),
        Row(f"{args.shards} shards, after reading each once", "fds",
            values("fds_after_reading"), higher_is_better=False, goal=fd_goal),
        Row(f"first PutLogs after start, {args.shards} shards", "ms",
            values("first_put_ms"), higher_is_better=False, goal="≤ 100 ms"),
        Row(f"first PullLogs after start, {args.shards} shards", "ms",
            values("first_pull_ms"), higher_is_better=False, goal="≤ 100 ms"),
    ]  # fmt: skip
    # a smoke run saves too (run_all --smoke points the results at a temporary directory)
    notes = [f"{args.groups} log groups of 16 access logs per shard, server restarted per run"]
    print(f"saved {save('idle_shards', 'Many idle shards', rows, notes)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
