"""Catch-up PullLogs throughput of `loghub serve` beside Redis Streams and NATS JetStream.

Starts a fresh server child on a temp data directory, ingests a fixed data set (lz4 PutLogs
of access logs from producer processes; that phase is timed too), then runs one consumer
process per shard, each pulling its shard from the begin cursor to the end with count=1000
over keep-alive HTTP and decompressing every reply as a real consumer would (``--parse``
also parses each LogGroupList). ``--passes`` full pulls per codec given to ``--compress``.

In the same run the very same logs (JSON entries, one stream or subject per shard, written
by as many producers) are read back from Redis Streams (one reader process per stream,
``XRANGE`` from the last ID seen, and ``XREADGROUP`` of a new group, 1000 entries a command)
and from NATS JetStream with file storage (a pull consumer per subject fetching 1000 messages
a request: with nats-py's ``fetch``, over at most ``--nats-py-logs`` messages since that
client is slow, and with a lean client of the protocol). Ratios are of median passes.

    .venv/bin/python benchmarks/pull.py [--logs 2000000] [--shards 4]
                                        [--compress lz4,none] [--passes 3] [--parse]
                                        [--peers redis,nats,nats-wire] [--smoke]

What each reader does with a reply, so that the clients cost about the same per log and
neither is the limit: a LogHub reader decompresses it (lz4) and counts groups from the
headers, without parsing the protobuf (``--parse`` adds that); a Redis ``XRANGE`` reader
reads the RESP reply off its socket and counts the entries with ``bytes.count``, without
decoding them; ``XREADGROUP`` goes through redis-py with hiredis, which builds Python objects
for every entry (so it is the slower of the two Redis figures, partly on the client).

The data just written is in the page cache, so this measures the servers, not the disk.
Prints figures and saves them to benchmarks/results/pull.json; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import multiprocessing as mp
import os
import signal
import statistics
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
    batch_records,
    build_batches,
    cpu_seconds_of,
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
    ReadPass,
    RedisServer,
    nats_ingest,
    nats_read,
    plain_batches,
    redis_batches,
    redis_ingest,
    redis_read,
    redis_stream_key,
)
from _results import Reference, Row, save  # noqa: E402

PEER_READS = {
    "xrange": "Redis Streams XRANGE, COUNT 1000",
    "xreadgroup": "Redis Streams XREADGROUP, COUNT 1000",
    "nats": "NATS JetStream pull consumer (nats-py fetch 1000)",
    "nats-wire": "NATS JetStream pull consumer (protocol client, batch 1000)",
}


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
    parser.add_argument(
        "--peers",
        default="redis,nats,nats-wire",
        help="systems read beside LogHub; empty for none (redis,nats,nats-wire)",
    )
    parser.add_argument(
        "--nats-py-logs",
        type=int,
        default=200_000,
        help="messages read by nats-py's fetch a pass, from the start (200,000)",
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.logs, args.shards, args.producers, args.batch_logs = 4096, 2, 2, 256
        args.distinct_batches, args.passes, args.nats_py_logs = 2, 1, 1000
    codecs = [c.strip().lower() for c in args.compress.split(",") if c.strip()]
    for codec in codecs:
        if codec not in ("lz4", "zstd", "deflate", "none"):
            parser.error(f"unknown codec {codec!r}")

    data_dir = make_data_dir(args.data_dir, "loghub-bench-pull-")
    server: ServerChild | None = None
    rows: list[Row] = []
    notes = [f"load at start: {load_average()}"]
    loghub_rates: dict[str, list[float]] = {}
    try:
        print(f"machine: {machine_summary()}; {load_average()}")
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
            loghub_rates[codec] = [sum(r.logs for r in p[1]) / p[0] for p in passes]
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
        server.stop()
        notes.append(
            f"{fmt_int(logs)} logs of {args.batch_logs} a request ingested by {args.producers} "
            f"producers into {args.shards} shards; one reader process per shard (peers: per "
            f"stream or subject); {args.passes} passes; LogHub readers decompress every reply"
            f"{' and parse it' if args.parse else ''}"
        )
        peers = [p.strip() for p in args.peers.split(",") if p.strip()]
        peer_rates = read_peers(args, batches, requests_each, peers, data_dir, notes)
        case = f"{fmt_int(logs)} logs, {args.shards} readers"
        goals = {"xrange": "≥ 1.5×", "xreadgroup": "≥ 1.5×"}
        for codec, rates in loghub_rates.items():
            label = f"LogHub catch-up pull ({codec}), {case}"
            for name, reference in peer_rates.items():
                rows.append(
                    Row(
                        label,
                        "logs/s",
                        rates,
                        reference=Reference(PEER_READS[name], reference),
                        goal=goals.get(name, ""),
                    )  # fmt: skip
                )
                ratio = statistics.median(rates) / (statistics.median(reference) or math.nan)
                print(f"LogHub ({codec}) / {PEER_READS[name]}: {ratio:.2f}x")
            if not peer_rates:
                rows.append(Row(label, "logs/s", rates))
    finally:
        if server is not None:
            server.stop()
        remove_tree(data_dir)
    notes.append(f"load at end: {load_average()}")
    path = save("pull", "Catch-up pull beside Redis Streams and NATS JetStream", rows, notes)
    print(f"saved {path}")


def show_reads(name: str, reads: list[ReadPass], expected: int) -> list[float]:
    """Prints the passes of one reader kind; returns their entries/s (failed passes left out)."""
    rates = []
    for read in reads:
        if read.errors:
            print(f"  {PEER_READS[name]}: A READER FAILED: {read.errors}")
        elif read.entries < expected:
            print(f"  {PEER_READS[name]}: READ {read.entries} OF {expected}")
        else:
            rates.append(read.entries / read.wall_s)
    if rates:
        ordered = sorted(rates)
        print(
            f"  {PEER_READS[name]}: {fmt_int(statistics.median(rates))} entries/s "
            f"(passes {', '.join(fmt_int(r) for r in ordered)}), server CPU "
            f"{statistics.median(r.server_cpu_s / r.wall_s for r in reads if r.wall_s):.2f} cores"
        )
    return rates


def read_peers(args: argparse.Namespace, batches: list, requests_each: int, peers: list[str],
               data_dir: Path, notes: list[str]) -> dict[str, list[float]]:  # fmt: skip
    """Writes the same logs into each peer (untimed but shown), then reads them back."""
    rates: dict[str, list[float]] = {}
    if not peers:
        return rates
    entries = [
        [log_json(t, record) for t, record in records]
        for records in batch_records(len(batches), args.batch_logs)
    ]
    if "redis" in peers:
        by_stream = [
            redis_batches(entries, redis_stream_key(i, args.shards)) for i in range(args.shards)
        ]
        with RedisServer(durable=False, data_parent=str(data_dir)) as redis:
            load = redis_ingest(redis, by_stream, args.producers, batches_each=requests_each)
            print(
                f"Redis (in memory): {fmt_int(load.logs)} entries written in "
                f"{load.window_s:.1f} s ({fmt_int(load.logs / load.window_s)}/s) "
                f"{load.errors or ''}"
            )
            for mode in ("xrange", "xreadgroup"):
                reads = [redis_read(redis, args.shards, mode, p) for p in range(args.passes)]
                found = show_reads(mode, reads, load.logs)
                if found:
                    rates[mode] = found
    nats_peers = [p for p in peers if p.startswith("nats")]
    if nats_peers:
        with NatsServer(str(data_dir)) as nats:
            load = nats_ingest(
                nats, plain_batches(entries), args.producers, args.shards,
                batches_each=requests_each, client="wire",
            )  # fmt: skip
            per_subject = [0] * args.shards
            for index, worker in enumerate(load.workers):
                per_subject[index % args.shards] += worker.logs
            print(
                f"NATS JetStream (file storage): {fmt_int(load.logs)} messages written in "
                f"{load.window_s:.1f} s ({fmt_int(load.logs / load.window_s)}/s) "
                f"{load.errors or ''}"
            )
            for name in nats_peers:
                client = "nats-py" if name == "nats" else "wire"
                expected = per_subject
                if client == "nats-py":
                    cap = max(1, args.nats_py_logs // args.shards)
                    expected = [min(cap, count) for count in per_subject]
                    notes.append(f"nats-py fetch: the first {fmt_int(sum(expected))} messages")
                reads = [nats_read(nats, expected, p, client=client) for p in range(args.passes)]
                found = show_reads(name, reads, sum(expected))
                if found:
                    rates[name] = found
    return rates


if __name__ == "__main__":
    main()
