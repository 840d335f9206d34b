"""The nemesis: real faults on a running cluster, chosen by a seeded random generator, each
recorded in the history (an ``invoke`` when it starts, an ``ok`` when it is lifted).

The cluster is tests/cluster's (``LogHubCluster``: 3 etcd members, 3 ``loghub serve
--cluster`` nodes) with a network the nemesis can cut, made one of two ways (run.py's
``--network``; ``auto`` takes the first when it can run):

netns (``NamespacedCluster``, netns.py; root only). Each node runs in a network namespace of
its own (``ip netns exec``, which execs the server: the PID the harness kills and pauses is
the server's), at 10.231.X.(10+i) on a bridge the run makes in the root namespace, where
etcd (on the bridge's address 10.231.X.1), the clients and the checker stay. A cut is a set
of nft rules in the victim's namespace, which drop packets; healing deletes them. The
kernel cuts, as on a real network: it is what Jepsen does, and it needs no cooperation of
the processes (a cut between nodes is a rule on their addresses, however they connect).
The namespaces, veths and bridge carry the runner's PID in their names and are deleted at
the end of the run however it ends; nothing else of the machine's network is touched.

    clients, etcd ── bridge 10.231.X.1 ──veth── namespace of node i (10.231.X.(10+i))

proxy (``ProxiedCluster``, proxy.py; no privilege). Every node on loopback behind TCP
proxies in front of what can be cut:

    clients ──► proxy n{i} ──► node i          (also what node i advertises to its peers)
    node i  ──► proxy n{i}-e{j} ──► etcd member j   (one per node and member)

A proxy holds bytes instead of dropping packets, and can tell a node's connections from a
client's only by the PID behind them (``partition_replicas``); an isolated node's own
connections to its peers' proxies stay open. The netns backend has neither limit.

Faults (``FAULTS``); "random" targets and durations come from the generator, "busiest" and
"leader" from the cluster's state at that moment:

    kill_node              SIGKILL a random node, restart it with its data after 1 s to TTL+3 s
    kill_busiest           the same, on the node that owns the most writable shards
    pause_node             SIGSTOP a random node for longer than the node TTL, then SIGCONT
    kill_etcd_leader       SIGKILL etcd's raft leader, restart it with its data after 1-4 s
    torn_tail              SIGKILL a node, tear the tail of the newest segment of one of its
                           shards, restart it: it must cut the torn record and nothing else
    partition_etcd         cut a node from every etcd member, both ways, past the TTL
                           (netns: its packets to and from the members' client ports)
    partition_etcd_oneway  the same, one way: its requests held, or etcd's answers held
    isolate_node           cut a node from etcd and from clients and peers, past the TTL
                           (netns: every packet of its namespace but loopback's)

With replication (``--replication-factor`` above 1) three more, drawn only then; their
targets come from the shards' replica records in etcd (``loghub.cluster.replicas``):

    kill_leader            SIGKILL a shard's leader (the node leading the most shards, or
                           the leader of a random shard: the fault's generator picks), restart
                           it after 1 s to TTL+3 s
    flip_follower_byte     SIGKILL a follower of a random shard, flip one byte of the payload
                           of an acknowledged record (below the shard's high watermark) in the
                           middle of its copy, restart it: the node must find the damage, no
                           acknowledged write may be lost, and the replicas are compared after
                           healing
    partition_replicas     cut a node from its peers only (both ways), past the replica lag
                           bound: it still reaches etcd and clients, its followers cannot
                           fetch from it and it cannot fetch from its leaders (netns: its
                           packets to and from the other nodes' addresses)

A torn tail is what a crash in the middle of a write leaves: a record whose last bytes never
reached the disk. Cutting bytes off the last record as it is would tear a record that was
acknowledged (the server fsyncs before it acknowledges), which no crash can do, so the
nemesis appends a copy of the last record under the next sequence and cuts a few bytes off
that: the bytes torn are always of a record nobody acknowledged, and the checker proves
that recovery cut only those (no acknowledged write missing, no offset given two values).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_TESTS = _HERE.parent
sys.path[1:1] = [str(_HERE), str(_TESTS), str(_TESTS / "cluster"), str(_TESTS / "integration")]

import crc32c  # noqa: E402
from clients import KEYS, LOGSTORE, PROJECT  # noqa: E402
from cluster_nodes import NODE_TTL_S, LogHubCluster  # noqa: E402
from etcd import running_etcd  # noqa: E402
from history import HistoryFile, Op, now_ns  # noqa: E402
from netns import Namespaces, namespaces  # noqa: E402
from segments import RECORD_HEADER, SEGMENT_HEADER, walk  # noqa: E402
from server_process import ServerProcess  # noqa: E402

from loghub.client import LogHubClient, ShardInfo  # noqa: E402
from loghub.cluster.etcd_store import EtcdStore  # noqa: E402
from loghub.cluster.replicas import ReplicaRecord, read_replica_records_at  # noqa: E402
from loghub.errors import LogHubError  # noqa: E402
from loghub.wire.cursor import decode_cursor  # noqa: E402
from loghub.wire.logs import parse_log_group_list  # noqa: E402

__all__ = [
    "FAULTS",
    "NamespacedCluster",
    "Nemesis",
    "NemesisCluster",
    "ProxiedCluster",
    "Proxies",
    "namespaced_cluster",
    "nemesis_cluster",
    "proxied_cluster",
]

FAULTS = (
    "kill_node",
    "kill_busiest",
    "pause_node",
    "kill_etcd_leader",
    "torn_tail",
    "partition_etcd",
    "partition_etcd_oneway",
    "isolate_node",
    "kill_leader",
    "flip_follower_byte",
    "partition_replicas",
)
# faults that only mean something with replicated shards: drawn only when the run is
REPLICATED_FAULTS = ("kill_leader", "flip_follower_byte", "partition_replicas")
# faults that are a variant of another: the same action, another target or direction
ACTIONS = {
    "kill_busiest": "_kill_node",
    "kill_leader": "_kill_node",
    "partition_etcd_oneway": "_partition_etcd",
}
GAP_BETWEEN_FAULTS_S = (1.0, 3.0)
TORN_BYTES_MAX = 64
RESTARTS_MAX = 3
REPLICA_LAG_S = 3.0  # the servers' --replica-lag-ms default: a follower leaves the ISR after


class Proxies:
    """The proxy process (proxy.py) and its listening ports; stopped by PID."""

    def __init__(self, upstreams: dict[str, int | None]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(_HERE / "proxy.py"), json.dumps(upstreams)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.ports: dict[str, int] = json.loads(self.proc.stdout.readline())

    def _command(self, **command: Any) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok", command

    def set_upstream(self, name: str, port: int, pid: int | None = None) -> None:
        """``name`` forwards to ``port``; with ``pid``, that process is the source ``name``
        (its connections to any proxy can be cut apart: ``cut(..., sources=[name])``)."""
        self._command(cmd="upstream", name=name, port=port, pid=pid)

    def cut(
        self, names: list[str], direction: str = "both", sources: list[str] | None = None
    ) -> None:
        """Holds the bytes through ``names``, of every connection, or only of those opened
        by the processes of ``sources``."""
        self._command(cmd="cut", names=names, direction=direction, sources=sources)

    def heal(self) -> None:
        self._command(cmd="heal")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@dataclass
class NemesisCluster(LogHubCluster):
    """tests/cluster's cluster with a network the nemesis can cut: each backend says how a
    node is reached and makes the cuts (ProxiedCluster, NamespacedCluster)."""

    network = "none"

    def endpoint(self, index: int) -> str:
        """Where clients and peers reach node ``index``."""
        return self.nodes[index].endpoint

    def cut_etcd(self, index: int, direction: str = "both") -> None:
        """Node ``index`` from every etcd member: its requests (``up``), their answers
        (``down``), or both."""
        raise NotImplementedError

    def isolate(self, index: int) -> None:
        """Node ``index`` from etcd, clients and peers."""
        raise NotImplementedError

    def cut_peers(self, index: int) -> None:
        """Node ``index`` from the other nodes, both ways; etcd and clients still reach it."""
        raise NotImplementedError

    def heal_network(self) -> None:
        raise NotImplementedError

    def alive(self, index: int) -> bool:
        proc = self.nodes[index].proc
        return proc is not None and proc.poll() is None

    def replica_records(self) -> dict[int, ReplicaRecord]:
        """The logstore's replica records (shard id -> record), read from etcd directly
        (never through a cut); empty without replication."""

        async def read() -> dict[int, ReplicaRecord]:
            async with EtcdStore(self.etcd.url) as store:
                found, _revision = await read_replica_records_at(store)
            return {k[2]: r for k, r in found.items() if k[:2] == (PROJECT, LOGSTORE)}

        return asyncio.run(read())

    def shard_dir(self, index: int, shard_id: int) -> Path | None:
        """Node ``index``'s directory of a shard of the logstore (None: it has none)."""
        base = self.nodes[index].data_dir / "shards" / PROJECT
        found = sorted(d for d in base.glob(f"{LOGSTORE}-*/{shard_id}") if d.is_dir())
        return found[-1] if found else None


@dataclass
class ProxiedCluster(NemesisCluster):
    """Each node reaching etcd through its own proxies and reached (by clients and peers)
    through one; cuts are made in the proxies."""

    proxies: Proxies | None = None
    network = "proxy"

    def node_args(self, index: int, port: int) -> tuple[str, ...]:
        assert self.proxies is not None
        args = list(super().node_args(index, port))
        members = range(len(self.etcd.members))
        etcd = ",".join(f"127.0.0.1:{self.proxies.ports[f'n{index}-e{j}']}" for j in members)
        args[args.index("--cluster") + 1] = f"etcd://{etcd}"
        args[args.index("--advertise") + 1] = self.endpoint(index)
        return tuple(args)

    def start_node(self, index: int) -> ServerProcess:
        node = super().start_node(index)
        assert self.proxies is not None
        self.proxies.set_upstream(f"n{index}", node.port, node.pid)
        return node

    def endpoint(self, index: int) -> str:
        """Where clients and peers reach node ``index``: its proxy."""
        assert self.proxies is not None
        return f"127.0.0.1:{self.proxies.ports[f'n{index}']}"

    def etcd_links(self, index: int) -> list[str]:
        return [f"n{index}-e{j}" for j in range(len(self.etcd.members))]

    def cut_etcd(self, index: int, direction: str = "both") -> None:
        assert self.proxies is not None
        self.proxies.cut(self.etcd_links(index), direction)

    def isolate(self, index: int) -> None:
        """Its own proxy (clients and peers to it) and its etcd links; its connections to
        its peers' proxies are not told apart from theirs and stay open."""
        assert self.proxies is not None
        self.proxies.cut([f"n{index}", *self.etcd_links(index)], "both")

    def cut_peers(self, index: int) -> None:
        """One proxy per node, cut per source process: its peers' connections through its
        proxy, and its own through theirs."""
        assert self.proxies is not None
        me = f"n{index}"
        peers = [f"n{i}" for i in range(len(self.nodes)) if i != index]
        self.proxies.cut([me], "both", sources=peers)
        self.proxies.cut(peers, "both", sources=[me])

    def heal_network(self) -> None:
        assert self.proxies is not None
        self.proxies.heal()


@dataclass
class NamespacedCluster(NemesisCluster):
    """Each node in a network namespace of its own (netns.py), at its namespace's address,
    which it advertises and where clients and peers reach it; etcd listens on the bridge's
    address. Cuts are nft rules in the node's namespace."""

    namespaces: Namespaces | None = None
    network = "netns"

    def node_args(self, index: int, port: int) -> tuple[str, ...]:
        assert self.namespaces is not None
        args = list(super().node_args(index, port))
        args[args.index("--advertise") + 1] = f"{self.namespaces.address(index)}:{port}"
        return tuple(args)

    def server(self, index: int, port: int) -> ServerProcess:
        """Started by ``ip netns exec``, which execs it: the PID the harness kills, pauses
        and checks against /health is the server's. A restart reuses the namespace, hence
        the address, and the port."""
        assert self.namespaces is not None
        return ServerProcess(
            self.base / f"node{index}",
            keys=self.keys,
            extra_args=self.node_args(index, port),
            port=port,
            host=self.namespaces.address(index),
            command_prefix=self.namespaces.exec_prefix(index),
        )

    def _etcd_ports(self) -> list[int]:
        return [member.client_port for member in self.etcd.members]

    def cut_etcd(self, index: int, direction: str = "both") -> None:
        assert self.namespaces is not None
        self.namespaces.cut_etcd(index, self._etcd_ports(), direction)

    def isolate(self, index: int) -> None:
        assert self.namespaces is not None
        self.namespaces.isolate(index)

    def cut_peers(self, index: int) -> None:
        assert self.namespaces is not None
        self.namespaces.cut_peers(index)

    def heal_network(self) -> None:
        assert self.namespaces is not None
        self.namespaces.heal()


def _stop_nodes(cluster: NemesisCluster) -> None:
    for node in cluster.nodes:
        with contextlib.suppress(ProcessLookupError):
            if node.proc is not None and node.proc.poll() is None:
                os.kill(node.proc.pid, signal.SIGCONT)
        node.kill()


@contextlib.contextmanager
def proxied_cluster(
    base: Path, nodes: int = 3, extra_args: tuple[str, ...] = ()
) -> Iterator[ProxiedCluster]:
    """As tests/cluster's ``running_cluster``, with the proxies; every process it started
    (etcd members, nodes, the proxy process) is stopped by PID at the end."""
    with running_etcd(3) as etcd:
        upstreams: dict[str, int | None] = {f"n{i}": None for i in range(nodes)}
        for i in range(nodes):
            for j, member in enumerate(etcd.members):
                upstreams[f"n{i}-e{j}"] = member.client_port
        proxies = Proxies(upstreams)
        cluster = ProxiedCluster(etcd, [], base, dict(KEYS), extra_args=extra_args, proxies=proxies)
        try:
            for index in range(nodes):
                cluster.start_node(index)
            yield cluster
        finally:
            _stop_nodes(cluster)
            proxies.stop()


@contextlib.contextmanager
def namespaced_cluster(
    base: Path, nodes: int = 3, extra_args: tuple[str, ...] = ()
) -> Iterator[NamespacedCluster]:
    """As tests/cluster's ``running_cluster``, each node in its own network namespace
    (root only: netns.py); the nodes and etcd members are stopped by PID, then the
    namespaces, veths and bridge are deleted, however the run ends."""
    with namespaces(nodes) as made, running_etcd(3, host=made.bridge_address) as etcd:
        cluster = NamespacedCluster(etcd, [], base, dict(KEYS), extra_args=extra_args,
                                    namespaces=made)  # fmt: skip
        try:
            cluster.start_new_nodes(nodes)  # side by side: no proxy waits for their PIDs
            yield cluster
        finally:
            _stop_nodes(cluster)


def nemesis_cluster(
    base: Path, network: str, nodes: int = 3, extra_args: tuple[str, ...] = ()
) -> contextlib.AbstractContextManager[NemesisCluster]:
    """The cluster of ``network``'s backend: "netns" or "proxy" (resolved already)."""
    assert network in ("netns", "proxy"), network
    if network == "netns":
        return namespaced_cluster(base, nodes, extra_args)
    return proxied_cluster(base, nodes, extra_args)


def tear_tail(shard_dir: Path, rng: random.Random) -> dict[str, Any] | None:
    """Appends a torn record (the last record again, under the next sequence, missing its
    last 1 to 64 bytes) to the newest segment of ``shard_dir``; None when it holds no
    record to copy. The file must not be open in a running server."""
    logs = sorted(shard_dir.glob("*.log"))
    if not logs:
        return None
    path = logs[-1]
    data = path.read_bytes()
    position = SEGMENT_HEADER.size if data[:4] == b"LHSG" else 0
    last = None
    while position + RECORD_HEADER.size <= len(data):
        fields = RECORD_HEADER.unpack_from(data, position)
        end = position + RECORD_HEADER.size + fields[5]
        if end > len(data):
            break
        last = (fields, data[position + RECORD_HEADER.size : end])
        position = end
    if last is None:
        return None
    (version, attributes, epoch, sequence, time_ms, _length, _crc), payload = last
    head = RECORD_HEADER.pack(version, attributes, epoch, sequence + 1, time_ms, len(payload), 0)
    crc = crc32c.crc32c(head[:26] + payload)
    record = head[:26] + struct.pack(">I", crc) + payload
    cut = rng.randint(1, min(TORN_BYTES_MAX, len(record) - 1))
    with open(path, "ab") as file:
        file.write(record[:-cut])
        file.flush()
        os.fsync(file.fileno())
    return {"file": str(path), "torn_sequence": sequence + 1, "bytes_cut": cut,
            "file_bytes_before": len(data), "garbage_before": len(data) - position}  # fmt: skip


def flip_byte(shard_dir: Path, below_seq: int, rng: random.Random) -> dict[str, Any] | None:
    """Flips one byte (XOR 0xff) of the payload of a record below ``below_seq`` (the
    shard's high watermark: an acknowledged record) in the middle of the newest segment of
    ``shard_dir`` that holds such records (from the middle half of them): never its first
    or last record, so that intact records surround the damage (damage in the middle, not a
    torn tail). None when no segment has such a record. The file must not be open in a
    running server."""
    for path in sorted(shard_dir.glob("*.log"), reverse=True):
        data = bytearray(path.read_bytes())
        records, _end = walk(bytes(data))
        # never the first or last record: intact records on both sides (damage in the middle)
        eligible = [r for r in records[1:-1] if r.sequence < below_seq and r.end > r.payload_start]
        if not eligible:
            continue
        record = eligible[rng.randrange(len(eligible) // 4, len(eligible) - len(eligible) // 4)]
        values = _values(bytes(data[record.payload_start : record.end]))
        position = rng.randrange(record.payload_start, record.end)
        with open(path, "r+b") as file:
            file.seek(position)
            file.write(bytes([data[position] ^ 0xFF]))
            file.flush()
            os.fsync(file.fileno())
        return {"dir": str(shard_dir), "file": str(path), "sequence": record.sequence,
                "position": position, "record_position": record.position,
                "records_in_file": len(records), "high_watermark": below_seq,
                "values": values}  # fmt: skip
    return None


def _values(payload: bytes) -> list[str]:
    """The ``v`` contents of a record's log group (a framed LogGroupList of one group)."""
    try:
        groups = parse_log_group_list(payload).LogGroups
    except LogHubError:
        return []
    return [c.Value for g in groups for log in g.Logs for c in log.Contents if c.Key == "v"]


@dataclass(frozen=True)
class Injection:
    """One fault as drawn: what, on which node, for how long, and its own generator."""

    kind: str
    target: int
    hold_s: float
    rng: random.Random
    detail: dict[str, Any]


@dataclass
class Nemesis:
    """Injects faults from ``rng`` until ``stop_ns``; ``heal`` then brings everything back.
    Runs in one thread of the harness; the history is its own file."""

    cluster: NemesisCluster
    rng: random.Random
    faults: tuple[str, ...]
    history: HistoryFile
    log: Callable[[str], None] = print
    killed: set[int] = field(default_factory=set)  # nodes down by our hand
    paused: set[int] = field(default_factory=set)
    etcd_down: set[int] = field(default_factory=set)
    crashes: list[str] = field(default_factory=list)  # nodes that died by themselves
    restarts_refused: list[str] = field(default_factory=list)  # the old lease still alive
    injected: list[str] = field(default_factory=list)
    started_ns: int = field(default_factory=now_ns)

    def run(self, stop_ns: int) -> None:
        while now_ns() < stop_ns:
            time.sleep(self.rng.uniform(*GAP_BETWEEN_FAULTS_S))
            if now_ns() >= stop_ns:
                return
            kind = self.rng.choice(self.faults)
            target = self.rng.randrange(len(self.cluster.nodes))
            hold_s = self.rng.uniform(1.0, NODE_TTL_S + 3.0)
            # a fault's own draws (a direction, the bytes to tear) come from a generator of
            # its own: what the cluster's state decides for one fault never shifts the next
            self.inject(kind, target, hold_s, random.Random(self.rng.getrandbits(64)))

    def inject(self, kind: str, target: int, hold_s: float, rng: random.Random) -> None:
        assert kind in FAULTS, kind
        chosen: dict[str, Any] = {}
        if kind == "kill_busiest":
            target = self.busiest()
        elif kind == "kill_leader":
            target, chosen = self.leader_to_kill(target, rng)
        elif kind == "flip_follower_byte":
            target, chosen = self.follower_to_damage(target, rng)
        if kind in ("pause_node", "partition_etcd", "partition_etcd_oneway", "isolate_node"):
            hold_s = NODE_TTL_S + 1.0 + hold_s / 2  # past the TTL: the shards must move
        if kind == "partition_replicas":
            hold_s = REPLICA_LAG_S + 1.0 + hold_s / 2  # past the lag bound: the ISR shrinks
        if kind == "kill_etcd_leader":  # the target is the leader: a member, no ranges
            target = self.cluster.etcd.members.index(self.cluster.etcd.leader())
            detail: dict[str, Any] = {"node": f"e{target}", "hold_s": round(hold_s, 2)}
        else:
            detail = {"node": f"n{target}", "hold_s": round(hold_s, 2), **chosen}
            detail["ranges"] = self.ranges_of(target)
        started = self.history.append(Op("nemesis", "invoke", kind, now_ns(), detail=detail))
        self.injected.append(kind)
        at_s = (started.time_ns - self.started_ns) / 1e9
        self.log(f"  {at_s:6.1f} s: {kind} {detail['node']} for {hold_s:.1f} s")
        act = getattr(self, ACTIONS.get(kind, f"_{kind}"))
        lifted = act(Injection(kind, target, hold_s, rng, detail))
        self.history.append(Op("nemesis", "ok", kind, now_ns(), detail=lifted or detail))

    def busiest(self) -> int:
        """The node holding the most writable shards now (the lowest index of a tie)."""
        counts = Counter(s.node for s in self.writable_shards())
        return max(range(len(self.cluster.nodes)), key=lambda i: (counts[f"n{i}"], -i))

    def records(self) -> dict[int, ReplicaRecord]:
        """The replica records, or none when etcd does not answer."""
        try:
            return self.cluster.replica_records()
        except Exception as exc:  # noqa: BLE001 (a fault then falls back to its drawn target)
            self.log(f"    replica records unreadable: {exc!r}")
            return {}

    def leader_to_kill(self, drawn: int, rng: random.Random) -> tuple[int, dict[str, Any]]:
        """The node leading the most shards (lowest index of a tie), or the leader of a
        random shard: ``rng`` picks which, by the replica records."""
        mode = rng.choice(("most", "random_shard"))
        records = self.records()
        if not records:
            return drawn, {"mode": mode, "records": "unreadable"}
        if mode == "most":
            counts = Counter(r.leader for r in records.values())
            return max(range(len(self.cluster.nodes)), key=lambda i: (counts[f"n{i}"], -i)), {
                "mode": mode
            }
        shard = rng.choice(sorted(records))
        return _index(records[shard].leader), {"mode": mode, "shard": shard}

    def follower_to_damage(self, drawn: int, rng: random.Random) -> tuple[int, dict[str, Any]]:
        """A random shard with an in-sync follower, and one of those followers."""
        records = self.records()
        shards = sorted(s for s, r in records.items() if set(r.isr) - {r.leader})
        if not shards:
            return drawn, {"shard": None}
        shard = rng.choice(shards)
        record = records[shard]
        follower = rng.choice(sorted(set(record.isr) - {record.leader}))
        return _index(follower), {"shard": shard, "leader": record.leader,
                                  "epoch": record.epoch}  # fmt: skip

    def high_watermark(self, shard: int) -> int | None:
        """The shard's high watermark (its ``end`` cursor), through the first node that
        answers; None when none does."""
        for index in range(len(self.cluster.nodes)):
            if not self.cluster.alive(index) or index in self.paused:
                continue
            node = self.cluster.nodes[index]
            try:
                with LogHubClient(node.endpoint, *next(iter(KEYS.items())), timeout_s=2) as c:
                    return decode_cursor(c.get_cursor(PROJECT, LOGSTORE, shard, "end"))
            except LogHubError:
                continue
        return None

    def ranges_of(self, target: int) -> list[tuple[str, str]]:
        """The hash ranges of the writable shards ``target`` holds now (empty when no node
        answers): writes routed there wait for the failover."""
        return [
            (s.inclusive_begin_key, s.exclusive_end_key)
            for s in self.writable_shards()
            if s.node == f"n{target}"
        ]

    def writable_shards(self) -> list[ShardInfo]:
        """The writable shards as the first node that answers lists them, with their
        nodes; none when no node answers."""
        for index in range(len(self.cluster.nodes)):
            if not self.cluster.alive(index) or index in self.paused:
                continue
            node = self.cluster.nodes[index]
            try:
                with LogHubClient(node.endpoint, *next(iter(KEYS.items())), timeout_s=2) as c:
                    return [s for s in c.list_shards(PROJECT, LOGSTORE) if s.writable]
            except LogHubError:
                continue
        return []

    # -- the faults: each returns the detail to record when lifted (None: as when started) --

    def _kill_node(self, fault: Injection) -> None:
        self.cluster.nodes[fault.target].kill()
        self.killed.add(fault.target)
        time.sleep(fault.hold_s)
        self._restart(fault.target)

    def _torn_tail(self, fault: Injection) -> dict[str, Any]:
        node = self.cluster.nodes[fault.target]
        node.kill()
        self.killed.add(fault.target)
        logs = node.data_dir.glob(f"**/{PROJECT}/{LOGSTORE}-*/*/*.log")
        shard_dirs = [p.parent for p in logs]
        shard_dirs = sorted(set(shard_dirs), key=lambda p: (-_newest_mtime_ns(p), str(p)))
        torn = None
        for shard_dir in shard_dirs:  # the shard written last first
            torn = tear_tail(shard_dir, fault.rng)
            if torn is not None:
                break
        if torn is None:
            self.log("    no record to tear (no shard of the node holds one yet)")
        time.sleep(fault.hold_s)
        self._restart(fault.target)
        return {**fault.detail, "torn": torn}

    def _flip_follower_byte(self, fault: Injection) -> dict[str, Any]:
        """The drawn shard first; when its copy holds too few acknowledged records (early in
        a run), the other shards the target follows in sync, in an order of the fault's
        generator."""
        drawn = fault.detail.get("shard")
        me = f"n{fault.target}"
        others = sorted(s for s, r in self.records().items()
                        if s != drawn and r.leader != me and me in r.isr)  # fmt: skip
        fault.rng.shuffle(others)
        shards = ([] if drawn is None else [drawn]) + others
        high_watermarks = {shard: self.high_watermark(shard) for shard in shards}
        self.cluster.nodes[fault.target].kill()
        self.killed.add(fault.target)
        flipped, shard = None, drawn
        for shard in shards:
            shard_dir = self.cluster.shard_dir(fault.target, shard)
            high_watermark = high_watermarks[shard]
            if shard_dir is not None and high_watermark:
                flipped = flip_byte(shard_dir, high_watermark, fault.rng)
            if flipped is not None:
                break
        if flipped is None:
            self.log(f"    no record to flip (high watermarks {high_watermarks})")
        else:
            self.log(
                f"    flipped byte {flipped['position']} of {flipped['file']} (seq "
                f"{flipped['sequence']}, high watermark {flipped['high_watermark']})"
            )
        time.sleep(fault.hold_s)
        self._restart(fault.target)
        return {**fault.detail, "shard": shard, "flipped": flipped}

    def _partition_replicas(self, fault: Injection) -> None:
        """The target's traffic with its peers is cut both ways; clients and etcd still
        reach everyone."""
        self.cluster.cut_peers(fault.target)
        time.sleep(fault.hold_s)
        self.cluster.heal_network()

    def _pause_node(self, fault: Injection) -> None:
        pid = self.cluster.nodes[fault.target].pid
        os.kill(pid, signal.SIGSTOP)
        self.paused.add(fault.target)
        time.sleep(fault.hold_s)
        os.kill(pid, signal.SIGCONT)
        self.paused.discard(fault.target)

    def _kill_etcd_leader(self, fault: Injection) -> None:
        etcd = self.cluster.etcd
        leader = etcd.members[fault.target]
        etcd.kill(leader)
        self.etcd_down.add(fault.target)
        time.sleep(fault.hold_s)
        etcd.start(leader, "existing")
        etcd.wait_healthy()
        self.etcd_down.discard(fault.target)

    def _partition_etcd(self, fault: Injection) -> dict[str, Any]:
        direction = fault.rng.choice(("up", "down")) if fault.kind.endswith("oneway") else "both"
        self.cluster.cut_etcd(fault.target, direction)
        time.sleep(fault.hold_s)
        self.cluster.heal_network()
        return {**fault.detail, "direction": direction}

    def _isolate_node(self, fault: Injection) -> None:
        self.cluster.isolate(fault.target)
        time.sleep(fault.hold_s)
        self.cluster.heal_network()

    def _restart(self, target: int) -> None:
        """Starts a killed node again with its data. A node started within a TTL of its
        death finds its old lease alive and exits ("node id ... is in use by a live node");
        it is started again once that lease has ended, and the refusal is noted."""
        for attempt in range(RESTARTS_MAX):
            try:
                self.cluster.start_node(target)
                break
            except RuntimeError as exc:
                if "in use by a live node" not in str(exc) or attempt == RESTARTS_MAX - 1:
                    raise
                self.restarts_refused.append(f"n{target}")
                time.sleep(NODE_TTL_S)
        self.killed.discard(target)

    def heal(self, settle_s: float) -> None:
        """Everything back: nodes resumed or restarted with their data, etcd members
        restarted, the network healed; then until the cluster has placed every shard and
        nothing waits for a node, and ``settle_s`` more."""
        self.cluster.heal_network()
        for index in sorted(self.paused):
            os.kill(self.cluster.nodes[index].pid, signal.SIGCONT)
        self.paused.clear()
        etcd = self.cluster.etcd
        for member in etcd.members:
            if member.proc is None or member.proc.poll() is not None:
                etcd.start(member, "existing")
        etcd.wait_healthy()
        for index in range(len(self.cluster.nodes)):
            if not self.cluster.alive(index):
                if index not in self.killed:
                    proc = self.cluster.nodes[index].proc
                    code = None if proc is None else proc.returncode
                    self.crashes.append(f"n{index} exited with {code} by itself")
                self._restart(index)
        self.cluster.wait_placed(timeout_s=60)
        time.sleep(settle_s)


def _newest_mtime_ns(shard_dir: Path) -> int:
    return max((p.stat().st_mtime_ns for p in shard_dir.glob("*.log")), default=0)


def _index(node_id: str) -> int:
    return int(node_id.removeprefix("n"))
