"""The official SDK's ConsumerWorker, unmodified, in separate processes against `loghub serve`.

Each worker runs `sdk_consumer_worker.py` in its own process and appends what it processes
to a file; a producer thread writes keyed logs meanwhile. Workers leave with SIGTERM (the
SDK's clean shutdown) or die with SIGKILL; the test keeps every PID it starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.errors import LogHubError
from loghub.wire.logs import make_log_group

WORKER_SCRIPT = Path(__file__).with_name("sdk_consumer_worker.py")
GROUP_TIMEOUT_S = 2  # the SDK sets 2 x heartbeat_interval (1 s)
HEARTBEAT_S = 1


class Workers:
    def __init__(
        self, server: ServerProcess, project: str, logstore: str, tmp: Path, ordered: bool = False
    ) -> None:
        self.server, self.project, self.logstore = server, project, logstore
        self.tmp, self.ordered = tmp, ordered
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> None:
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env["HTTP_PROXY"] = env["http_proxy"] = f"http://{self.server.endpoint}"
        args = [
            sys.executable,
            str(WORKER_SCRIPT),
            self.server.endpoint,
            self.project,
            self.logstore,
            "group",
            name,
            str(self.tmp / f"{name}.jsonl"),
        ]
        if self.ordered:
            args.append("--ordered")
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 (the child owns it)
        self.procs[name] = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def stop(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def events(self) -> list[dict[str, Any]]:
        events = []
        for path in self.tmp.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                if line.endswith("}"):
                    events.append(json.loads(line))
        return sorted(events, key=lambda e: e["t"])

    def holdings(self) -> dict[str, set[int]]:
        held: dict[str, set[int]] = defaultdict(set)
        for event in self.events():
            if event["event"] == "start":
                held[event["worker"]].add(event["shard"])
            elif event["event"] == "stop":
                held[event["worker"]].discard(event["shard"])
        return {w: s for w, s in held.items() if self.procs[w].poll() is None}

    def processed(self) -> list[tuple[str, int, int, str]]:
        """(key, n, t, worker) of every processed log, in processing order."""
        return [
            (key, n, event["t"], event["worker"])
            for event in self.events()
            if event["event"] == "logs"
            for key, n in event["logs"]
        ]


class Producer:
    """Writes logs {key, n} by hash key; n counts per key; remembers what was acknowledged."""

    def __init__(self, endpoint: str, project: str, logstore: str, keys: int = 16) -> None:
        self.acked: list[tuple[str, int]] = []
        self.errors: list[LogHubError] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(endpoint, project, logstore, keys))

    def _run(self, endpoint: str, project: str, logstore: str, keys: int) -> None:
        counters = dict.fromkeys((f"k{j}" for j in range(keys)), 0)
        with LogHubClient(endpoint, "ak", "sk") as client:
            while not self._stop.is_set():
                for key, n in counters.items():
                    group = make_log_group([(1_700_000_000, {"key": key, "n": str(n)})])
                    try:
                        client.put_log_group(
                            project, logstore, group, hash_key=hashlib.md5(key.encode()).hexdigest()
                        )
                    except LogHubError as exc:
                        self.errors.append(exc)
                        continue
                    counters[key] = n + 1
                    self.acked.append((key, n))
                time.sleep(0.02)

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("cwork") / "data", keys={"ak": "sk"}).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture()
def workers(server: ServerProcess, tmp_path: Path) -> Iterator[Callable[..., Workers]]:
    made: list[Workers] = []

    def make(logstore: str, ordered: bool = False) -> Workers:
        pool = Workers(server, "cwork", logstore, tmp_path, ordered)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.close()


def _client(server: ServerProcess) -> LogHubClient:
    return LogHubClient(server.endpoint, "ak", "sk")


@pytest.fixture(scope="module", autouse=True)
def project(server: ServerProcess) -> None:
    with _client(server) as client:
        client.create_project("cwork")


def _create(server: ServerProcess, logstore: str, shards: int) -> None:
    with _client(server) as client:
        client.create_logstore("cwork", logstore, shard_count=shards)


def _all_processed(pool: Workers, producer: Producer) -> Callable[[], bool]:
    return lambda: set(producer.acked) <= {(k, n) for k, n, _, _ in pool.processed()}


def test_clean_leave_and_join_lose_nothing_and_duplicate_nothing(
    server: ServerProcess, workers: Callable[..., Workers]
) -> None:
    _create(server, "leavejoin", 8)
    pool = workers("leavejoin")
    with Producer(server.endpoint, "cwork", "leavejoin") as producer:
        pool.start("w1")
        pool.start("w2")
        time.sleep(4)
        pool.start("w3")  # joins: shards move to it
        wait_for(lambda: len(pool.holdings().get("w3", ())) >= 2, 30, "w3 to get shards")
        time.sleep(2)
        pool.stop("w1")  # leaves cleanly: its shards move on
        time.sleep(GROUP_TIMEOUT_S + 3)
    assert not producer.errors
    wait_for(_all_processed(pool, producer), 60, "every acknowledged log to be processed")
    counts = Counter((k, n) for k, n, _, _ in pool.processed())
    duplicates = {log: c for log, c in counts.items() if c > 1}
    assert not duplicates, f"{len(duplicates)} logs processed twice"
    assert set(counts) == set(producer.acked)


def test_three_workers_share_eight_shards_three_three_two_and_a_killed_workers_shards_move(
    server: ServerProcess, workers: Callable[..., Workers]
) -> None:
    """Three workers on eight shards settle at 3/3/2, each shard held once; then one is
    SIGKILLed and its shards move within the group timeout plus a heartbeat."""
    _create(server, "killed", 8)
    pool = workers("killed")
    with Producer(server.endpoint, "cwork", "killed") as producer:
        for name in ("w1", "w2", "w3"):
            pool.start(name)
        wait_for(
            lambda: sorted(len(s) for s in pool.holdings().values()) == [2, 3, 3],
            60,
            "a 3/3/2 split",
        )
        held = pool.holdings()
        assert sorted(s for shards in held.values() for s in shards) == list(range(8))
        orphaned = held["w2"]
        killed_at = time.monotonic_ns()
        pool.kill("w2")

        def taken_over() -> bool:
            held = set().union(*(pool.holdings().get(w, set()) for w in ("w1", "w3")))
            return orphaned <= held

        wait_for(taken_over, 30, "the killed worker's shards to move")
        starts = [
            e["t"]
            for e in pool.events()
            if e["event"] == "start" and e["shard"] in orphaned and e["t"] > killed_at
        ]
        moved_s = (max(starts) - killed_at) / 1e9
        print(f"\nshards of the SIGKILLed worker consumed again after {moved_s:.2f} s")
        # the server drops it GROUP_TIMEOUT_S after its last heartbeat, the next heartbeat
        # of another worker takes its shards; 0.5 s for that worker's fetch loop to start them
        assert moved_s <= GROUP_TIMEOUT_S + HEARTBEAT_S + 0.5
        time.sleep(2)
    wait_for(_all_processed(pool, producer), 60, "every acknowledged log to be processed")


def test_ordered_group_keeps_each_keys_order_across_split_and_merge(
    server: ServerProcess, workers: Callable[..., Workers]
) -> None:
    _create(server, "ordered", 4)
    pool = workers("ordered", ordered=True)
    with Producer(server.endpoint, "cwork", "ordered") as producer:
        pool.start("w1")
        pool.start("w2")
        time.sleep(3)
        with _client(server) as client:
            client.split_shard("cwork", "ordered", 0)  # -> 4, 5
            time.sleep(3)
            client.merge_shard("cwork", "ordered", 5)  # 5 + 1 -> 6
        time.sleep(3)
    assert not producer.errors
    wait_for(_all_processed(pool, producer), 90, "every acknowledged log to be processed")
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, n, _, _ in pool.processed():  # in processing-time order
        by_key[key].append(n)
    for key, numbers in by_key.items():
        assert numbers == sorted(numbers), f"{key} processed out of order"
    shards_seen = {e["shard"] for e in pool.events() if e["event"] == "logs"}
    assert {4, 5, 6} <= shards_seen, "the children were consumed"


def test_children_of_an_empty_readonly_shard_are_consumed(
    server: ServerProcess, workers: Callable[..., Workers]
) -> None:
    _create(server, "emptyparent", 2)
    with _client(server) as client:
        client.split_shard("cwork", "emptyparent", 0)  # shard 0 never held data
        for key in ("00", "01", "7f"):
            group = make_log_group([(1_700_000_000, {"key": key, "n": "0"})])
            client.put_log_group("cwork", "emptyparent", group, hash_key=key)
    pool = workers("emptyparent", ordered=True)
    pool.start("w1")
    wait_for(
        lambda: {(k, n) for k, n, _, _ in pool.processed()} >= {("00", 0), ("01", 0), ("7f", 0)},
        30,
        "the children's logs",
    )
