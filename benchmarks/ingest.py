"""Durable ingest throughput of `loghub serve`: PutLogs of lz4 batches from several producers.

Starts a fresh server child on a temp data directory, creates a logstore, pre-builds a few
distinct compressed LogGroups (realistic web access logs) and sends them round robin from
producer processes over keep-alive HTTP. Only 200 answers inside the measured window count;
every other answer is printed. Also measures the disk's own sequential write speed with
fdatasync in the same directory, as the ceiling the server is up against.

    .venv/bin/python benchmarks/ingest.py [--producers 4] [--shards 4] [--seconds 20]
                                          [--fsync always|interval] [--data-dir /tmp]

Prints figures; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    LOGSTORE,
    ServerChild,
    build_batches,
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


def disk_write_speed(directory: Path, total_bytes: int, chunk_bytes: int) -> tuple[float, float]:
    """MB/s of sequential writes of ``chunk_bytes`` chunks: with an fdatasync after each
    chunk, and with a single fdatasync at the end (both include that last sync)."""
    chunk = os.urandom(chunk_bytes)
    chunks = max(1, total_bytes // chunk_bytes)
    speeds = []
    for sync_each in (True, False):
        path = directory / f"disk-probe-{'each' if sync_each else 'end'}.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            started = time.perf_counter()
            for _ in range(chunks):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
                if sync_each:
                    os.fdatasync(fd)
            os.fdatasync(fd)
            elapsed = time.perf_counter() - started
        finally:
            os.close(fd)
            path.unlink()
        speeds.append(mb(chunks * chunk_bytes) / elapsed)
    return speeds[0], speeds[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producers", type=int, default=4, help="producer processes (4)")
    parser.add_argument("--shards", type=int, default=4, help="shards of the logstore (4)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds (20)")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds (3)")
    parser.add_argument("--batch-logs", type=int, default=4096, help="logs per PutLogs (4096)")
    parser.add_argument(
        "--distinct-batches",
        type=int,
        default=16,
        help="distinct pre-built bodies, sent round robin (16)",
    )
    parser.add_argument(
        "--fsync",
        choices=("always", "interval"),
        default="always",
        help="the server's fsync policy (always = group commit)",
    )
    parser.add_argument(
        "--target",
        choices=("lb", "direct"),
        default="lb",
        help="PutLogs to /shards/lb, or producer i to shard i %% shards",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="parent of the temp data directory (default: the system temp dir)",
    )
    parser.add_argument(
        "--disk-mb",
        type=int,
        default=512,
        help="MB written by each disk probe; 0 skips the probe (512)",
    )
    args = parser.parse_args()

    data_dir = make_data_dir(args.data_dir, "loghub-bench-ingest-")
    server: ServerChild | None = None
    try:
        print(f"machine: {machine_summary()}")
        print(f"data dir: {data_dir} on {describe_filesystem(data_dir)}")
        started = time.perf_counter()
        batches = build_batches(args.distinct_batches, args.batch_logs)
        raw_avg = sum(b.raw_size for b in batches) / len(batches)
        body_avg = sum(len(b.body) for b in batches) / len(batches)
        print(
            f"batches: {len(batches)} distinct LogGroups of {args.batch_logs} access logs, "
            f"{raw_avg / 1024:.0f} KiB raw ({raw_avg / args.batch_logs:.0f} B/log), "
            f"{body_avg / 1024:.0f} KiB lz4 (ratio {raw_avg / body_avg:.2f}), "
            f"built in {time.perf_counter() - started:.1f} s"
        )

        server = ServerChild(data_dir / "server", args.fsync)
        server.data_dir.mkdir()
        server.start()
        create_logstore(server.port, args.shards)
        if args.target == "lb":
            paths: tuple[str, ...] = (f"/logstores/{LOGSTORE}/shards/lb",)
        else:
            paths = tuple(f"/logstores/{LOGSTORE}/shards/{i}" for i in range(args.shards))
        run = run_producers(
            server, batches, args.producers, paths=paths, warmup_s=args.warmup,
            seconds=args.seconds,
        )  # fmt: skip
        window = run.window_s
        logs = run.total("ok_logs")
        raw_bytes = run.total("ok_raw_bytes")
        body_bytes = run.total("ok_body_bytes")
        requests = run.total("ok_requests")
        latencies = run.latencies_s
        label = "durable ingest" if args.fsync == "always" else "ingest (acked before fsync)"
        print(
            f"{label}: {fmt_int(logs / window)} logs/s, {mb(raw_bytes) / window:.1f} MB/s "
            f"raw (lz4 body {mb(body_bytes) / window:.1f} MB/s), {requests / window:.1f} req/s, "
            f"{args.producers} producers, {args.shards} shards, fsync={args.fsync}, "
            f"target={args.target}"
        )
        print(
            f"  window {window:.0f} s after {args.warmup:.0f} s warm-up: {fmt_int(requests)} "
            f"PutLogs acknowledged (200), {fmt_int(logs)} logs, {mb(raw_bytes) / 1e3:.2f} GB raw"
        )
        if latencies:
            print(
                f"  latency per PutLogs: p50 {percentile(latencies, 0.5) * 1e3:.1f} ms, "
                f"p99 {percentile(latencies, 0.99) * 1e3:.1f} ms, "
                f"max {max(latencies) * 1e3:.1f} ms"
            )
        server_cpu = run.server_cpu_s
        per_gb = server_cpu / (raw_bytes / 1e9) if raw_bytes else float("nan")
        print(
            f"  server CPU: {server_cpu:.1f} s in {window:.0f} s = {100 * server_cpu / window:.0f}%"
            f" of a core; {per_gb:.1f} CPU-s per GB raw; "
            f"{1e6 * server_cpu / logs if logs else float('nan'):.2f} CPU-us per log "
            f"(user {server_cpu - run.server_system_s:.1f} s, system {run.server_system_s:.1f} s)"
        )
        producer_cpu = sum(p.cpu_s for p in run.producers)
        print(
            f"  producers' CPU: {producer_cpu:.1f} s in total (warm-up included), "
            f"{os.cpu_count()} cores on this machine for server + producers"
        )
        errors = run.errors
        if errors:
            print(f"  NON-200 ANSWERS: {sum(errors.values())}")
            for key, value in sorted(errors.items(), key=lambda kv: -kv[1]):
                print(f"    {value} x {key}")
        else:
            print(f"  non-200 answers: none (of {fmt_int(run.total('total_requests'))} sent)")
        server.stop()

        if args.disk_mb > 0:
            for label, chunk in (("raw batch", int(raw_avg)), ("lz4 body", int(body_avg))):
                each, end = disk_write_speed(data_dir, args.disk_mb * 1_000_000, chunk)
                print(
                    f"disk: sequential write of {args.disk_mb} MB with fdatasync per "
                    f"{chunk / 1024:.0f} KiB chunk ({label} size): {each:.1f} MB/s; "
                    f"one fdatasync at end: {end:.1f} MB/s"
                )
    finally:
        if server is not None:
            server.stop()
        remove_tree(data_dir)


if __name__ == "__main__":
    main()
