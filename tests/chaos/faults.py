"""The faults a chaos run injects, each a real one, and the record of when each happened.

A fault is applied and then lifted (the server restarted, SIGCONT sent, the disk freed...);
``Fault.lifted_ns`` is when the system was free to recover, the start of its recovery time.
Which fault comes next, and its target, comes from the run's seeded random generator.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from processes import PROJECT, ChaosServer, Fleet, SmallDisk, SparkStream
from sqlalchemy.engine import make_url

from loghub.client import LogHubClient

# Faults the server survives without losing acknowledged data (the short run's set); a
# flipped byte costs the damaged group alone, which the checker counts apart from loss.
SURVIVED = (
    "kill_server",
    "flip_byte",
    "pause_server",
    "kill_consumer",
    "pause_consumer",
    "split",
    "merge",
    "break_postgres",
    "fill_disk",
)
ALL = (*SURVIVED, "kill_spark")
PAUSE_PAST_TIMEOUT_S = 5.0  # the workers' group and lease timeouts are 3 s
DISK_FULL_HOLD_S = 3.0
SHARDS_MAX, SHARDS_MIN = 8, 2


@dataclass
class Fault:
    kind: str
    started_ns: int
    lifted_ns: int = 0
    # the consumer process it hit (its redeliveries are explained by it); 0: every process
    pid: int = 0
    detail: str = ""
    # flip_byte: (shard, first sequence, end sequence) of the damaged segment file
    damaged: tuple[int, int, int] | None = None


@dataclass
class Target:
    """What the faults act on."""

    server: ChaosServer
    client: LogHubClient
    logstore: str
    fleets: list[Fleet]
    disk: SmallDisk
    postgres_url: str
    spark: SparkStream | None
    rng: random.Random
    log: Callable[[str], None]
    faults: list[Fault] = field(default_factory=list)
    spark_restarts: int = 0  # the stream stopped by itself and was started again

    def inject(self, kind: str) -> None:
        fault = Fault(kind, time.monotonic_ns())
        getattr(self, kind)(fault)
        fault.lifted_ns = fault.lifted_ns or time.monotonic_ns()
        self.faults.append(fault)
        self.log(f"{kind} {fault.detail}".rstrip())

    def kill_server(self, fault: Fault) -> None:
        self.server.crash()
        self._restart_server(fault)

    def flip_byte(self, fault: Fault) -> None:
        """SIGKILL, then one byte of a closed segment (not the newest of its shard) inverted,
        then restart: a bad sector in data written long ago."""
        self.server.crash()
        closed = closed_segments(self.server.data_dir)
        if closed:
            path = self.rng.choice(closed)
            offset = self.rng.randrange(path.stat().st_size)
            with open(path, "r+b") as file:
                file.seek(offset)
                byte = file.read(1)
                file.seek(offset)
                file.write(bytes([byte[0] ^ 0xFF]))
            fault.damaged = segment_range(path)
            relative = path.relative_to(self.server.data_dir)
            fault.detail = f"{relative} byte {offset} of {path.stat().st_size}"
        else:
            fault.detail = "no closed segment yet: only the kill"
        self._restart_server(fault)

    def _restart_server(self, fault: Fault) -> None:
        fault.lifted_ns = time.monotonic_ns()
        started = time.monotonic()
        self.server.start()
        fault.detail += f" (server up in {time.monotonic() - started:.1f} s)"

    def pause_server(self, fault: Fault) -> None:
        """SIGSTOP of the server past the group timeout: every consumer's heartbeats go
        unanswered, and when the server wakes up, every heartbeat it last saw is stale."""
        os.kill(self.server.pid, signal.SIGSTOP)
        time.sleep(PAUSE_PAST_TIMEOUT_S)
        os.kill(self.server.pid, signal.SIGCONT)
        fault.detail = f"for {PAUSE_PAST_TIMEOUT_S} s"

    def kill_consumer(self, fault: Fault) -> None:
        fleet = self.rng.choice(self.fleets)
        name = self.rng.choice(fleet.running())
        fault.pid = fleet.pid(name)
        fleet.killed.add(name)
        os.kill(fault.pid, signal.SIGKILL)
        fleet.procs[name].wait(timeout=30)
        fault.lifted_ns = time.monotonic_ns()
        fault.detail = f"{name} (replaced by {fleet.start_one()})"

    def pause_consumer(self, fault: Fault) -> None:
        fleet = self.rng.choice(self.fleets)
        name = self.rng.choice(fleet.running())
        fault.pid = fleet.pid(name)
        os.kill(fault.pid, signal.SIGSTOP)
        time.sleep(PAUSE_PAST_TIMEOUT_S)
        os.kill(fault.pid, signal.SIGCONT)
        fault.lifted_ns = time.monotonic_ns()
        fault.detail = f"{name} for {PAUSE_PAST_TIMEOUT_S} s"

    def split(self, fault: Fault) -> None:
        shard = self.rng.choice(self._writable())
        self.client.split_shard(PROJECT, self.logstore, shard)
        fault.detail = f"shard {shard}"

    def merge(self, fault: Fault) -> None:
        shards = sorted(
            (s for s in self.client.list_shards(PROJECT, self.logstore) if s.writable),
            key=lambda s: s.inclusive_begin_key,
        )
        left = self.rng.choice(shards[:-1]).shard_id
        self.client.merge_shard(PROJECT, self.logstore, left)
        fault.detail = f"shard {left} with its right neighbour"

    def _writable(self) -> list[int]:
        return sorted(s.shard_id for s in self.client.list_shards(PROJECT, self.logstore)
                      if s.writable)  # fmt: skip

    def reshard_kind(self, wanted: str) -> str:
        """``wanted`` (split or merge), unless the logstore has reached its bound for it."""
        count = len(self._writable())
        if wanted == "split" and count >= SHARDS_MAX:
            return "merge"
        if wanted == "merge" and count <= SHARDS_MIN:
            return "split"
        return wanted

    def fill_disk(self, fault: Fault) -> None:
        written = self.disk.fill()
        time.sleep(DISK_FULL_HOLD_S)
        self.disk.free()
        fault.detail = f"{written >> 20} MiB filler held {DISK_FULL_HOLD_S} s"

    def break_postgres(self, fault: Fault) -> None:
        """Terminates every backend of the lease database (the lease workers' connections)."""
        url = make_url(self.postgres_url)
        with psycopg.connect(host=url.host, port=url.port, user=url.username,
                             dbname=url.database, autocommit=True) as conn:  # fmt: skip
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        fault.detail = f"{len(rows)} backends terminated"

    def kill_spark(self, fault: Fault) -> None:
        assert self.spark is not None
        self.spark.kill()
        fault.lifted_ns = time.monotonic_ns()
        self.spark.start()


def closed_segments(data_dir: Path) -> list[Path]:
    """Every segment file that is not the newest of its shard directory, and not empty."""
    by_dir: dict[Path, list[Path]] = {}
    for path in data_dir.rglob("*.log"):
        if len(path.stem) == 20 and path.stem.isdigit():
            by_dir.setdefault(path.parent, []).append(path)
    closed = []
    for paths in by_dir.values():
        closed += [p for p in sorted(paths)[:-1] if p.stat().st_size > 0]
    return sorted(closed)


def segment_range(path: Path) -> tuple[int, int, int]:
    """(shard, first sequence, end sequence) of a closed segment: files are named by the
    first sequence they hold, 20 digits, in a directory named by the shard id."""
    bases = sorted(int(p.stem) for p in path.parent.glob("*.log") if p.stem.isdigit())
    following = [base for base in bases if base > int(path.stem)]
    assert following, f"{path} is the newest segment of its shard, not a closed one"
    return int(path.parent.name), int(path.stem), following[0]
