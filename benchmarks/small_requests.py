"""Many small requests: PutLogs of 16 and 128 logs over 8 and 32 connections, beside Redis.

Most log traffic comes in small batches from many clients (loggers, agents, producers with a
short linger). Each case sends lz4 LogGroups of ``--logs`` access logs (~200 B each) from one
process per connection, persistent connections, one request in flight per connection, to
`loghub serve` (fsync always) and, in the same run with the same logs and connections, to
Redis Streams: a pipeline of as many ``XADD`` (one JSON entry per log) per round trip, with
``appendfsync always`` (an fsync before every reply: LogHub's durability) and in memory.
Then a catch-up pull of what the 16-log × 32-connection case wrote: LogHub PullLogs
(count=1000 groups, lz4, decompressed by the reader) against Redis ``XRANGE`` of the same
entries (the same number of logs per call), one reader process per shard / stream, both
sides ``--pull-passes`` times in turn. Readers connect first and start together; each times
itself from the common start, so process start-up is not in the figure (with a few seconds'
data, it once made the ratio swing from 0.5x to 3x between runs).

Clients write pre-built bytes to raw sockets and read the replies with as little Python as
they can, on both sides, so that on a small machine the clients take as little CPU from
the servers as possible. Prints logs/s, PutLogs/s, server CPU per request (utime + stime of
the server's PID from /proc over the measured window), fsyncs/s (the server's
``loghub_fsync_seconds_count``), the cores the whole machine kept busy and its CPU per request
(every process: the clients share the cores with the server) and ratios; saves
``results/small_requests.json``.

The 16 x 32 case runs a second time on two independent `loghub serve` processes, each with
half the shards and half the connections: the most that several server processes on one
port could do here (nothing passed between them, no shared metadata), which is how the
second core was weighed (docs/decisions.md, "Both cores").

    .venv/bin/python benchmarks/small_requests.py [--seconds 5] [--runs 1] [--shards 4]
                                                  [--pull-passes 3] [--pull-case-only]
                                                  [--smoke] [--data-dir /tmp]

Prints figures; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import signal
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lz4.block

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    PROJECT,
    Batch,
    IngestRun,
    ServerChild,
    build_batches,
    cpu_seconds_of,
    create_logstore,
    describe_filesystem,
    fmt_int,
    machine_summary,
    make_data_dir,
    percentile,
    remove_tree,
    request,
    run_producers,
)
from _peers import RedisServer, read_resp_xrange  # noqa: E402
from _results import Reference, Row, save  # noqa: E402

from loghub.wire.logs import parse_log_group  # noqa: E402

_CASES = ((16, 8), (16, 32), (128, 8), (128, 32))
_PULL_CASE = (16, 32)
PROCESSES = 2  # server processes of the several-processes case (one per core here)


def _logstore_name(logs: int, connections: int) -> str:
    return f"small_{logs}x{connections}"


# --- LogHub over a raw socket -------------------------------------------------------------


def _recv_http_response(
    sock: socket.socket, buffer: bytearray
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One HTTP/1.1 response with a Content-Length (what LogHub sends) from ``sock``."""
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            break
        chunk = sock.recv(262144)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buffer += chunk
    head = bytes(buffer[:end]).split(b"\r\n")
    status = int(head[0].split(b" ", 2)[1])
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get(b"content-length", b"0"))
    body_start = end + 4
    while len(buffer) < body_start + length:
        chunk = sock.recv(max(262144, body_start + length - len(buffer)))
        if not chunk:
            raise ConnectionError("server closed the connection")
        buffer += chunk
    body = bytes(buffer[body_start : body_start + length])
    del buffer[: body_start + length]
    return status, headers, body


class RawPutSender:
    """PutLogs as pre-built request bytes on one keep-alive socket."""

    def __init__(self, port: int, batches: list[Batch], path: str) -> None:
        self.port = port
        self.requests = [
            (
                f"POST {path} HTTP/1.1\r\nHost: {PROJECT}.127.0.0.1\r\n"
                "Content-Type: application/x-protobuf\r\nx-log-apiversion: 0.6.0\r\n"
                f"x-log-compresstype: lz4\r\nx-log-bodyrawsize: {batch.raw_size}\r\n"
                f"Content-Length: {len(batch.body)}\r\n\r\n"
            ).encode()
            + batch.body
            for batch in batches
        ]
        self.sock: socket.socket | None = None
        self.buffer = bytearray()

    def connect(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()

    def send(self, index: int) -> str | None:
        assert self.sock is not None
        self.sock.sendall(self.requests[index])
        status, _, body = _recv_http_response(self.sock, self.buffer)
        return None if status == 200 else f"{status}: {body[:200].decode(errors='replace')}"

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


# --- Redis over a raw socket --------------------------------------------------------------


def _resp_command(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


def log_entries(batch: Batch) -> list[bytes]:
    """The logs of a batch as JSON objects (time, the LogGroup's topic and source, every
    key), what an application would XADD."""
    group = parse_log_group(lz4.block.decompress(batch.body, uncompressed_size=batch.raw_size))
    entries = []
    for log in group.Logs:
        record: dict[str, Any] = {"__time__": log.Time, "__topic__": group.Topic}
        record["__source__"] = group.Source
        record.update({content.Key: content.Value for content in log.Contents})
        entries.append(json.dumps(record, separators=(",", ":")).encode())
    return entries


class RedisXaddSender:
    """A pipeline of one XADD per log of a batch, as pre-built RESP, on one socket; the
    stream is named by the path given (one stream per LogHub shard)."""

    def __init__(self, port: int, batches: list[Batch], path: str) -> None:
        self.port = port
        stream = path.encode()
        self.pipelines = [
            (
                b"".join(_resp_command(b"XADD", stream, b"*", b"log", e) for e in log_entries(b)),
                b.logs,
            )
            for b in batches
        ]
        self.sock: socket.socket | None = None

    def connect(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, index: int) -> str | None:
        assert self.sock is not None
        data, replies = self.pipelines[index]
        self.sock.sendall(data)
        # every reply is a bulk string ("$15\r\n<id>\r\n": two line ends) or an error (one)
        received = bytearray()
        while received.count(b"\r\n") < 2 * replies:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            received += chunk
            if received.startswith(b"-") or b"\r\n-" in received:
                raise ConnectionError(f"redis error: {bytes(received[:200])!r}")
        return None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


# --- catch-up pull ------------------------------------------------------------------------


@dataclass
class PullResult:
    logs: int = 0
    calls: int = 0
    latencies_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0  # from the common start to this reader's last reply
    error: str = ""


def _loghub_reader(
    port: int, logstore: str, shard: int, logs_per_group: int, start_at: float, out: Any
) -> None:
    result = PullResult()
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    buffer = bytearray()
    host = f"Host: {PROJECT}.127.0.0.1\r\nx-log-apiversion: 0.6.0\r\n"
    base = f"/logstores/{logstore}/shards/{shard}"
    try:
        sock.sendall(f"GET {base}?type=cursor&from=begin HTTP/1.1\r\n{host}\r\n".encode())
        _, _, body = _recv_http_response(sock, buffer)
        cursor = json.loads(body)["cursor"]
        sock.sendall(f"GET {base}?type=cursor&from=end HTTP/1.1\r\n{host}\r\n".encode())
        _, _, body = _recv_http_response(sock, buffer)
        end = json.loads(body)["cursor"]
        time.sleep(max(0.0, start_at - time.monotonic()))
        while cursor != end:
            started = time.monotonic()
            sock.sendall(
                f"GET {base}?type=log&cursor={cursor}&count=1000 HTTP/1.1\r\n{host}"
                "Accept-Encoding: lz4\r\n\r\n".encode()
            )
            status, headers, body = _recv_http_response(sock, buffer)
            if status != 200:
                raise RuntimeError(f"pull answered {status}: {body[:200]!r}")
            raw_size = int(headers[b"x-log-bodyrawsize"])
            if raw_size:
                lz4.block.decompress(body, uncompressed_size=raw_size)
            result.logs += int(headers[b"x-log-count"]) * logs_per_group
            result.calls += 1
            result.latencies_s.append(time.monotonic() - started)
            cursor = headers[b"x-log-cursor"].decode()
        result.elapsed_s = time.monotonic() - start_at
    except Exception as exc:  # reported by the parent
        result.error = repr(exc)
    finally:
        sock.close()
        out.put(result)


def _redis_reader(
    port: int, stream: str, logs_per_call: int, logs_max: int, start_at: float, out: Any
) -> None:
    """XRANGE of ``stream`` from its start, ``logs_per_call`` entries a call, until
    ``logs_max`` are read (as many as LogHub's reader of the same shard had) or the end."""
    result = PullResult()
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    buffer = bytearray()
    start = b"-"
    logs_per_call = min(logs_per_call, logs_max)
    try:
        time.sleep(max(0.0, start_at - time.monotonic()))
        while True:
            started = time.monotonic()
            sock.sendall(
                _resp_command(
                    b"XRANGE", stream.encode(), start, b"+", b"COUNT", b"%d" % logs_per_call
                )
            )
            count, last_id = read_resp_xrange(sock, buffer)
            if count == 0:
                break
            result.logs += count
            logs_per_call = min(logs_per_call, logs_max - result.logs)
            if logs_per_call <= 0:
                break
            result.calls += 1
            result.latencies_s.append(time.monotonic() - started)
            start = b"(" + last_id
        result.elapsed_s = time.monotonic() - start_at
    except Exception as exc:
        result.error = repr(exc)
    finally:
        sock.close()
        out.put(result)


def _run_readers(pid: int, targets: list[tuple[Any, tuple[Any, ...]]]) -> tuple[float, float, int]:
    """Runs one process per (function, args); returns (logs/s, server CPU-s, logs). The
    readers connect (and LogHub's fetch their cursors) first and start reading together, so
    that process start-up, which took as long as a whole pass of a few seconds' data on a
    busy machine, is not in the time."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start_at = time.monotonic() + 0.5
    processes = [
        ctx.Process(target=fn, args=(*args, start_at, out), daemon=True) for fn, args in targets
    ]
    for process in processes:
        process.start()
    try:
        time.sleep(max(0.0, start_at - time.monotonic()))
        cpu_before = cpu_seconds_of(pid)
        results = [out.get(timeout=600) for _ in processes]
        cpu_s = cpu_seconds_of(pid) - cpu_before
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGKILL)
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"reader failed: {errors[0]}")
    logs = sum(r.logs for r in results)
    return logs / max(r.elapsed_s for r in results), cpu_s, logs


# --- the cases ----------------------------------------------------------------------------


def fsync_count(port: int) -> float:
    status, _, data = request(port, "GET", "/metrics", host="127.0.0.1")
    if status != 200:
        return float("nan")
    match = re.search(rb"^loghub_fsync_seconds_count (\S+)$", data, re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


@dataclass
class CaseFigures:
    logs_per_s: float
    requests_per_s: float
    cpu_us_per_request: float
    fsyncs_per_s: float = float("nan")
    p99_ms: float = float("nan")
    errors: dict[str, int] = field(default_factory=dict)
    machine_cores: float = float("nan")  # cores the whole machine kept busy in the window
    # CPU of every process on the machine (server, clients, kernel) a request
    machine_cpu_us_per_request: float = float("nan")


def _figures(run: IngestRun) -> CaseFigures:
    requests = run.total("ok_requests")
    return CaseFigures(
        logs_per_s=run.total("ok_logs") / run.window_s,
        requests_per_s=requests / run.window_s,
        cpu_us_per_request=1e6 * run.server_cpu_s / requests if requests else float("nan"),
        p99_ms=1e3 * percentile(run.latencies_s, 0.99),
        errors=run.errors,
        machine_cores=run.machine_busy_s / run.window_s,
        machine_cpu_us_per_request=(
            1e6 * run.machine_busy_s / requests if requests else float("nan")
        ),
    )


def run_loghub(
    server: ServerChild | list[ServerChild],
    batches: list[Batch],
    connections: int,
    shards: int,
    args: Any,
) -> CaseFigures:
    """The case against one server, or against several (connections spread over them, the
    figures of all together)."""
    servers = server if isinstance(server, list) else [server]
    logstore = _logstore_name(batches[0].logs, connections)
    fsyncs_before, started = sum(fsync_count(s.port) for s in servers), time.monotonic()
    run = run_producers(
        server, batches, connections, paths=(f"/logstores/{logstore}/shards/lb",),
        warmup_s=args.warmup, seconds=args.seconds, sender_factory=RawPutSender,
    )  # fmt: skip
    figures = _figures(run)
    elapsed = time.monotonic() - started
    figures.fsyncs_per_s = (sum(fsync_count(s.port) for s in servers) - fsyncs_before) / elapsed
    return figures


def run_loghub_processes(
    data_dir: Path, batches: list[Batch], connections: int, shards: int, args: Any
) -> CaseFigures:
    """The same case on ``PROCESSES`` independent `loghub serve` processes, each with its
    share of the shards and of the connections: what several server processes on one port
    could do at best (each owning its shards, with no request passed from one to another and
    no shared metadata), to weigh the second core (docs/decisions.md, "Both cores")."""
    servers = [ServerChild(data_dir / f"process-{i}") for i in range(PROCESSES)]
    try:
        for server in servers:
            server.data_dir.mkdir(parents=True)
            server.start()
            create_logstore(
                server.port,
                max(1, shards // PROCESSES),
                _logstore_name(batches[0].logs, connections),
            )
        return run_loghub(servers, batches, connections, shards, args)
    finally:
        for server in servers:
            server.stop()
        for server in servers:
            remove_tree(server.data_dir)


def run_redis(
    redis: RedisServer, batches: list[Batch], connections: int, shards: int, args: Any
) -> CaseFigures:
    name = _logstore_name(batches[0].logs, connections)
    paths = tuple(f"{name}:{i}" for i in range(shards))
    run = run_producers(
        redis, batches, connections, paths=paths, warmup_s=args.warmup, seconds=args.seconds,
        sender_factory=RedisXaddSender,
    )  # fmt: skip
    return _figures(run)


def _print_case(label: str, figures: CaseFigures) -> None:
    fsyncs = (
        ""
        if figures.fsyncs_per_s != figures.fsyncs_per_s
        else (f", {fmt_int(figures.fsyncs_per_s)} fsyncs/s")
    )
    print(
        f"    {label:<22} {fmt_int(figures.logs_per_s):>10} logs/s "
        f"{fmt_int(figures.requests_per_s):>7} req/s  {figures.cpu_us_per_request:6.0f} "
        f"CPU-us/req  p99 {figures.p99_ms:5.1f} ms{fsyncs}; machine "
        f"{figures.machine_cores:.2f} cores busy, {figures.machine_cpu_us_per_request:.0f} "
        "CPU-us/req in all"
    )
    for key, value in sorted(figures.errors.items(), key=lambda kv: -kv[1])[:5]:
        print(f"      ERRORS: {value} x {key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds (5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds (1)")
    parser.add_argument("--runs", type=int, default=1, help="runs of every case (1)")
    parser.add_argument("--shards", type=int, default=4, help="shards / streams (4)")
    parser.add_argument(
        "--pull-passes", type=int, default=3, help="catch-up pulls of each side a run (3)"
    )
    parser.add_argument(
        "--pull-case-only",
        action="store_true",
        help="write only the pulled case (16 x 32, Redis in memory), then the pulls",
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny run of a few seconds")
    parser.add_argument("--no-redis", action="store_true", help="LogHub alone")
    parser.add_argument("--data-dir", default=None, help="parent of the temp data directory")
    args = parser.parse_args()
    cases: tuple[tuple[int, int], ...] = _CASES
    if args.smoke:
        args.seconds, args.warmup, args.runs, cases = 0.5, 0.2, 1, ((16, 2), (128, 2))
        args.pull_passes = 1
    if args.pull_case_only and not args.smoke:
        cases = (_PULL_CASE,)

    # the case also run on several server processes (the second core's upper bound)
    processes_case = _PULL_CASE if not args.smoke else cases[0]
    print(f"machine: {machine_summary()}")
    data_dir = make_data_dir(args.data_dir, "loghub-bench-small-")
    print(f"data dir: {data_dir} on {describe_filesystem(data_dir)}")
    batch_sets = {logs: build_batches(16, logs) for logs in {logs for logs, _ in cases}}
    results: dict[tuple[str, int, int], list[CaseFigures]] = {}
    pulls: dict[str, list[float]] = {"loghub": [], "redis": []}
    try:
        for run_index in range(args.runs):
            print(f"run {run_index + 1} of {args.runs}")
            server = ServerChild(data_dir / f"server-{run_index}")
            server.data_dir.mkdir()
            peers = {
                "redis-aof-always": RedisServer(True, str(data_dir)),
                "redis-memory": RedisServer(False, str(data_dir)),
            }
            if args.pull_case_only:
                del peers["redis-aof-always"]
            try:
                server.start()
                for index, (logs, connections) in enumerate(cases):
                    create_logstore(
                        server.port, args.shards, _logstore_name(logs, connections), index == 0
                    )
                if not args.no_redis:
                    for peer in peers.values():
                        peer.start()
                for logs, connections in cases:
                    batches = batch_sets[logs]
                    print(f"  {logs} logs/request, {connections} connections")
                    figures = run_loghub(server, batches, connections, args.shards, args)
                    results.setdefault(("loghub", logs, connections), []).append(figures)
                    _print_case("LogHub fsync always", figures)
                    if (logs, connections) == processes_case:
                        figures = run_loghub_processes(
                            data_dir / f"processes-{run_index}", batches, connections,
                            args.shards, args,
                        )  # fmt: skip
                        results.setdefault(("loghub-processes", logs, connections), []).append(
                            figures
                        )
                        _print_case(f"LogHub, {PROCESSES} processes", figures)
                    if args.no_redis:
                        continue
                    for name, peer in peers.items():
                        figures = run_redis(peer, batches, connections, args.shards, args)
                        results.setdefault((name, logs, connections), []).append(figures)
                        _print_case(name, figures)
                pull_case = _PULL_CASE if not args.smoke else cases[0]
                logstore = _logstore_name(*pull_case)
                for _ in range(args.pull_passes):  # alternating, so both see the same load
                    pull_pass(server, peers["redis-memory"], logstore, pull_case[0], args, pulls)
            finally:
                server.stop()
                for peer in peers.values():
                    peer.stop()
    finally:
        remove_tree(data_dir)
    rows = _summarise(results, pulls, cases, args)
    path = save(
        "small_requests", "Many small PutLogs beside Redis XADD", rows,
        notes=[
            f"{args.shards} shards / streams, {args.seconds:.0f} s measured per case, "
            "one request in flight per connection, one process per connection",
            "Redis: a pipeline of one XADD per log per round trip (same logs as JSON)",
        ],
    )  # fmt: skip
    print(f"saved {path}")


def pull_pass(
    server: ServerChild,
    redis: RedisServer,
    logstore: str,
    logs_per_group: int,
    args: Any,
    pulls: dict[str, list[float]],
) -> None:
    """One catch-up pull of the logstore's shards, then (unless --no-redis) one XRANGE of as
    many of the same logs from Redis; appends both rates to ``pulls`` and prints them."""
    readers = [
        (_loghub_reader, (server.port, logstore, shard, logs_per_group))
        for shard in range(args.shards)
    ]
    rate, cpu_s, logs_read = _run_readers(server.pid, readers)
    pulls["loghub"].append(rate)
    line = (
        f"  catch-up pull of {logstore}: LogHub {fmt_int(rate)} logs/s "
        f"({1e6 * cpu_s / logs_read if logs_read else 0:.2f} server CPU-us/log)"
    )
    if not args.no_redis:
        per_stream = -(-logs_read // args.shards)  # the same logs in all
        readers = [
            (_redis_reader, (redis.port, f"{logstore}:{shard}", 1000 * logs_per_group, per_stream))
            for shard in range(args.shards)
        ]
        redis_rate, redis_cpu_s, redis_logs = _run_readers(redis.pid, readers)
        pulls["redis"].append(redis_rate)
        line += (
            f", Redis XRANGE {fmt_int(redis_rate)} logs/s "
            f"({1e6 * redis_cpu_s / redis_logs if redis_logs else 0:.2f} server CPU-us/log; "
            f"{fmt_int(logs_read)} vs {fmt_int(redis_logs)} logs), "
            + _times(rate, [redis_rate], "XRANGE")
        )
    print(line)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _times(rate: float, reference: list[float], label: str) -> str:
    """``rate`` over the median of ``reference`` as "1.23x <label>"; a reference that
    finished no request in its window (a disk that stalled longer than a smoke run's
    half-second) gives no ratio rather than a division by zero."""
    median = _median(reference)
    return f"{rate / median:.2f}x {label}" if median > 0 else f"no ratio to {label} (0 logs/s)"


def _summarise(
    results: dict[tuple[str, int, int], list[CaseFigures]],
    pulls: dict[str, list[float]],
    cases: tuple[tuple[int, int], ...],
    args: Any,
) -> list[Row]:
    print("summary (medians of runs):")
    rows = []
    for logs, connections in cases:
        mine = results[("loghub", logs, connections)]
        always = results.get(("redis-aof-always", logs, connections), [])
        memory = results.get(("redis-memory", logs, connections), [])
        mine_rate = _median([f.logs_per_s for f in mine])
        ratios = [
            _times(mine_rate, [f.logs_per_s for f in peer], label)
            for peer, label in ((always, "AOF always"), (memory, "in memory"))
            if peer
        ]
        cpu = _median([f.cpu_us_per_request for f in mine])
        fsyncs = _median([f.fsyncs_per_s for f in mine])
        print(
            f"  {logs:>3} logs x {connections:>2} conn: LogHub {fmt_int(mine_rate)} logs/s, "
            f"{fmt_int(_median([f.requests_per_s for f in mine]))} PutLogs/s, "
            f"{cpu:.0f} CPU-us/request, {fmt_int(fsyncs)} fsyncs/s; {', '.join(ratios)}"
        )
        extra = {
            "server_cpu_us_per_request": cpu,
            "fsyncs_per_s": fsyncs,
            "machine_cores_busy": _median([f.machine_cores for f in mine]),
            "machine_cpu_us_per_request": _median([f.machine_cpu_us_per_request for f in mine]),
        }
        if always:
            extra["redis_aof_always_machine_cpu_us_per_request"] = _median(
                [f.machine_cpu_us_per_request for f in always]
            )
        case = f"{logs} logs/request, {connections} connections"
        rows.append(
            Row(
                case, "logs/s", [f.logs_per_s for f in mine],
                reference=(
                    Reference("Redis XADD, appendfsync always", [f.logs_per_s for f in always])
                    if always else None
                ),
                goal="≥ 1× Redis AOF always" if (logs, connections) == _PULL_CASE else "",
                extra=extra,
            )
        )  # fmt: skip
        if memory:
            rows.append(
                Row(
                    case, "logs/s vs in memory", [f.logs_per_s for f in mine],
                    reference=Reference("Redis XADD, in memory", [f.logs_per_s for f in memory]),
                )
            )  # fmt: skip
        processes = results.get(("loghub-processes", logs, connections), [])
        if processes:
            rate = _median([f.logs_per_s for f in processes])
            print(
                f"      on {PROCESSES} server processes: {fmt_int(rate)} logs/s, "
                f"{_median([f.cpu_us_per_request for f in processes]):.0f} CPU-us/request; "
                + _times(rate, [f.logs_per_s for f in mine], "one process")
            )
            rows.append(
                Row(
                    f"{case}, {PROCESSES} server processes", "logs/s",
                    [f.logs_per_s for f in processes],
                    reference=Reference("one server process", [f.logs_per_s for f in mine]),
                    extra={
                        "server_cpu_us_per_request": _median(
                            [f.cpu_us_per_request for f in processes]
                        ),
                        "machine_cores_busy": _median([f.machine_cores for f in processes]),
                    },
                )
            )  # fmt: skip
    if pulls["loghub"]:
        reference = Reference("Redis XRANGE", pulls["redis"]) if pulls["redis"] else None
        rows.append(
            Row("catch-up pull of 16-log groups", "logs/s", pulls["loghub"], reference=reference,
                goal="≥ 1× Redis XRANGE")
        )  # fmt: skip
        ratio = rows[-1].ratio()
        print(
            f"  catch-up pull: LogHub {fmt_int(_median(pulls['loghub']))} logs/s"
            + (f", {ratio:.2f}x Redis XRANGE" if ratio else "")
        )
    return rows


if __name__ == "__main__":
    main()
