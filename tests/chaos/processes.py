"""The real parts of a chaos run: the server, the producers, the consumer workers, the Spark
stream and the small filesystem the server keeps its data on.

Every process is started here and kept by PID; faults and shutdown signal exactly those PIDs
(never a process found by name). Every event is stamped with CLOCK_MONOTONIC in nanoseconds,
the clock the consumer workers stamp their own events with, so the checker can order what
the producers, the consumers and the fault driver saw.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.errors import LogHubError
from loghub.wire.logs import make_log_group

HERE = Path(__file__).resolve().parent
WORKER_SCRIPT = HERE.parent / "integration" / "loghub_consumer_worker.py"
SPARK_SCRIPT = HERE / "spark_stream.py"
ACCESS_KEY = ("ak", "sk")  # loghub_consumer_worker.py signs with this pair
PROJECT = "chaos"


class ChaosServer(ServerProcess):
    """`loghub serve --segment-bytes-max` (small segments) as a child process; restarts keep
    the port, so clients and consumers find it again. Worker processes it leaves behind after
    a SIGKILL are counted and stopped by PID."""

    def __init__(self, data_dir: Path, segment_bytes: int) -> None:
        super().__init__(data_dir, keys=dict([ACCESS_KEY]))
        self.segment_bytes = segment_bytes
        self.orphans_found = 0

    def _start_once(self, timeout_s: float) -> ServerProcess:
        keys_file = self.data_dir.parent / f"{self.data_dir.name}-keys.json"
        keys_file.write_text(json.dumps(self.keys))
        args = [sys.executable, "-m", "loghub", "serve", "--data-dir", str(self.data_dir),
                "--host", "127.0.0.1", "--port", str(self.port), "--keys-file", str(keys_file),
                "--segment-bytes-max", str(self.segment_bytes)]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
        log_file = open(self.log_path, "ab")  # noqa: SIM115 (the child owns it)
        self.proc = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        log_file.close()
        deadline = time.monotonic() + timeout_s
        with httpx.Client(trust_env=False, timeout=1) as http:  # one client for every try
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    reply = http.get(f"http://{self.endpoint}/health")
                    if reply.status_code == 200 and reply.json().get("pid") == self.proc.pid:
                        return self
                time.sleep(0.01)
        self.kill()
        raise RuntimeError(f"server did not become healthy: {self.log()}")

    def crash(self) -> None:
        """SIGKILL, then stop the worker processes the server had started, which outlive it
        today; they were started (indirectly) by this run, and are found by PID."""
        children = _children(self.pid)
        self.kill()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                self.orphans_found += 1


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(p) for p in (task / "children").read_text().split()]
    return found


class Producer:
    """Writes logs {key, n, pad} by hash key into one logstore; n counts per key and moves on
    only when the write is acknowledged. Records when each log was acknowledged, and which
    logs had a failed attempt first (such a write may still have been stored, so the retry
    can store the log twice: a duplicate the producer explains)."""

    def __init__(self, endpoint: str, logstore: str, keys: list[str], rate_per_s: float) -> None:
        self.acked: dict[tuple[str, int], int] = {}  # (key, n) -> monotonic ns of the ack
        self.failed: set[tuple[str, int]] = set()
        self.errors: Counter[str] = Counter()  # failed attempts by status and error code
        self._keys, self._interval_s = keys, len(keys) / rate_per_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(endpoint, logstore))

    def _run(self, endpoint: str, logstore: str) -> None:
        counters = dict.fromkeys(self._keys, 0)
        with LogHubClient(endpoint, *ACCESS_KEY, timeout_s=5) as client:
            while not self._stop.is_set():
                for key, n in counters.items():
                    pad = "x" * (100 + n % 200)
                    group = make_log_group([(1_700_000_000, {"key": key, "n": str(n), "p": pad})])
                    hash_key = hashlib.md5(key.encode()).hexdigest()
                    try:
                        client.put_log_group(PROJECT, logstore, group, hash_key=hash_key)
                    except (LogHubError, httpx.HTTPError) as exc:
                        self.failed.add((key, n))
                        self.errors[_error_kind(exc)] += 1
                        continue
                    counters[key] = n + 1
                    self.acked[(key, n)] = time.monotonic_ns()
                self._stop.wait(self._interval_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _error_kind(exc: Exception) -> str:
    if isinstance(exc, LogHubError):
        return f"{exc.status or 'no reply'} {type(exc).__name__}"
    return type(exc).__name__


class Fleet:
    """The consumer worker processes of one consumer group (loghub_consumer_worker.py), by
    name; each records what it processed and checkpointed into ``out``."""

    def __init__(self, endpoint: str, logstore: str, group: str, mode: str, lease_url: str,
                 out: Path) -> None:  # fmt: skip
        self.endpoint, self.logstore, self.group = endpoint, logstore, group
        self.mode, self.lease_url, self.out = mode, lease_url, out
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started = 0
        self.killed: set[str] = set()  # SIGKILLed by the fault driver
        self.exited: list[str] = []  # exited by themselves, each replaced
        out.mkdir(parents=True, exist_ok=True)

    def start_one(self) -> str:
        self.started += 1
        name = f"{self.group}-w{self.started}"
        args = [sys.executable, str(WORKER_SCRIPT), str(self.out), self.endpoint, PROJECT,
                self.logstore, self.group, name, self.mode, "--ordered"]  # fmt: skip
        if self.lease_url:
            args += ["--lease-url", self.lease_url]
        log = open(self.out.parent / f"{name}.log", "ab")  # noqa: SIM115 (the child owns it)
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return name

    def replace_exited(self) -> list[str]:
        """Starts a worker for each one that exited by itself (as a supervisor would), so
        the group keeps its size; returns the names of those that had exited."""
        known = self.killed | set(self.exited)
        gone = [n for n, proc in self.procs.items() if proc.poll() is not None and n not in known]
        for name in gone:
            self.exited.append(name)
            self.start_one()
        return gone

    def running(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.poll() is None]

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def stop_all(self) -> None:
        for name in self.running():
            os.kill(self.procs[name].pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a paused worker must not stay paused
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def events(self) -> list[dict[str, Any]]:
        events = []
        for path in self.out.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                if line.endswith("}"):
                    events.append(json.loads(line))
        return sorted(events, key=lambda event: event["t"])


class SparkStream:
    """A Structured Streaming query (pyspark local mode, ``loghub.spark``) from the logstore
    into Parquet files, in a process of its own (spark_stream.py) so it can be SIGKILLed and
    restarted from its checkpoint."""

    def __init__(self, endpoint: str, logstore: str, base: Path) -> None:
        self.endpoint, self.logstore = endpoint, logstore
        self.out, self.checkpoint = base / "spark-out", base / "spark-checkpoint"
        self.log_path = base / "spark.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s = 0.0

    def start(self) -> None:
        self.started_s = time.monotonic()
        args = [sys.executable, str(SPARK_SCRIPT), self.endpoint, PROJECT, self.logstore,
                str(self.out), str(self.checkpoint)]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child owns it)
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def age_s(self) -> float:
        return time.monotonic() - self.started_s

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL of the driver's process group: the JVM is its child and would outlive it."""
        if self.alive():
            assert self.proc is not None
            for pid in [self.proc.pid, *_children(self.proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def logs(self) -> list[tuple[str, int]]:
        """The (key, n) of every row in the committed Parquet files. The file sink's log
        lists the files of each committed batch (a killed batch's files are not listed);
        every tenth entry (`N.compact`) repeats all earlier ones, so reading starts from the
        newest compact entry."""
        import pyarrow.parquet as pq  # only the Spark part needs pyarrow

        log_dir = self.out / "_spark_metadata"
        entries: dict[int, Path] = {}
        for path in log_dir.glob("[0-9]*") if log_dir.exists() else []:
            batch = path.name.removesuffix(".compact")
            if batch.isdigit():
                entries[int(batch)] = path
        compacts = [n for n, path in entries.items() if path.name.endswith(".compact")]
        first = max(compacts, default=0)
        rows: list[tuple[str, int]] = []
        for number in sorted(n for n in entries if n >= first):
            for line in entries[number].read_text().splitlines()[1:]:
                file = json.loads(line)["path"].removeprefix("file://")
                table = pq.read_table(file, columns=["contents"])
                for contents in table.column("contents").to_pylist():
                    fields = dict(contents)
                    rows.append((fields["key"], int(fields["n"])))
        return rows


class SmallDisk:
    """A small filesystem for the server's data directory: tmpfs (as root), or, when it cannot
    be mounted, a plain directory (and the disk-full fault is left out)."""

    def __init__(self, path: Path, size_mib: int) -> None:
        self.path, self.size_mib = path, size_mib
        self.mounted = False

    def __enter__(self) -> SmallDisk:
        self.path.mkdir(parents=True)
        if os.geteuid() == 0 and shutil.which("mount"):
            result = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={self.size_mib}m", "tmpfs", str(self.path)],
                capture_output=True,
                timeout=30,
            )
            self.mounted = result.returncode == 0
        return self

    def __exit__(self, *exc: object) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.path)], capture_output=True, timeout=60)

    def fill(self) -> int:
        """Writes a file until the filesystem is full; returns the bytes written."""
        written = 0
        chunk = b"\0" * (1 << 20)
        with open(self.filler, "wb", buffering=0) as file:
            while True:
                try:
                    written += file.write(chunk)
                except OSError:
                    return written

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    @property
    def filler(self) -> Path:
        return self.path / "chaos-filler"
