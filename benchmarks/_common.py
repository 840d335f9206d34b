"""Shared pieces of the benchmarks: a `loghub serve` child, test data, light HTTP producers.

Everything here talks to 127.0.0.1 only. The benchmarks keep the PID of every process they
start and stop exactly those (SIGTERM, wait, SIGKILL if needed), then remove their temp data.
Producers and consumers are separate processes using ``http.client`` with keep-alive, the
lightest client the standard library has, so that on a small machine the client side takes
as little CPU from the server as it can.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lz4.block

from loghub.wire.logs import make_log_group

PROJECT = "bench-project"
LOGSTORE = "bench"
REPO_ROOT = Path(__file__).resolve().parent.parent

# --- formatting ---------------------------------------------------------------------------


def fmt_int(value: float) -> str:
    return f"{value:,.0f}"


def mb(value_bytes: float) -> float:
    return value_bytes / 1e6


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


# --- where the data lives -----------------------------------------------------------------


def describe_filesystem(path: Path) -> str:
    """`ext4 on /dev/vda (mounted at /, virtio disk, rotational=0)` for the file system of path."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    fs_type, source, mount_point = "?", "?", "?"
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            if fields[2] == f"{major}:{minor}":
                separator = fields.index("-")
                mount_point = fields[4]
                fs_type, source = fields[separator + 1], fields[separator + 2]
                break
    details = []
    block = Path(f"/sys/dev/block/{major}:{minor}")
    if block.exists():
        disk = block.resolve()
        if (disk / "partition").exists():
            disk = disk.parent
        for name, label in (("queue/rotational", "rotational"), ("device/model", "model")):
            with contextlib.suppress(OSError):
                value = (disk / name).read_text().strip()
                if value:
                    details.append(f"{label}={value}")
        with contextlib.suppress(OSError):
            sectors = int((disk / "size").read_text())
            details.append(f"size={sectors * 512 / 1e9:.0f} GB")
    extra = f", {', '.join(details)}" if details else ""
    return f"{fs_type} on {source} (mounted at {mount_point}, dev {major}:{minor}{extra})"


def make_data_dir(parent: str | None, prefix: str) -> Path:
    if parent:
        Path(parent).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    # fields[0] is field 3 (state); ppid is field 4, utime and stime are fields 14 and 15.
    return text[text.rindex(")") + 2 :].split()


def _children_of(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(_stat_fields(int(entry))[1]) == pid:
                    children.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
    return children


def cpu_times_of(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process (all its threads) and of its live child
    processes (the server checks PutLogs bodies in worker processes), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    for process in (pid, *_children_of(pid)):
        try:
            fields = _stat_fields(process)
        except OSError:
            continue
        user += int(fields[11]) / ticks
        system += int(fields[12]) / ticks
    return user, system


def cpu_seconds_of(pid: int) -> float:
    """utime + stime of a process and its live children."""
    return sum(cpu_times_of(pid))


def machine_summary() -> str:
    cores = os.cpu_count()
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{cores} cores ({model}), Python {sys.version.split()[0]}"


def load_average() -> str:
    """The machine's load averages (1, 5, 15 min), printed and saved beside every figure: on
    a shared machine they say how much of it the benchmark had."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load ?"
    return f"load {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min)"


def stop_process(proc: subprocess.Popen[bytes] | None, timeout_s: float = 20.0) -> None:
    """SIGTERM to exactly this child, SIGKILL if it is still there after ``timeout_s``."""
    if proc is None or proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)


# --- the server child ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerChild:
    """`python -m loghub serve` as a child process; stop() ends exactly that PID."""

    def __init__(self, data_dir: Path, fsync: str = "always", extra_args: tuple[str, ...] = ()):
        self.data_dir = data_dir
        self.port = free_port()
        self.args = [
            sys.executable, "-m", "loghub", "serve", "--data-dir", str(data_dir),
            "--host", "127.0.0.1", "--port", str(self.port), "--fsync", fsync, *extra_args,
        ]  # fmt: skip
        self.log_path = data_dir.parent / f"{data_dir.name}-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 30.0) -> ServerChild:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
        src = str(REPO_ROOT / "src")
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                self.args, stdout=log_file, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                status, _, _ = request(self.port, "GET", "/health", host="127.0.0.1")
                if status == 200:
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"server did not become healthy in {timeout_s} s: {self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    host: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection (for setup, not for the timed part)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        all_headers = {"Host": host or f"{PROJECT}.127.0.0.1", **(headers or {})}
        conn.request(method, path, body=body, headers=all_headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    finally:
        conn.close()


def create_logstore(port: int, shards: int, name: str = LOGSTORE, project: bool = True) -> None:
    """Creates the project (unless ``project`` is False: it exists) and a logstore in it."""
    steps = [("/logstores", {"logstoreName": name, "ttl": 7, "shardCount": shards})]
    if project:
        steps.insert(0, ("/", {"projectName": PROJECT, "description": "benchmark"}))
    for path, payload in steps:
        status, _, data = request(
            port, "POST", path, json.dumps(payload).encode(),
            {"Content-Type": "application/json", "x-log-apiversion": "0.6.0"},
        )  # fmt: skip
        if status != 200:
            raise RuntimeError(f"POST {path} answered {status}: {data[:300]!r}")


# --- test data ----------------------------------------------------------------------------

_PATHS = [
    "/", "/index.html", "/api/v1/users", "/api/v1/orders", "/api/v1/items/search",
    "/static/js/app.bundle.js", "/static/css/main.css", "/images/logo.png", "/login",
    "/cart/checkout", "/api/v2/metrics/push", "/healthz", "/favicon.ico", "/docs/getting-started",
]  # fmt: skip
_AGENTS = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/124.0", "curl/8.5.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) Safari/605.1.15", "Go-http-client/1.1",
    "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Firefox/125.0", "python-requests/2.31.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4) Mobile/15E148",
]  # fmt: skip
_METHODS = ["GET"] * 8 + ["POST", "PUT", "DELETE"]
_STATUSES = ["200"] * 20 + ["201", "204", "301", "304", "400", "404", "500", "503"]


def access_log_record(rng: random.Random, now_s: int) -> tuple[int, dict[str, str]]:
    """One web access log, as an agent would parse an nginx line into keys (about 200 bytes
    once encoded as a protobuf Log)."""
    path = rng.choice(_PATHS)
    if rng.random() < 0.5:
        path += f"?id={rng.randrange(1, 10**6)}&page={rng.randrange(1, 50)}"
    record = {
        "remote_addr": f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}",
        "method": rng.choice(_METHODS),
        "request_uri": path,
        "status": rng.choice(_STATUSES),
        "body_bytes_sent": str(rng.randrange(0, 60_000)),
        "request_time": f"{rng.expovariate(20):.3f}",
        "http_user_agent": rng.choice(_AGENTS),
    }
    return now_s - rng.randrange(0, 5), record


@dataclass(frozen=True)
class Batch:
    body: bytes  # the lz4 block, as sent
    raw_size: int  # the serialized LogGroup
    logs: int


def batch_records(
    count: int, logs_per_batch: int, seed: int = 42
) -> list[list[tuple[int, dict[str, str]]]]:
    """The logs of ``build_batches(count, logs_per_batch, seed)``, batch by batch, so that a
    peer (Redis, NATS) is sent exactly the logs LogHub is sent."""
    rng = random.Random(seed)
    now_s = int(time.time())
    return [[access_log_record(rng, now_s) for _ in range(logs_per_batch)] for _ in range(count)]


def log_json(log_time: int, record: dict[str, str]) -> bytes:
    """One log as the JSON entry a peer stores: its time and its keys (about 220 bytes)."""
    return json.dumps({"__time__": log_time, **record}, separators=(",", ":")).encode()


def build_batches(count: int, logs_per_batch: int, seed: int = 42) -> list[Batch]:
    """``count`` distinct lz4-compressed LogGroups of ``logs_per_batch`` access logs."""
    batches = []
    for index, records in enumerate(batch_records(count, logs_per_batch, seed)):
        group = make_log_group(
            records, topic="nginx", source=f"10.0.0.{index + 1}",
            tags={"__hostname__": f"web-{index % 8:02d}", "env": "bench"},
        )  # fmt: skip
        raw = group.SerializeToString()
        body = bytes(lz4.block.compress(raw, store_size=False))
        batches.append(Batch(body, len(raw), logs_per_batch))
    return batches


# --- producers ----------------------------------------------------------------------------


@dataclass
class ProducerResult:
    ok_requests: int = 0  # answered 200 inside the measured window
    ok_logs: int = 0
    ok_raw_bytes: int = 0
    ok_body_bytes: int = 0
    latencies_s: list[float] = field(default_factory=list)  # of the requests counted above
    errors: dict[str, int] = field(default_factory=dict)  # "status: body" -> count (any time)
    total_requests: int = 0  # sent, any time
    cpu_s: float = 0.0  # the producer's own CPU time


def _put_headers(batch: Batch) -> dict[str, str]:
    return {
        "Host": f"{PROJECT}.127.0.0.1",
        "Content-Type": "application/x-protobuf",
        "x-log-apiversion": "0.6.0",
        "x-log-compresstype": "lz4",
        "x-log-bodyrawsize": str(batch.raw_size),
    }


class HttpPutSender:
    """PutLogs of the batches over one keep-alive ``http.client`` connection (the default
    producer). A sender is built in the producer process: ``connect``, then ``send`` per
    request, which returns None for a 200 or the error's description."""

    def __init__(self, port: int, batches: list[Batch], path: str) -> None:
        self.port, self.batches, self.path = port, batches, path
        self.headers = [_put_headers(batch) for batch in batches]
        self.conn: http.client.HTTPConnection | None = None

    def connect(self) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def send(self, index: int) -> str | None:
        assert self.conn is not None
        self.conn.request(
            "POST", self.path, body=self.batches[index].body, headers=self.headers[index]
        )
        response = self.conn.getresponse()
        data = response.read()
        if response.status != 200:
            return f"{response.status}: {data[:200].decode(errors='replace')}"
        return None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


SenderFactory = Any  # (port, batches, path) -> a sender as HttpPutSender; picklable or forked


def _producer(
    port: int,
    index: int,
    batches: list[Batch],
    path: str,
    measure_from: float,
    measure_until: float,
    max_requests: int | None,
    out: Any,
    sender_factory: SenderFactory = HttpPutSender,
) -> None:
    """Sends batches round robin until ``measure_until`` (or ``max_requests`` sent); counts
    the successes that both started and finished inside [measure_from, measure_until]."""
    result = ProducerResult()
    cpu_start = time.process_time()
    position = index * 5
    sender = None
    try:
        sender = sender_factory(port, batches, path)
        sender.connect()
        while True:
            if max_requests is not None and result.total_requests >= max_requests:
                break
            started = time.monotonic()
            if max_requests is None and started >= measure_until:
                break
            batch_index = position % len(batches)
            position += 1
            batch = batches[batch_index]
            try:
                error = sender.send(batch_index)
            except (OSError, http.client.HTTPException) as exc:
                key = f"connection error: {exc!r}"
                result.errors[key] = result.errors.get(key, 0) + 1
                sender.close()
                sender.connect()
                time.sleep(0.01)
                continue
            finished = time.monotonic()
            result.total_requests += 1
            if error is not None:
                result.errors[error] = result.errors.get(error, 0) + 1
                continue
            if started >= measure_from and finished <= measure_until:
                result.ok_requests += 1
                result.ok_logs += batch.logs
                result.ok_raw_bytes += batch.raw_size
                result.ok_body_bytes += len(batch.body)
                result.latencies_s.append(finished - started)
    except Exception as exc:  # the parent prints it, and does not wait for this producer
        result.errors[f"producer failed: {exc!r}"] = 1
    finally:
        if sender is not None:
            sender.close()
        result.cpu_s = time.process_time() - cpu_start
        out.put((index, result))


@dataclass
class IngestRun:
    producers: list[ProducerResult]
    window_s: float
    server_cpu_s: float  # inside the window
    wall_s: float  # for count-bounded runs: first send to last acknowledgement
    server_system_s: float = 0.0  # the kernel's part of server_cpu_s
    # CPU seconds the whole machine was busy inside the window (every process: servers,
    # clients, kernel threads), from /proc/stat; iowait counts as idle
    machine_busy_s: float = float("nan")

    def total(self, name: str) -> int:
        return sum(getattr(p, name) for p in self.producers)

    @property
    def latencies_s(self) -> list[float]:
        return [x for p in self.producers for x in p.latencies_s]

    @property
    def errors(self) -> dict[str, int]:
        merged: dict[str, int] = {}
        for p in self.producers:
            for key, value in p.errors.items():
                merged[key] = merged.get(key, 0) + value
        return merged


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has been busy since boot: user, nice, system,
    irq and softirq of /proc/stat (idle, iowait and the time stolen by the host are not)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def run_producers(
    server: Any,
    batches: list[Batch],
    producers: int,
    *,
    paths: tuple[str, ...] = (f"/logstores/{LOGSTORE}/shards/lb",),
    warmup_s: float = 0.0,
    seconds: float | None = None,
    requests_each: int | None = None,
    sender_factory: SenderFactory = HttpPutSender,
) -> IngestRun:
    """Either a timed run (warm-up then ``seconds`` measured) or a fixed number of requests
    per producer (``requests_each``; then every success counts and the window is the wall
    time). Producer i sends to ``paths[i % len(paths)]`` through
    ``sender_factory(port, batches, path)`` (PutLogs over http.client by default; another
    system's client for a peer). ``server`` is anything with ``port`` and ``pid`` (a
    ``ServerChild``, a peer such as ``RedisServer``), or a list of them: producer i then
    sends to ``server[i % len(server)]``, and the server CPU is theirs together."""
    servers = list(server) if isinstance(server, list) else [server]
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start_at = time.monotonic() + 0.5  # time for the processes to start
    if requests_each is None:
        assert seconds is not None
        measure_from = start_at + warmup_s
        measure_until = measure_from + seconds
    else:
        measure_from, measure_until = 0.0, float("inf")
    processes = [
        ctx.Process(
            target=_producer,
            args=(
                servers[i % len(servers)].port,
                i,
                batches,
                paths[i % len(paths)],
                measure_from,
                measure_until,
                requests_each,
                out,
                sender_factory,
            ),  # fmt: skip
            daemon=True,
        )
        for i in range(producers)
    ]
    for process in processes:
        process.start()
    try:
        results: dict[int, ProducerResult] = {}
        if requests_each is None:
            time.sleep(max(0.0, measure_from - time.monotonic()))
            cpu_before, busy_before = _cpu_times_of_all(servers), machine_busy_s()
            time.sleep(max(0.0, measure_until - time.monotonic()))
            cpu_after, busy_after = _cpu_times_of_all(servers), machine_busy_s()
            window_s = measure_until - measure_from
            wall_s = window_s
        else:
            cpu_before, busy_before = _cpu_times_of_all(servers), machine_busy_s()
            wall_start = time.monotonic()
        while len(results) < producers:
            index, result = out.get(timeout=600)
            results[index] = result
        if requests_each is not None:
            wall_s = time.monotonic() - wall_start
            cpu_after, busy_after = _cpu_times_of_all(servers), machine_busy_s()
            window_s = wall_s
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGKILL)
                process.join(timeout=10)
    return IngestRun(
        [results[i] for i in range(producers)],
        window_s,
        sum(cpu_after) - sum(cpu_before),
        wall_s,
        cpu_after[1] - cpu_before[1],
        busy_after - busy_before,
    )


def _cpu_times_of_all(servers: list[Any]) -> tuple[float, float]:
    """(user, system) CPU seconds of all these servers together (see ``cpu_times_of``)."""
    times = [cpu_times_of(server.pid) for server in servers]
    return sum(t[0] for t in times), sum(t[1] for t in times)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.parent.joinpath(f"{path.name}-server.log").unlink()
