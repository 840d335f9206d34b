"""PullLogs throughput of `loghub serve`: consumers read every shard from begin to end.

Starts a fresh server child on a temp data directory, ingests a fixed data set (lz4 PutLogs
of access logs from producer processes; that phase is timed too), then runs one consumer
process per shard, each pulling its shard from the begin cursor to the end with count=1000
over keep-alive HTTP and decompressing every reply as a real consumer would (``--parse``
also parses each LogGroupList). ``--passes`` full pulls per codec given to ``--compress``.

    .venv/bin/python benchmarks/pull.py [--logs 2000000] [--shards 4]
                                        [--compress lz4,none] [--passes 3] [--parse]
                                        [--data-dir /tmp]

The data just written is in the page cache, so this measures the server, not the disk.
Prints figures; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lz4.block

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    LOGSTORE,
    PROJECT,
    ServerChild,
    build_batches,
    cpu_seconds_of,
    create_logstore,
    describe_filesystem,
    fmt_int,
    machine_summary,
    make_data_dir,
    mb,
    percentile,
    remove_tree,
    run_producers,
)


@dataclass
class ConsumerResult:
    shard: int
    requests: int = 0
    groups: int = 0
    logs: int = 0  # counted by parsing with --parse, else groups * logs per group
    raw_bytes: int = 0  # LogGroupList bytes after decompression
    wire_bytes: int = 0  # response bodies as received
    latencies_s: list[float] | None = None
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    error: str = ""


def _get_json(conn: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> Any:
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"GET {path}: {response.status} {data[:200]!r}")
    return json.loads(data)


def _consumer(
    port: int, shard: int, codec: str, logs_per_group: int, parse: bool, start_at: float, out: Any
) -> None:
    result = ConsumerResult(shard, latencies_s=[])
    headers = {"Host": f"{PROJECT}.127.0.0.1", "x-log-apiversion": "0.6.0"}
    pull_headers = {**headers, "Accept-Encoding": codec}
    base = f"/logstores/{LOGSTORE}/shards/{shard}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    parser = None
    if parse:
        from loghub.wire.proto import LogGroupList

        parser = LogGroupList
    try:
        cursor = _get_json(conn, f"{base}?type=cursor&from=begin", headers)["cursor"]
        end = _get_json(conn, f"{base}?type=cursor&from=end", headers)["cursor"]
        time.sleep(max(0.0, start_at - time.monotonic()))
        cpu_start = time.process_time()
        started = time.monotonic()
        while cursor != end:
            sent = time.monotonic()
            conn.request("GET", f"{base}?type=log&cursor={cursor}&count=1000", headers=pull_headers)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"pull: {response.status} {body[:200]!r}")
            result.latencies_s.append(time.monotonic() - sent)  # type: ignore[union-attr]
            raw_size = int(response.getheader("x-log-bodyrawsize") or 0)
            compress_type = response.getheader("x-log-compresstype") or ""
            if compress_type == "lz4":
                raw = lz4.block.decompress(body, uncompressed_size=raw_size)
            elif compress_type == "":
                raw = body
            else:
                raise RuntimeError(f"unexpected x-log-compresstype {compress_type!r}")
            groups = int(response.getheader("x-log-count") or 0)
            if parser is not None:
                message = parser()
                message.ParseFromString(raw)
                result.logs += sum(len(group.Logs) for group in message.LogGroups)
            else:
                result.logs += groups * logs_per_group
            result.requests += 1
            result.groups += groups
            result.raw_bytes += len(raw)
            result.wire_bytes += len(body)
            next_cursor = response.getheader("x-log-cursor") or ""
            if groups == 0 or next_cursor == cursor:
                break
            cursor = next_cursor
        result.elapsed_s = time.monotonic() - started
        result.cpu_s = time.process_time() - cpu_start
    except Exception as exc:  # reported by the parent
        result.error = repr(exc)
    finally:
        conn.close()
        out.put(result)


def pull_pass(
    server: ServerChild, shards: int, codec: str, logs_per_group: int, parse: bool
) -> tuple[list[ConsumerResult], float, float]:
    """Runs one consumer per shard; returns their results, the wall time and server CPU."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start_at = time.monotonic() + 0.5
    processes = [
        ctx.Process(
            target=_consumer,
            args=(server.port, shard, codec, logs_per_group, parse, start_at, out),
            daemon=True,
        )
        for shard in range(shards)
    ]
    for process in processes:
        process.start()
    try:
        time.sleep(max(0.0, start_at - time.monotonic()))
        cpu_before = cpu_seconds_of(server.pid)
        results = [out.get(timeout=600) for _ in processes]
        wall_s = max(r.elapsed_s for r in results)
        cpu_after = cpu_seconds_of(server.pid)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGKILL)
                process.join(timeout=10)
    return sorted(results, key=lambda r: r.shard), wall_s, cpu_after - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", type=int, default=2_000_000, help="logs ingested (2,000,000)")
    parser.add_argument("--shards", type=int, default=4, help="shards, one consumer each (4)")
    parser.add_argument("--producers", type=int, default=4, help="producers for ingest (4)")
    parser.add_argument("--batch-logs", type=int, default=4096, help="logs per PutLogs (4096)")
    parser.add_argument(
        "--distinct-batches",
        type=int,
        default=16,
        help="distinct pre-built bodies, sent round robin (16)",
    )
    parser.add_argument(
        "--compress",
        default="lz4",
        help="comma-separated codecs, one pass each: lz4, zstd, deflate, none "
        "(default lz4; e.g. lz4,none)",
    )
    parser.add_argument(
        "--passes", type=int, default=3, help="full pulls per codec; the median is shown (3)"
    )
    parser.add_argument(
        "--parse",
        action="store_true",
        help="consumers also parse every LogGroupList (protobuf, upb)",
    )
    parser.add_argument(
        "--fsync",
        choices=("always", "interval"),
        default="always",
        help="the server's fsync policy while ingesting",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="parent of the temp data directory (default: the system temp dir)",
    )
    args = parser.parse_args()
    codecs = [c.strip().lower() for c in args.compress.split(",") if c.strip()]
    for codec in codecs:
        if codec not in ("lz4", "zstd", "deflate", "none"):
            parser.error(f"unknown codec {codec!r}")

    data_dir = make_data_dir(args.data_dir, "loghub-bench-pull-")
    server: ServerChild | None = None
    try:
        print(f"machine: {machine_summary()}")
        print(f"data dir: {data_dir} on {describe_filesystem(data_dir)}")
        batches = build_batches(args.distinct_batches, args.batch_logs)
        server = ServerChild(data_dir / "server", args.fsync)
        server.data_dir.mkdir()
        server.start()
        create_logstore(server.port, args.shards)

        requests_each = math.ceil(args.logs / args.batch_logs / args.producers)
        ingest = run_producers(server, batches, args.producers, requests_each=requests_each)
        logs = ingest.total("ok_logs")
        raw_bytes = ingest.total("ok_raw_bytes")
        errors = ingest.errors
        print(
            f"ingest phase: {fmt_int(logs)} logs ({mb(raw_bytes):.0f} MB raw, "
            f"{fmt_int(ingest.total('ok_requests'))} PutLogs of {args.batch_logs}) in "
            f"{ingest.wall_s:.1f} s: {fmt_int(logs / ingest.wall_s)} logs/s, "
            f"{mb(raw_bytes) / ingest.wall_s:.1f} MB/s raw, {args.producers} producers, "
            f"fsync={args.fsync}, server CPU {100 * ingest.server_cpu_s / ingest.wall_s:.0f}%"
            f" of a core"
        )
        if errors:
            print(f"  NON-200 ANSWERS while ingesting: {errors}")

        for codec in codecs:
            accept = "" if codec == "none" else codec
            passes = []
            for _ in range(args.passes):
                results, wall_s, server_cpu = pull_pass(
                    server, args.shards, accept, args.batch_logs, args.parse
                )
                failed = [r for r in results if r.error]
                for r in failed:
                    print(f"  CONSUMER OF SHARD {r.shard} FAILED: {r.error}")
                if not failed:
                    passes.append((wall_s, results, server_cpu))
            if not passes:
                continue
            passes.sort(key=lambda p: p[0])
            wall_s, results, server_cpu = passes[len(passes) // 2]  # the median pass
            p_logs = sum(r.logs for r in results)
            p_raw = sum(r.raw_bytes for r in results)
            p_wire = sum(r.wire_bytes for r in results)
            p_requests = sum(r.requests for r in results)
            latencies = [x for r in results for x in r.latencies_s or []]
            client_cpu = sum(r.cpu_s for r in results)
            print(
                f"pull ({codec}): {mb(p_raw) / wall_s:.1f} MB/s raw, "
                f"{mb(p_wire) / wall_s:.1f} MB/s on the wire, {fmt_int(p_logs / wall_s)} logs/s; "
                f"{args.shards} consumers (one per shard), count=1000"
                f"{', parsed' if args.parse else ', decompressed'}"
            )
            print(
                f"  {fmt_int(p_logs)} logs, {fmt_int(sum(r.groups for r in results))} groups, "
                f"{mb(p_raw):.0f} MB raw in {wall_s:.2f} s, {p_requests} PullLogs "
                f"(p50 {percentile(latencies, 0.5) * 1e3:.0f} ms, "
                f"p99 {percentile(latencies, 0.99) * 1e3:.0f} ms); "
                f"{(p_raw / p_requests / 1e6) if p_requests else 0:.1f} MB raw per reply"
            )
            print(
                f"  server CPU {server_cpu:.1f} s = {100 * server_cpu / wall_s:.0f}% of a core "
                f"({server_cpu / (p_raw / 1e9):.1f} CPU-s per GB raw); consumers' CPU "
                f"{client_cpu:.1f} s"
            )
            print(
                f"  {len(passes)} passes from begin to end, raw MB/s of each (sorted): "
                + ", ".join(f"{mb(p_raw) / p[0]:.0f}" for p in reversed(passes))
                + " (figures above: the median pass)"
            )
            if p_logs != logs:
                print(f"  NOTE: pulled {fmt_int(p_logs)} logs but {fmt_int(logs)} were ingested")
            print(
                f"  pull/ingest: {(p_logs / wall_s) / (logs / ingest.wall_s):.1f}x the "
                f"ingest rate of this run"
            )
    finally:
        if server is not None:
            server.stop()
        remove_tree(data_dir)


if __name__ == "__main__":
    main()
