"""A LogHub cluster for tests: real etcd members and real `loghub serve --cluster` nodes.

``running_cluster(nodes=3)`` starts a 3-member etcd (tests/etcd.py) and the nodes on free
loopback ports, each with its own data directory, and stops every process it started, by
PID, at the end. Nodes can be SIGKILLed and started again with their data. With
``kafka=True`` each node also runs a Kafka listener, on a port of its own that it keeps
across restarts (``kafka_ports``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from etcd import EtcdCluster, running_etcd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from server_process import ServerProcess, free_port  # noqa: E402

if TYPE_CHECKING:
    from loghub.cluster.controller import PlacementRecord

__all__ = ["LogHubCluster", "running_cluster"]

NODE_TTL_S = 2


@dataclass
class LogHubCluster:
    etcd: EtcdCluster
    nodes: list[ServerProcess]
    base: Path
    keys: dict[str, str]
    kafka: bool = False
    kafka_ports: dict[int, int] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()  # for every node (``--replication-factor 3``)

    def node_args(self, index: int, port: int) -> tuple[str, ...]:
        args: tuple[str, ...] = (
            "--cluster", self.etcd.url, "--node-id", f"n{index}",
            "--advertise", f"127.0.0.1:{port}", "--node-ttl-s", str(NODE_TTL_S),
            "--retention-interval-s", "3600",
        )  # fmt: skip
        if self.kafka:
            kafka_port = self.kafka_ports.setdefault(index, free_port())
            args += ("--kafka-port", str(kafka_port), "--kafka-initial-rebalance-delay-ms", "100")
        return args + self.extra_args

    def server(self, index: int, port: int) -> ServerProcess:
        """Node ``index``'s process, not started yet."""
        return ServerProcess(
            self.base / f"node{index}",
            keys=self.keys,
            extra_args=self.node_args(index, port),
            port=port,
        )

    def start_node(self, index: int) -> ServerProcess:
        port = self.nodes[index].port if index < len(self.nodes) else free_port()
        node = self.server(index, port)
        node.start()
        if index < len(self.nodes):
            self.nodes[index] = node
        else:
            self.nodes.append(node)
        return node

    def start_new_nodes(self, count: int) -> None:
        """Starts nodes ``len(nodes)`` to ``len(nodes) + count - 1`` side by side and waits
        until each answers: their interpreters start at once instead of one after another."""
        first = len(self.nodes)
        wanted = count * (2 if self.kafka else 1)
        ports: list[int] = []
        while len(ports) < wanted:  # distinct, although none is bound until its node starts
            port = free_port()
            if port not in ports and port not in self.kafka_ports.values():
                ports.append(port)
        if self.kafka:
            for index, kafka_port in enumerate(ports[count:], start=first):
                self.kafka_ports.setdefault(index, kafka_port)
        new = [self.server(index, port) for index, port in enumerate(ports[:count], start=first)]
        self.nodes.extend(new)  # listed first: whatever starts is stopped at the end
        with ThreadPoolExecutor(count) as pool:
            for future in [pool.submit(node.start) for node in new]:
                future.result()

    def status(self) -> dict[str, object]:
        """`loghub cluster status --json`, read from etcd."""
        import asyncio

        from loghub.cluster.status import cluster_status

        return asyncio.run(cluster_status(self.etcd.url))

    def placements(self) -> dict[tuple[str, str], PlacementRecord]:
        """(project, logstore) -> its placement record, as the controller wrote it in etcd."""
        import asyncio

        from loghub.cluster.controller import read_placements
        from loghub.cluster.etcd_store import EtcdStore

        async def read() -> dict[tuple[str, str], PlacementRecord]:
            async with EtcdStore(self.etcd.url) as store:
                return dict(await read_placements(store))

        return asyncio.run(read())

    def owners(self, project: str, logstore: str) -> dict[int, str]:
        """Shard id -> the node its placement record names."""
        record = self.placements().get((project, logstore))
        return dict(record.owners) if record else {}

    def wait_placed(self, shards: int = 0, timeout_s: float = 30.0) -> None:
        """Until every live node is registered, at least ``shards`` shards are placed, and no
        shard waits for a node or a move."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.status()
            live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
            if (
                len(status["nodes"]) == len(live)  # type: ignore[arg-type]
                and not status["unavailable_shards"]
                and not status["handovers"]
                and status["controller"]
                and sum(n["shards"] for n in status["nodes"]) >= shards  # type: ignore[attr-defined]
            ):
                return
            time.sleep(0.1)
        raise AssertionError(f"the cluster did not settle: {self.status()}")


@contextlib.contextmanager
def running_cluster(
    base: Path,
    nodes: int = 3,
    keys: dict[str, str] | None = None,
    kafka: bool = False,
    extra_args: tuple[str, ...] = (),
) -> Iterator[LogHubCluster]:
    with running_etcd(3) as etcd:
        cluster = LogHubCluster(etcd, [], base, keys or {}, kafka, extra_args=extra_args)
        try:
            cluster.start_new_nodes(nodes)
            yield cluster
        finally:
            for node in cluster.nodes:
                node.kill()
