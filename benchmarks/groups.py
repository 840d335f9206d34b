"""Consumer groups on a real `loghub serve`: server CPU per heartbeat, and join-to-balance time.

For groups of 1, 10 and 100 consumers over 1,000 shards, the consumers (simulated in this
process, SDK-like: each reports what it holds and lets go at once of what the reply leaves
out) first reach a balanced group, then send rounds of heartbeats while the server's CPU time
(/proc/<pid>/stat) is measured; the figure is server CPU per heartbeat, HTTP included. Then a
new consumer joins a balanced group of 10 with everybody heartbeating every second, and the
wall time until the group is balanced again (every shard held, counts within 1) is printed.
The pure group logic's own CPU per heartbeat is printed beside it for reference.

Each measurement takes at least ``--heartbeats-min`` heartbeats (more rounds for a small
group): /proc counts CPU time in clock ticks (10 ms), so 5 rounds of one consumer could only
read as 0 or 2 ms a heartbeat.

    python benchmarks/groups.py [--shards 1000] [--rounds 20] [--heartbeats-min 500]
                                [--sizes 1,10,100] [--runs 3] [--smoke]

Saves the figures to benchmarks/results/groups.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
from _common import (
    LOGSTORE,
    PROJECT,
    ServerChild,
    cpu_seconds_of,
    create_logstore,
    load_average,
    machine_summary,
    make_data_dir,
    remove_tree,
)
from _results import Row, save

from loghub.coordination import ConsumerGroup, ShardView

GROUP_TIMEOUT_S = 120  # nobody expires while a large group is being measured


class Consumers:
    """Simulated consumers of one group, talking to the server over one keep-alive client."""

    def __init__(self, http: httpx.Client, group: str, count: int) -> None:
        self.http, self.group = http, group
        self.held: dict[str, list[int]] = {f"c{i:03d}": [] for i in range(count)}

    def add(self, name: str) -> None:
        self.held[name] = []

    def heartbeat(self, name: str) -> None:
        reply = self.http.post(
            f"/logstores/{LOGSTORE}/consumergroups/{self.group}",
            params={"type": "heartbeat", "consumer": name},
            content=json.dumps(self.held[name]),
        )
        reply.raise_for_status()
        self.held[name] = reply.json()

    def round(self) -> None:
        for name in self.held:
            self.heartbeat(name)

    def balanced(self, shard_count: int) -> bool:
        counts = [len(shards) for shards in self.held.values()]
        return sum(counts) == shard_count and max(counts) - min(counts) <= 1


def create_group(http: httpx.Client, group: str) -> None:
    reply = http.post(
        f"/logstores/{LOGSTORE}/consumergroups",
        json={"consumerGroup": group, "timeout": GROUP_TIMEOUT_S, "order": False},
    )
    reply.raise_for_status()


def cpu_per_heartbeat(
    server: ServerChild, http: httpx.Client, size: int, shards: int, rounds: int, runs: int = 1
) -> tuple[list[float], int]:
    """Server CPU seconds per heartbeat, once per run of ``rounds`` rounds of the balanced
    group; and the rounds it took to balance."""
    consumers = Consumers(http, f"bench-{size}", size)
    create_group(http, consumers.group)
    rounds_to_balance = 0
    while not consumers.balanced(shards):
        consumers.round()
        rounds_to_balance += 1
        assert rounds_to_balance < 50, "the group did not balance"
    per_run = []
    for _ in range(runs):
        before_s = cpu_seconds_of(server.pid)
        for _ in range(rounds):
            consumers.round()
        per_run.append((cpu_seconds_of(server.pid) - before_s) / (rounds * size))
    return per_run, rounds_to_balance


def join_to_balance_s(
    http: httpx.Client, shards: int, size: int, interval_s: float, group: str = "bench-join"
) -> float:
    consumers = Consumers(http, group, size)
    create_group(http, consumers.group)
    while not consumers.balanced(shards):
        consumers.round()
    consumers.add("joiner")
    joined = time.monotonic()
    next_round = joined
    while not consumers.balanced(shards):
        next_round += interval_s
        time.sleep(max(0.0, next_round - time.monotonic()))
        consumers.round()
    return time.monotonic() - joined


def pure_logic_us(shards: int, size: int, rounds: int) -> float:
    views = [ShardView(s, (), False) for s in range(shards)]
    group = ConsumerGroup("pure", GROUP_TIMEOUT_S * 1000, False, 0)
    held: dict[str, list[int]] = {f"c{i}": [] for i in range(size)}
    for _ in range(10):
        for name in held:
            held[name] = group.heartbeat(name, held[name], views, 0)
    started = time.process_time()
    for _ in range(rounds):
        for name in held:
            held[name] = group.heartbeat(name, held[name], views, 0)
    return (time.process_time() - started) / (rounds * size) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--heartbeats-min", type=int, default=500, help="heartbeats a measurement at least"
    )
    parser.add_argument("--sizes", default="1,10,100")
    parser.add_argument("--join-interval-s", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3, help="measurements of each figure (3)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.shards, args.rounds, args.sizes, args.runs = 20, 2, "1,3", 1
        args.heartbeats_min = 4
        args.join_interval_s = 0.05
    sizes = [int(size) for size in args.sizes.split(",")]
    rows: list[Row] = []

    print(f"{machine_summary()}; {load_average()}")
    data_dir: Path = make_data_dir(args.data_dir, "loghub-bench-groups-")
    server = ServerChild(data_dir / "data").start()
    try:
        create_logstore(server.port, args.shards)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{server.port}",
            headers={"host": f"{PROJECT}.127.0.0.1"},
            timeout=60,
        ) as http:
            print(f"consumer groups over {args.shards} shards, loghub serve pid {server.pid}")
            for size in sizes:
                measured_rounds = max(args.rounds, -(-args.heartbeats_min // size))
                cpu_runs, rounds = cpu_per_heartbeat(
                    server, http, size, args.shards, measured_rounds, args.runs
                )
                cpu_s = statistics.median(cpu_runs)
                pure = pure_logic_us(args.shards, size, max(1, args.rounds // 4))
                print(
                    f"  {size:>3} consumers: server CPU {cpu_s * 1e3:.2f} ms per heartbeat "
                    f"(HTTP included; pure group logic {pure / 1e3:.2f} ms), balanced "
                    f"after {rounds} heartbeat rounds; {measured_rounds * size} heartbeats a "
                    "measurement"
                )
                rows.append(
                    Row(
                        f"{size} consumers, {args.shards} shards", "ms server CPU/heartbeat",
                        [c * 1e3 for c in cpu_runs], higher_is_better=False, goal="≤ 1 ms",
                        extra={"pure_logic_ms": pure / 1e3, "rounds_to_balance": rounds},
                    )
                )  # fmt: skip
            joins = [
                join_to_balance_s(http, args.shards, 10, args.join_interval_s, f"join-{run}")
                for run in range(args.runs)
            ]
            took_s = statistics.median(joins)
            print(
                f"  a consumer joining a balanced group of 10 (heartbeats every "
                f"{args.join_interval_s:g} s): balanced again after {took_s:.2f} s"
            )
            rows.append(
                Row(
                    f"a consumer joins a balanced group of 10, heartbeats every "
                    f"{args.join_interval_s:g} s", "s to balance", joins, higher_is_better=False,
                )
            )  # fmt: skip
    finally:
        server.stop()
        remove_tree(data_dir)
    print(f"saved {save('groups', 'Consumer groups: heartbeat CPU and join time', rows)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
