"""`make cluster-demo`: three etcd members and three LogHub nodes on loopback ports.

Creates a logstore of 6 shards, writes through every node while a consumer group (two
``ConsumerWorker``s, each talking to a different node) reads, shows where the shards are,
kills one node with SIGKILL, shows its shards move to the others while writing and reading go
on, brings the node back, and checks that every log written was read. Every process started
here is stopped by its PID at the end; the data lives in a temporary directory.

    .venv/bin/python scripts/cluster_demo.py [--seconds 6]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "cluster")]

from cluster_nodes import LogHubCluster, running_cluster  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from loghub.client import LogHubClient  # noqa: E402
from loghub.consumer import Checkpointer, ConsumerConfig, ConsumerProcessor, ConsumerWorker  # noqa: E402
from loghub.wire.proto import Log, LogGroup  # noqa: E402

PROJECT, LOGSTORE, GROUP = "demo", "orders", "billing"
console = Console()
seen: set[str] = set()
seen_lock = threading.Lock()


class Collect(ConsumerProcessor):
    def process(self, log_groups: Sequence[LogGroup], checkpointer: Checkpointer) -> str | None:
        with seen_lock:
            for group in log_groups:
                for log in group.Logs:
                    seen.update(c.Value for c in log.Contents if c.Key == "id")
        checkpointer.save()
        return None


def show(cluster: LogHubCluster, title: str) -> None:
    status = cluster.status()
    table = Table(title=f"{title} (controller {status['controller']})")
    for column in ("node", "advertise", "shards held"):
        table.add_column(column)
    for node in status["nodes"]:  # type: ignore[attr-defined]
        table.add_row(node["node"], node["advertise"], str(node["shards"]))
    console.print(table)
    gone = status["unavailable_shards"]
    if gone:
        console.print(f"shards waiting for their node (older logs, one replica): {len(gone)}")  # type: ignore[arg-type]


def write(cluster: LogHubCluster, sent: list[str], seconds: float, stop_node: int = -1) -> None:
    """Writes 20 logs a round through each live node, load-balanced, for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for index, node in enumerate(cluster.nodes):
            if index == stop_node or node.proc is None or node.proc.poll() is not None:
                continue
            group = LogGroup()
            ids = [f"n{index}-{len(sent) + i}" for i in range(20)]
            for log_id in ids:
                log = Log(Time=int(time.time()))
                log.Contents.add(Key="id", Value=log_id)
                group.Logs.append(log)
            for _attempt in range(20):  # a node may answer 503 while a shard moves
                try:
                    with LogHubClient(f"http://{node.endpoint}") as client:
                        client.put_log_group(PROJECT, LOGSTORE, group)
                    sent.extend(ids)
                    break
                except Exception as exc:  # noqa: BLE001 (shown, then tried again)
                    console.print(f"  [dim]write through n{index}: {exc}; again[/dim]")
                    time.sleep(0.2)
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="loghub-cluster-demo-") as base,
        running_cluster(Path(base), 3) as cluster,
    ):
        console.print(f"etcd: {cluster.etcd.url}")
        for index, node in enumerate(cluster.nodes):
            console.print(f"node n{index}: http://{node.endpoint} (pid {node.pid})")
        with LogHubClient(f"http://{cluster.nodes[0].endpoint}") as client:
            client.create_project(PROJECT, "the cluster demo")
            client.create_logstore(PROJECT, LOGSTORE, shard_count=6)
        cluster.wait_placed(shards=6)
        show(cluster, "6 shards on 3 nodes")
        workers = [
            ConsumerWorker(
                Collect,
                ConsumerConfig(
                    endpoint=f"http://{cluster.nodes[i].endpoint}",
                    project=PROJECT,
                    logstore=LOGSTORE,
                    group=GROUP,
                    worker_name=f"worker-{i}",
                    fetch_interval_ms=200,
                    heartbeat_interval_ms=1000,
                    timeout_ms=4000,
                    checkpoint_interval_ms=1000,
                ),
            )  # fmt: skip
            for i in (1, 2)
        ]
        for worker in workers:
            worker.start()
        sent: list[str] = []
        write(cluster, sent, args.seconds)
        console.print(f"written {len(sent)} logs through the three nodes")
        victim = 1
        console.print(
            f"[bold red]SIGKILL node n{victim}[/bold red] (pid {cluster.nodes[victim].pid})"
        )
        cluster.nodes[victim].kill()
        killed = time.monotonic()
        write(cluster, sent, args.seconds, stop_node=victim)
        console.print(f"{time.monotonic() - killed:.1f} s after the kill:")
        show(cluster, "2 nodes")
        console.print(f"node n{victim} comes back")
        cluster.start_node(victim)
        cluster.wait_placed()
        write(cluster, sent, args.seconds / 2)
        show(cluster, "3 nodes again")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with seen_lock:
                missing = set(sent) - seen
            if not missing:
                break
            time.sleep(0.5)
        for worker in workers:
            worker.shutdown()
        console.print(
            f"written {len(sent)}, read by the group {len(set(sent) & seen)}, "
            f"missing {len(set(sent) - seen)}"
        )
        if set(sent) - seen:
            raise SystemExit("some logs were not read")


if __name__ == "__main__":
    main()
