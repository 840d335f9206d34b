"""Durable ingest throughput of `loghub serve` beside Redis Streams, NATS JetStream and the disk.

Starts a fresh server child on a temp data directory, creates a logstore, pre-builds a few
distinct compressed LogGroups (realistic web access logs, about 200 B each) and sends them
round robin from producer processes over keep-alive HTTP. Only 200 answers inside the measured
window count; every other answer is printed. In the same run, with the very same logs (each a
JSON entry), the same batch sizes and as many producer processes: Redis Streams in memory and
with ``appendfsync always`` (pipelined ``XADD``, one pipeline per batch), NATS JetStream with
file storage (``nats-py``, a batch published with ``publish_async``, then all its acks
awaited; and, since that client rather than JetStream is then the limit, also a lean
pipelined client of the NATS protocol that sends a batch's publishes in one write and then
reads their acks), and the disk's own sequential write speed with an fdatasync per
batch-sized chunk, in the same directory. Every system is measured ``--runs`` times,
interleaved, so that they share the machine's moods; the figures are min/median/max and
ratios of medians.

    .venv/bin/python benchmarks/ingest.py [--runs 3] [--seconds 5] [--batch-logs 4096,512]
                                          [--peers redis,redis-aof,nats,nats-wire] [--smoke]

Prints figures and saves them to benchmarks/results/ingest.json; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    LOGSTORE,
    ServerChild,
    batch_records,
    build_batches,
    create_logstore,
    describe_filesystem,
    fmt_int,
    load_average,
    log_json,
    machine_summary,
    make_data_dir,
    mb,
    percentile,
    remove_tree,
    run_producers,
)
from _peers import (  # noqa: E402
    NatsServer,
    PeerRun,
    RedisServer,
    nats_ingest,
    plain_batches,
    redis_batches,
    redis_ingest,
    redis_stream_key,
)
from _results import Reference, Row, save  # noqa: E402

PEERS = {
    "redis": "Redis Streams XADD, in memory",
    "redis-aof": "Redis Streams XADD, AOF appendfsync always",
    "nats": "NATS JetStream, file storage (nats-py publish_async)",
    "nats-wire": "NATS JetStream, file storage (pipelined protocol client)",
}


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


@dataclass
class Series:
    """The runs of one system at one batch size."""

    logs_per_s: list[float] = field(default_factory=list)
    mb_per_s: list[float] = field(default_factory=list)
    server_cores: list[float] = field(default_factory=list)  # server CPU / wall

    def add(self, logs: float, payload_bytes: float, window_s: float, cpu_s: float) -> None:
        self.logs_per_s.append(logs / window_s)
        self.mb_per_s.append(mb(payload_bytes) / window_s)
        self.server_cores.append(cpu_s / window_s)


def spread(values: list[float], digits: int = 0) -> str:
    """``median (min-max)`` of the runs."""
    if not values:
        return "-"
    shown = [f"{v:,.{digits}f}" for v in (statistics.median(values), min(values), max(values))]
    return f"{shown[0]} ({shown[1]}-{shown[2]})"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def measure_loghub(args: argparse.Namespace, server: ServerChild, batches: list, series: Series
                   ) -> None:  # fmt: skip
    if args.target == "lb":
        paths: tuple[str, ...] = (f"/logstores/{LOGSTORE}/shards/lb",)
    else:
        paths = tuple(f"/logstores/{LOGSTORE}/shards/{i}" for i in range(args.shards))
    run = run_producers(
        server, batches, args.producers, paths=paths, warmup_s=args.warmup, seconds=args.seconds
    )
    window = run.window_s
    logs, raw_bytes = run.total("ok_logs"), run.total("ok_raw_bytes")
    series.add(logs, raw_bytes, window, run.server_cpu_s)
    latencies = run.latencies_s
    print(
        f"  LogHub ({args.fsync}): {fmt_int(logs / window)} logs/s, "
        f"{mb(raw_bytes) / window:.1f} MB/s raw (lz4 body "
        f"{mb(run.total('ok_body_bytes')) / window:.1f} MB/s), "
        f"{run.total('ok_requests') / window:.1f} req/s; PutLogs p50 "
        f"{percentile(latencies, 0.5) * 1e3:.1f} ms, "
        f"p99 {percentile(latencies, 0.99) * 1e3:.1f} ms;"
        f" server CPU {run.server_cpu_s / window:.2f} cores "
        f"(system {run.server_system_s / window:.2f})"
    )
    report_errors(run.errors, run.total("total_requests"))


def report_errors(errors: dict[str, int], sent: int | None = None) -> None:
    if errors:
        print(f"    ERRORS: {sum(errors.values())}")
        for key, value in sorted(errors.items(), key=lambda kv: -kv[1]):
            print(f"      {value} x {key}")
    elif sent is not None and sent == 0:
        print("    NOTHING SENT")


def show_peer(name: str, run: PeerRun, series: Series) -> None:
    series.add(run.logs, run.payload_bytes, run.window_s, run.server_cpu_s)
    client_cpu = sum(w.cpu_s for w in run.workers)
    print(
        f"  {PEERS[name]}: {fmt_int(run.logs / run.window_s)} logs/s, "
        f"{mb(run.payload_bytes) / run.window_s:.1f} MB/s of JSON entries; server CPU "
        f"{run.server_cpu_s / run.window_s:.2f} cores, clients' CPU {client_cpu:.1f} s"
    )
    report_errors(run.errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producers", type=int, default=4, help="producer processes (4)")
    parser.add_argument("--shards", type=int, default=4, help="shards (peers: streams) (4)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds a run (5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds a run (1)")
    parser.add_argument("--runs", type=int, default=3, help="runs of every system (3)")
    parser.add_argument(
        "--batch-logs", default="4096,512", help="logs per request, comma-separated (4096,512)"
    )
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
        "--peers",
        default=",".join(PEERS),
        help=f"systems measured beside LogHub, comma-separated; empty for none ({','.join(PEERS)})",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="parent of the temp data directories (default: the system temp dir)",
    )
    parser.add_argument(
        "--disk-mb",
        type=int,
        default=256,
        help="MB written by each disk probe; 0 skips the probe (256)",
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.warmup, args.runs, args.batch_logs = 0.5, 0.2, 1, "256"
        args.distinct_batches, args.disk_mb, args.producers, args.shards = 2, 4, 2, 2
    sizes = [int(size) for size in args.batch_logs.split(",") if size.strip()]
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for peer in peers:
        if peer not in PEERS:
            parser.error(f"unknown peer {peer!r} (known: {', '.join(PEERS)})")

    print(f"machine: {machine_summary()}; {load_average()}")
    rows: list[Row] = []
    notes = [
        f"{args.producers} producer processes a system, {args.shards} shards (peers: as many "
        f"streams or subjects), {args.runs} runs of {args.seconds:g} s after {args.warmup:g} s "
        f"of warm-up, interleaved; LogHub fsync={args.fsync}, PutLogs to {args.target}",
        "LogHub MB/s: raw LogGroup bytes (before lz4); peers' MB/s: the JSON entries",
        "LogHub counts the requests sent and acknowledged inside the window; the peers, the "
        "batches acknowledged inside it (nats-py takes seconds a batch of 4096)",
        "NATS 2.9 file storage acknowledges before its data is synced (it syncs every 2 min); "
        "Redis `appendfsync always` and LogHub acknowledge after fsync",
        f"load at start: {load_average()}",
    ]
    for size in sizes:
        rows += measure_size(args, size, peers, notes)
    notes.append(f"load at end: {load_average()}")
    path = save("ingest", "Durable ingest beside Redis Streams, NATS JetStream and the disk",
                rows, notes)  # fmt: skip
    print(f"saved {path}")


def measure_size(args: argparse.Namespace, size: int, peers: list[str], notes: list[str]
                 ) -> list[Row]:  # fmt: skip
    started = time.perf_counter()
    batches = build_batches(args.distinct_batches, size)
    entries = [
        [log_json(t, record) for t, record in records]
        for records in batch_records(args.distinct_batches, size)
    ]
    raw_avg = sum(b.raw_size for b in batches) / len(batches)
    body_avg = sum(len(b.body) for b in batches) / len(batches)
    json_avg = sum(map(len, entries[0])) / len(entries[0])
    print(
        f"\n{size} logs a request: {len(batches)} distinct LogGroups, {raw_avg / size:.0f} B/log "
        f"raw, lz4 ratio {raw_avg / body_avg:.2f}; JSON entries {json_avg:.0f} B/log; built in "
        f"{time.perf_counter() - started:.1f} s"
    )
    redis_by_stream = [
        redis_batches(entries, redis_stream_key(i, args.shards)) for i in range(args.shards)
    ]
    nats_batches = plain_batches(entries)
    data_dir = make_data_dir(args.data_dir, "loghub-bench-ingest-")
    print(f"data dir: {data_dir} on {describe_filesystem(data_dir)}")
    results = {name: Series() for name in ["loghub", *peers]}
    disk: list[float] = []
    server = ServerChild(data_dir / "server", args.fsync)
    try:
        server.data_dir.mkdir()
        server.start()
        create_logstore(server.port, args.shards)
        for run in range(args.runs):
            print(f" run {run + 1} of {args.runs} ({load_average()})")
            measure_loghub(args, server, batches, results["loghub"])
            for name in peers:
                window = {"warmup_s": args.warmup, "seconds": args.seconds}
                if name.startswith("nats"):
                    client = "nats-py" if name == "nats" else "wire"
                    with NatsServer(str(data_dir)) as nats:
                        peer_run = nats_ingest(
                            nats, nats_batches, args.producers, args.shards, client=client,
                            **window,
                        )  # fmt: skip
                else:
                    with RedisServer(name == "redis-aof", str(data_dir)) as redis:
                        peer_run = redis_ingest(redis, redis_by_stream, args.producers, **window)
                show_peer(name, peer_run, results[name])
            if args.disk_mb > 0:
                each, end = disk_write_speed(data_dir, args.disk_mb * 1_000_000, int(raw_avg))
                disk.append(each)
                print(
                    f"  disk: sequential write of {args.disk_mb} MB with fdatasync per "
                    f"{raw_avg / 1024:.0f} KiB chunk: {each:.1f} MB/s; one fdatasync at the "
                    f"end: {end:.1f} MB/s"
                )
    finally:
        server.stop()
        remove_tree(data_dir)

    loghub = results["loghub"]
    print(f" {size} logs a request, median (min-max) of {args.runs} runs:")
    print(
        f"  LogHub: {spread(loghub.logs_per_s)} logs/s, {spread(loghub.mb_per_s, 1)} MB/s raw, "
        f"server {spread(loghub.server_cores, 2)} cores"
    )
    case = f"{size} logs/request, {args.producers} producers"
    rows = [
        Row(f"LogHub durable ingest, {case}", "logs/s", loghub.logs_per_s,
            goal="≥ 1,000,000 logs/s")
    ]  # fmt: skip
    for name in peers:
        peer = results[name]
        ratio = median(loghub.logs_per_s) / (median(peer.logs_per_s) or float("nan"))
        print(
            f"  {PEERS[name]}: {spread(peer.logs_per_s)} logs/s, {spread(peer.mb_per_s, 1)} MB/s,"
            f" server {spread(peer.server_cores, 2)} cores; LogHub/peer {ratio:.2f}x"
        )
        goal = {
            "redis": "≥ 2× (goal 3×)",
            "redis-aof": "",
            "nats": "≥ 1×",
            "nats-wire": "≥ 1×",
        }[name]
        rows.append(
            Row(
                f"LogHub durable ingest, {case}",
                "logs/s",
                loghub.logs_per_s,
                reference=Reference(PEERS[name], peer.logs_per_s),
                goal=goal,
                extra={
                    "reference_mb_per_s": peer.mb_per_s,
                    "reference_server_cores": peer.server_cores,
                },
            )
        )
    rows.append(
        Row(
            f"LogHub durable ingest, {case}",
            "MB/s",
            loghub.mb_per_s,
            reference=(
                Reference(f"disk: sequential write, fdatasync per {raw_avg / 1024:.0f} KiB", disk)
                if disk
                else None
            ),
            extra={"server_cores": loghub.server_cores, "logs_per_s": loghub.logs_per_s},
        )
    )
    if disk:
        print(
            f"  disk with fdatasync per batch: {spread(disk, 1)} MB/s; LogHub raw MB/s / disk "
            f"{median(loghub.mb_per_s) / (median(disk) or float('nan')):.2f}x"
        )
    return rows


if __name__ == "__main__":
    main()
