"""Server CPU per heartbeat: 100 consumers of one group over 1,000 shards, as deployed.

A real ``loghub serve`` child; a logstore of ``--shards`` shards; one consumer group whose
``--consumers`` members heartbeat from ``--processes`` separate client processes, each member
every ``--interval-s`` (phases spread over the interval), with the request the official SDK
sends (``POST .../consumergroups/<group>?type=heartbeat&consumer=<name>`` with the held shard
ids as a JSON array, through ``LogHubClient.heartbeat``). A member holds exactly what the
server grants it (SDK-like: it lets go at once of what a reply leaves out).

Once the assignment has settled (every shard held, counts within one, no change for one
interval) the server's CPU time (/proc/<pid>/stat, user + system, HTTP included) is read
over ``--seconds`` and divided by the heartbeats answered in that window. Repeated
``--runs`` times on the same group; the figure is ms of server CPU per heartbeat.

    python benchmarks/heartbeats.py [--shards 1000] [--consumers 100] [--smoke]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    LOGSTORE,
    PROJECT,
    ServerChild,
    cpu_seconds_of,
    create_logstore,
    machine_summary,
    make_data_dir,
    remove_tree,
)
from _results import Row, save

from loghub.client import LogHubClient

GROUP = "bench-heartbeats"
GROUP_TIMEOUT_S = 60  # nobody expires while a loaded machine is slow to answer


def _member_process(
    port: int,
    names: list[str],
    first_index: int,
    interval_s: float,
    held_counts: Any,
    beats: Any,
    stop: Any,
) -> None:
    """Heartbeats for ``names`` every ``interval_s``, each at its own phase; publishes how
    many shards each holds (``held_counts``) and how many heartbeats were answered."""
    client = LogHubClient(f"http://127.0.0.1:{port}", timeout_s=120)
    held: dict[str, list[int]] = {name: [] for name in names}
    total = len(held_counts)
    started = time.monotonic()
    due = [started + interval_s * ((first_index + i) % total) / total for i in range(len(names))]
    try:
        while not stop.is_set():
            index = min(range(len(names)), key=due.__getitem__)
            delay = due[index] - time.monotonic()
            if delay > 0 and stop.wait(delay):
                break
            name = names[index]
            held[name] = client.heartbeat(PROJECT, LOGSTORE, GROUP, name, held[name])
            held_counts[first_index + index] = len(held[name])
            with beats.get_lock():
                beats.value += 1
            due[index] += interval_s
    finally:
        client.close()


class Members:
    """The client processes of the group; stop() ends exactly the processes it started."""

    def __init__(self, port: int, consumers: int, processes: int, interval_s: float) -> None:
        ctx = mp.get_context("fork")
        self.held_counts = ctx.Array("i", [-1] * consumers, lock=False)
        self.beats = ctx.Value("q", 0)
        self.stop_event = ctx.Event()
        names = [f"consumer-{i:03d}" for i in range(consumers)]
        per = -(-consumers // processes)
        self.processes = [
            ctx.Process(
                target=_member_process,
                args=(
                    port,
                    names[i : i + per],
                    i,
                    interval_s,
                    self.held_counts,
                    self.beats,
                    self.stop_event,
                ),  # fmt: skip
                daemon=True,
            )
            for i in range(0, consumers, per)
        ]

    def start(self) -> Members:
        for process in self.processes:
            process.start()
        return self

    def counts(self) -> list[int]:
        return list(self.held_counts)

    def stop(self) -> None:
        self.stop_event.set()
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGKILL)
                process.join(timeout=10)


def wait_settled(members: Members, shards: int, interval_s: float, timeout_s: float) -> float:
    """Seconds until every shard is held, counts within one, unchanged for one interval."""
    started = time.monotonic()
    stable_since: float | None = None
    last: list[int] = []
    while time.monotonic() - started < timeout_s:
        counts = members.counts()
        settled = min(counts) >= 0 and sum(counts) == shards and max(counts) - min(counts) <= 1
        if settled and counts == last:
            stable_since = stable_since or time.monotonic()
            if time.monotonic() - stable_since >= interval_s * 1.5:
                return stable_since - started
        else:
            stable_since = None
        last = counts
        time.sleep(interval_s / 10)
    raise RuntimeError(f"the group did not settle in {timeout_s} s: {members.counts()}")


def measure(server: ServerChild, members: Members, seconds: float) -> tuple[float, int]:
    """(server CPU ms per heartbeat, heartbeats) over one window."""
    beats_before = members.beats.value
    cpu_before = cpu_seconds_of(server.pid)
    time.sleep(seconds)
    cpu_used_s = cpu_seconds_of(server.pid) - cpu_before
    beats = members.beats.value - beats_before
    return cpu_used_s * 1e3 / max(1, beats), beats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--consumers", type=int, default=100)
    parser.add_argument("--processes", type=int, default=10)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--smoke", action="store_true", help="a tiny run that only checks")
    args = parser.parse_args()
    if args.smoke:
        args.shards, args.consumers, args.processes = 16, 4, 2
        args.interval_s, args.seconds, args.runs = 0.2, 0.6, 1

    print(machine_summary())
    data_dir: Path = make_data_dir(args.data_dir, "loghub-bench-heartbeats-")
    server = ServerChild(data_dir / "data").start()
    members: Members | None = None
    try:
        create_logstore(server.port, args.shards)
        with LogHubClient(f"http://127.0.0.1:{server.port}") as client:
            client.create_consumer_group(PROJECT, LOGSTORE, GROUP, GROUP_TIMEOUT_S, False)
        members = Members(server.port, args.consumers, args.processes, args.interval_s).start()
        settle_s = wait_settled(members, args.shards, args.interval_s, timeout_s=300)
        print(
            f"{args.consumers} consumers in {len(members.processes)} processes over "
            f"{args.shards} shards, a heartbeat each every {args.interval_s:g} s; "
            f"settled after {settle_s:.1f} s (loghub serve pid {server.pid})"
        )
        values = []
        for run in range(args.runs):
            cpu_ms, beats = measure(server, members, args.seconds)
            values.append(cpu_ms)
            print(f"  run {run + 1}: {cpu_ms:.3f} ms server CPU per heartbeat ({beats} heartbeats)")
        counts = members.counts()
        assert sum(counts) == args.shards, "every shard stays held while measured"
    finally:
        if members is not None:
            members.stop()
        server.stop()
        remove_tree(data_dir)
    case = f"{args.consumers} consumers x {args.shards} shards, 1 group"
    row = Row(case, "ms CPU/heartbeat", values, higher_is_better=False, goal="≤ 1 ms")
    notes = [
        f"{args.processes} client processes, one heartbeat per consumer every "
        f"{args.interval_s:g} s; server CPU from /proc, HTTP included",
    ]
    # a smoke run saves too (run_all --smoke points the results at a temporary directory)
    print(f"saved {save('heartbeats', 'Server CPU per heartbeat', [row], notes)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
