"""`loghub.consumer` workers as real processes against `loghub serve`, in both coordination
modes (server heartbeats; leases in SQLite and in a real PostgreSQL server).

A producer thread writes logs {key, n} by hash key (n counts per key) into 16 shards while
3 to 5 workers share them: workers join, leave cleanly (SIGTERM), are SIGKILLed at random,
one of them is a supervisor of two worker processes (`run_processes`), and shards are split
and merged mid-run. Every worker process records what it processed and each checkpoint it
wrote durably (`loghub_consumer_worker.py`). The checker then proves, over everything:

- nothing acknowledged was lost;
- every duplicate is explained by a SIGKILL: its first delivery came from the killed
  process before the kill, at or after the last durable checkpoint of its shard at that
  moment (so there is no duplicate around clean joins, leaves, splits and merges);
- in an ordered group, each key's logs were first processed in write order.

The schedule is random, reproducible from the seed it prints (`LOGHUB_SEED=...`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from delivery_events import Delivery, deliveries, durable_checkpoint
from postgres import create_schema
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.errors import LogHubError
from loghub.wire.logs import make_log_group

WORKER_SCRIPT = Path(__file__).with_name("loghub_consumer_worker.py")
PROJECT = "consumers"
SHARDS = 16
KEYS = 32


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("consumer") / "data", keys={"ak": "sk"})
    process.start()
    try:
        with LogHubClient(process.endpoint, "ak", "sk") as client:
            client.create_project(PROJECT)
        yield process
    finally:
        process.stop()


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Producer:
    """Writes {key, n} by hash key; n counts per key; remembers what was acknowledged."""

    def __init__(self, endpoint: str, logstore: str) -> None:
        self.acked: set[tuple[str, int]] = set()
        self.errors: list[LogHubError] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(endpoint, logstore))

    def _run(self, endpoint: str, logstore: str) -> None:
        counters = dict.fromkeys((f"k{j}" for j in range(KEYS)), 0)
        with LogHubClient(endpoint, "ak", "sk") as client:
            while not self._stop.is_set():
                for key, n in counters.items():
                    group = make_log_group([(1_700_000_000, {"key": key, "n": str(n)})])
                    hash_key = hashlib.md5(key.encode()).hexdigest()
                    try:
                        client.put_log_group(PROJECT, logstore, group, hash_key=hash_key)
                    except LogHubError as exc:  # a write racing a split: retried next round
                        self.errors.append(exc)
                        continue
                    counters[key] = n + 1
                    self.acked.add((key, n))
                self._stop.wait(0.02)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


class Fleet:
    """The worker processes of one run, by name; every PID kept, stopped by PID."""

    def __init__(self, server: ServerProcess, logstore: str, mode: str, lease_url: str,
                 ordered: bool, out: Path) -> None:  # fmt: skip
        self.server, self.logstore, self.mode = server, logstore, mode
        self.lease_url, self.ordered, self.out = lease_url, ordered, out
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.kills: dict[int, int] = {}  # pid -> monotonic ns just before its SIGKILL

    def start(self, name: str, processes: int = 1) -> None:
        args = [sys.executable, str(WORKER_SCRIPT), str(self.out), self.server.endpoint,
                PROJECT, self.logstore, "group", name, self.mode,
                "--processes", str(processes)]  # fmt: skip
        if self.lease_url:
            args += ["--lease-url", self.lease_url]
        if self.ordered:
            args.append("--ordered")
        log = open(self.out.parent / f"{name}.log", "ab")  # noqa: SIM115 (the child owns it)
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def stop(self, name: str) -> None:
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, f"{name} did not stop cleanly: {self.log(name)}"

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        self.kills[proc.pid] = time.monotonic_ns()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def running(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.poll() is None]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def log(self, name: str) -> str:
        return (self.out.parent / f"{name}.log").read_text(errors="replace")[-3000:]

    def events(self) -> list[dict[str, Any]]:
        events = []
        for path in self.out.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                if line.endswith("}"):
                    events.append(json.loads(line))
        return sorted(events, key=lambda event: event["t"])


def check(events: list[dict[str, Any]], acked: set[tuple[str, int]], kills: dict[int, int],
          ordered: bool) -> list[str]:  # fmt: skip
    """Every problem found, as a sentence."""
    problems = []
    delivered = deliveries(events)
    by_log: dict[tuple[str, int], list[Delivery]] = defaultdict(list)
    for delivery in delivered:
        by_log[(delivery.key, delivery.n)].append(delivery)
    lost = acked - by_log.keys()
    if lost:
        problems.append(f"{len(lost)} acknowledged logs never processed, e.g. {sorted(lost)[:5]}")
    for log, copies in by_log.items():
        for earlier, later in zip(copies, copies[1:], strict=False):
            killed_ns = kills.get(earlier.pid)
            if killed_ns is None:
                problems.append(f"{log} processed twice, first by a process never killed: "
                                f"{earlier} then {later}")  # fmt: skip
            elif not earlier.t < killed_ns <= later.t:
                problems.append(f"{log} processed twice around, not across, a kill: {copies}")
            elif earlier.seq < durable_checkpoint(events, earlier.shard, killed_ns):
                problems.append(f"{log} redelivered from before the durable checkpoint: {copies}")
    if ordered:
        firsts: dict[str, list[Delivery]] = defaultdict(list)
        for copies in by_log.values():
            firsts[copies[0].key].append(copies[0])
        for key, logs in firsts.items():
            logs.sort(key=lambda d: (d.t, d.index))
            numbers = [d.n for d in logs]
            if numbers != sorted(numbers):
                bad = next(i for i in range(1, len(numbers)) if numbers[i] < numbers[i - 1])
                problems.append(f"{key} out of write order: {logs[bad - 1]} then {logs[bad]}")
    return problems


def _lease_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "server":
        return ""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'leases.db'}"
    base: str = request.getfixturevalue("postgres_url")
    return create_schema(base, f"consumer_{uuid.uuid4().hex[:12]}")


def _readwrite_shards(client: LogHubClient, logstore: str) -> list[int]:
    return sorted(s.shard_id for s in client.list_shards(PROJECT, logstore) if s.writable)


def _held_by(events: list[dict[str, Any]], pid: int) -> set[int]:
    """The shards the process ``pid`` has started and not stopped."""
    held: set[int] = set()
    for event in events:
        if event["pid"] == pid and event["e"] == "start":
            held.add(event["shard"])
        elif event["pid"] == pid and event["e"] == "stop":
            held.discard(event["shard"])
    return held


def _merge_candidate(client: LogHubClient, logstore: str, rng: random.Random) -> int:
    """A readwrite shard whose right-hand neighbour is readwrite too."""
    shards = sorted(
        (s for s in client.list_shards(PROJECT, logstore) if s.writable),
        key=lambda s: s.inclusive_begin_key,
    )
    return rng.choice([left.shard_id for left in shards[:-1]])


@pytest.mark.parametrize(
    ("kind", "ordered"),
    [
        pytest.param("server", True, id="server-ordered"),
        pytest.param("server", False, id="server"),
        pytest.param("sqlite", False, id="lease-sqlite"),
        pytest.param("postgres", True, id="lease-postgres-ordered", marks=pytest.mark.postgres),
    ],
)
def test_workers_join_leave_crash_and_reshard_without_loss_or_unexplained_duplicates(
    server: ServerProcess,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    kind: str,
    ordered: bool,
) -> None:
    seed = int(os.environ.get("LOGHUB_SEED", random.randrange(2**32)))
    print(f"\nLOGHUB_SEED={seed}")
    rng = random.Random(seed)
    logstore = f"run-{kind}-{uuid.uuid4().hex[:6]}"
    out = tmp_path / "events"
    out.mkdir()
    mode = "server" if kind == "server" else "lease"
    fleet = Fleet(server, logstore, mode, _lease_url(kind, tmp_path, request), ordered, out)
    client = LogHubClient(server.endpoint, "ak", "sk")
    client.create_logstore(PROJECT, logstore, shard_count=SHARDS)
    producer = Producer(server.endpoint, logstore)

    def pause(seconds: float) -> None:
        time.sleep(seconds + rng.uniform(-0.5, 0.5))

    try:
        producer.start()
        for name in ("w1", "w2", "w3"):
            fleet.start(name)
        started = lambda: {e["shard"] for e in fleet.events() if e["e"] == "start"}  # noqa: E731
        wait_for(lambda: set(range(SHARDS)) <= started(), 60, "every shard to be consumed")
        fleet.start("sup", processes=2)  # joins: 5 workers
        pause(2)
        client.merge_shard(PROJECT, logstore, _merge_candidate(client, logstore, rng))
        pause(2)
        victim = rng.choice(["w1", "w2", "w3"])
        orphans = _held_by(fleet.events(), fleet.procs[victim].pid)
        fleet.kill(victim)  # 4 workers
        # Split a shard of the dead worker once it has a backlog: that backlog must be read
        # before the children's logs, although nobody can read it until the shard moves on.
        time.sleep(1)
        writable = _readwrite_shards(client, logstore)
        client.split_shard(
            PROJECT, logstore, rng.choice(sorted(orphans & set(writable)) or writable)
        )
        pause(2)
        leaver = rng.choice([w for w in ("w1", "w2", "w3") if w != victim])
        fleet.stop(leaver)  # 3 workers
        fleet.start("w4")  # 4
        pause(3)
        fleet.start("w5")  # 5
        pause(2)
        fleet.stop("sup")  # two leave at once: 3
        client.split_shard(PROJECT, logstore, rng.choice(_readwrite_shards(client, logstore)))
        pause(3)
        producer.stop()
        processed = lambda: {(d.key, d.n) for d in deliveries(fleet.events())}  # noqa: E731
        wait_for(lambda: producer.acked <= processed(), 60, "every acknowledged log")
        for name in fleet.running():
            fleet.stop(name)
    finally:
        producer.stop()
        fleet.close()
        client.close()
    events = fleet.events()
    problems = check(events, producer.acked, fleet.kills, ordered)
    duplicates = len(deliveries(events)) - len({(d.key, d.n) for d in deliveries(events)})
    print(f"{len(producer.acked)} logs, {duplicates} redelivered after the SIGKILL")
    assert not problems, f"LOGHUB_SEED={seed}:\n" + "\n".join(problems[:20])
