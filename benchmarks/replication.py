"""Replication: ingest throughput and ack latency of a 3-node cluster at RF 3 beside RF 1.

Each run starts, once for each replication factor, a fresh cluster: a 3-member etcd (Debian's
``etcd-server``, started as ``tests/etcd.py`` does) and three ``loghub serve --cluster``
nodes, each with its own data directory, with ``--replication-factor 3
--min-insync-replicas 2`` or ``--replication-factor 1``. It creates a logstore of
``--shards`` shards (3: at RF 1 each node owns one, at RF 3 each node leads one and follows
the two others), waits until every shard is placed, at RF 3 with its three replicas in sync
(the ``/loghub/replicas/`` records in etcd), until every node routes each shard to that
node, and until one PutLogs per shard is acknowledged; then it measures, at both RFs:

- **A, throughput**: ``--writers`` processes, writer i sending to shard i mod shards at the
  node that leads (RF 3) or owns (RF 1) it, so that no request is forwarded; lz4 LogGroups
  of ``--logs`` access logs (~200 B each), keep-alive connections, one request in flight
  each. Logs/s and MB/s (raw LogGroup bytes) over ``--seconds`` after ``--warmup``.
- **B, ack latency**: one writer, one request in flight, groups of 16 logs, to shard 0's
  leader: p50 / p99 / p99.9 of the time from sending a PutLogs to its answer, which at
  RF 3 comes once both followers have fetched the group and fsynced it.

The runs alternate the order (RF 1 first, then RF 3 first, ...), so that both see the same
drift in the machine's load. The nodes' CPU (utime + stime of the three PIDs and their
children, from /proc) and fsyncs (``loghub_fsync_seconds_count`` of each node) over the
window are printed with the figures. All three nodes share this machine's cores and disk:
at RF 3 the machine does the work of three replicas, which a real cluster spreads over
three machines, so read the ratio as the cost of replication on one box, not as a
cluster's limit.

    .venv/bin/python benchmarks/replication.py [--seconds 10] [--runs 1] [--writers 6]
                                               [--logs 256] [--shards 3] [--smoke]

Prints figures and saves them to benchmarks/results/replication.json (RF 1 is the
reference of every RF 3 figure); asserts nothing about them.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    LOGSTORE,
    PROJECT,
    REPO_ROOT,
    Batch,
    IngestRun,
    ServerChild,
    build_batches,
    cpu_seconds_of,
    create_logstore,
    describe_filesystem,
    fmt_int,
    load_average,
    machine_summary,
    make_data_dir,
    mb,
    percentile,
    remove_tree,
    request,
    run_producers,
)
from _results import Reference, Row, save  # noqa: E402
from small_requests import RawPutSender  # noqa: E402

LATENCY_LOGS = 16  # logs per PutLogs in case B


def _load_test_etcd() -> ModuleType:
    """tests/etcd.py (the tests' throwaway etcd cluster), loaded by its path so that tests/
    does not go on sys.path."""
    spec = importlib.util.spec_from_file_location(
        "loghub_tests_etcd", REPO_ROOT / "tests" / "etcd.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


# --- etcd, read over its JSON gateway -----------------------------------------------------
# Not with loghub's EtcdStore: that is a gRPC client, and this process forks the writers.


def etcd_prefix(etcd: Any, prefix: str) -> list[tuple[str, bytes, int]]:
    """(key, value, mod revision) of every key under ``prefix``, from the first member that
    answers."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps(
        {"key": base64.b64encode(prefix.encode()).decode(),
         "range_end": base64.b64encode(end.encode()).decode()}
    ).encode()  # fmt: skip
    error: Exception | None = None
    for member in etcd.members:
        try:
            call = urllib.request.Request(member.client_url + "/v3/kv/range", body, method="POST")
            with urllib.request.urlopen(call, timeout=2) as reply:
                kvs = json.loads(reply.read()).get("kvs", [])
        except (OSError, ValueError) as exc:
            error = exc
            continue
        return [
            (
                base64.b64decode(kv["key"]).decode(),
                base64.b64decode(kv.get("value", "")),
                int(kv.get("mod_revision", 0)),
            )
            for kv in kvs
        ]
    raise RuntimeError(f"no etcd member answered: {error!r}")


def shard_holders(etcd: Any, rf: int) -> dict[int, tuple[str, tuple[str, ...]]]:
    """Shard id -> (the node that leads or owns it, its in-sync replicas) as etcd records
    them: the ``/loghub/replicas/`` records at RF > 1, the placement record at RF 1."""
    from loghub.cluster.controller import PlacementRecord, placement_key
    from loghub.cluster.replicas import REPLICAS_PREFIX, ReplicaRecord

    found: dict[int, tuple[str, tuple[str, ...]]] = {}
    if rf > 1:
        for key, value, revision in etcd_prefix(etcd, f"{REPLICAS_PREFIX}{PROJECT}/{LOGSTORE}/"):
            record = ReplicaRecord.decode(key, value, revision)
            found[record.shard_id] = (record.leader, record.isr)
    else:
        for key, value, revision in etcd_prefix(etcd, placement_key(PROJECT, LOGSTORE)):
            if key != placement_key(PROJECT, LOGSTORE):
                continue
            placement = PlacementRecord.decode(PROJECT, LOGSTORE, value, revision)
            if not placement.handover:
                found = {s: (owner, (owner,)) for s, owner in placement.owners.items()}
    return found


# --- a cluster ----------------------------------------------------------------------------


@dataclass
class Cluster:
    etcd: Any  # tests/etcd.py's EtcdCluster
    rf: int
    base: Path
    nodes: list[ServerChild] = field(default_factory=list)
    leaders: dict[int, int] = field(default_factory=dict)  # shard -> index of its node

    def node_ids(self) -> list[str]:
        return [f"n{i}" for i in range(len(self.nodes))]

    def start(self, count: int, min_insync: int, timeout_s: float = 60.0) -> None:
        """Starts ``count`` nodes at once and waits until each answers /health."""
        for index in range(count):
            data_dir = self.base / f"n{index}"
            data_dir.mkdir(parents=True)
            node = ServerChild(data_dir)
            extra = [
                "--cluster", self.etcd.url, "--node-id", f"n{index}",
                "--advertise", f"127.0.0.1:{node.port}", "--replication-factor", str(self.rf),
            ]  # fmt: skip
            if self.rf > 1:
                extra += ["--min-insync-replicas", str(min_insync)]
            node.args += extra
            self.nodes.append(node)  # before it starts, so that stop() finds it
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            for started in [pool.submit(node.start, timeout_s) for node in self.nodes]:
                started.result()

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to every node this cluster started (by PID), all at once, then SIGKILL to
        any still there after ``timeout_s``."""
        running = [n.proc for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(f"--- node n{i}:\n{n.log()[-1500:]}" for i, n in enumerate(self.nodes))

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds_of(node.pid) for node in self.nodes)

    def fsyncs(self) -> float:
        total = 0.0
        for node in self.nodes:
            status, _, data = request(node.port, "GET", "/metrics", host="127.0.0.1")
            found = re.search(rb"^loghub_fsync_seconds_count (\S+)$", data, re.MULTILINE)
            total += float(found.group(1)) if status == 200 and found else float("nan")
        return total

    def settle(self, shards: int, timeout_s: float = 60.0) -> str:
        """Creates the logstore and waits until it is ready for the measure (see the module's
        docstring); returns where the shards went, for the print."""
        deadline = time.monotonic() + timeout_s
        from loghub.cluster.membership import NODES_PREFIX

        while len(etcd_prefix(self.etcd, NODES_PREFIX)) < len(self.nodes):
            self._before(deadline, "every node registered")
        while True:  # the first node may answer before the cluster takes metadata writes
            try:
                create_logstore(self.nodes[0].port, shards)
                break
            except RuntimeError as exc:
                self._before(deadline, f"the logstore created ({exc})")
        ids = self.node_ids()
        while True:
            holders = shard_holders(self.etcd, self.rf)
            if len(holders) == shards and all(
                leader in ids and len(isr) == self.rf for leader, isr in holders.values()
            ):
                break
            self._before(deadline, f"every shard placed with a full ISR ({holders})")
        self.leaders = {shard: ids.index(leader) for shard, (leader, _) in holders.items()}
        for node in self.nodes:  # each node's own view: a direct write is not forwarded
            while self._routes(node) != {s: f"n{i}" for s, i in self.leaders.items()}:
                self._before(deadline, f"node {node.port} routing to the leaders")
        batch = build_batches(1, 1)[0]
        for shard, index in self.leaders.items():
            while True:
                status, _, body = request(
                    self.nodes[index].port, "POST", f"/logstores/{LOGSTORE}/shards/{shard}",
                    batch.body,
                    {"Content-Type": "application/x-protobuf", "x-log-apiversion": "0.6.0",
                     "x-log-compresstype": "lz4", "x-log-bodyrawsize": str(batch.raw_size)},
                )  # fmt: skip
                if status == 200:
                    break
                self._before(
                    deadline, f"a write to shard {shard} acknowledged ({status} {body[:200]!r})"
                )
        per_node = [sorted(s for s, i in self.leaders.items() if i == n) for n in range(len(ids))]
        role = "leads" if self.rf > 1 else "owns"
        return ", ".join(f"n{n} {role} {shards_of or '-'}" for n, shards_of in enumerate(per_node))

    def _routes(self, node: ServerChild) -> dict[int, str]:
        status, _, body = request(node.port, "GET", f"/logstores/{LOGSTORE}/shards")
        if status != 200:
            return {}
        return {int(s["shardID"]): str(s.get("node")) for s in json.loads(body)}

    def _before(self, deadline: float, what: str) -> None:
        for index, node in enumerate(self.nodes):
            if node.proc is not None and node.proc.poll() is not None:
                raise RuntimeError(f"node n{index} exited: {node.log()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")
        time.sleep(0.1)

    def isr_changes(self, shards: int) -> list[str]:
        """The shards whose leader or ISR is no longer the one measured from."""
        changed = []
        for shard, (leader, isr) in sorted(shard_holders(self.etcd, self.rf).items()):
            if leader != f"n{self.leaders.get(shard)}" or len(isr) != self.rf:
                changed.append(f"shard {shard}: leader {leader}, ISR {list(isr)}")
        return changed


@contextlib.contextmanager
def running_cluster(etcd_module: ModuleType, base: Path, rf: int, nodes: int,
                    min_insync: int) -> Iterator[Cluster]:  # fmt: skip
    """A fresh 3-member etcd and ``nodes`` LogHub nodes; every process stopped at the end,
    also on an exception (the nodes first, then etcd)."""
    with etcd_module.running_etcd(3) as etcd:
        cluster = Cluster(etcd, rf, base)
        try:
            cluster.start(nodes, min_insync)
            yield cluster
        finally:
            cluster.stop()


# --- the cases ----------------------------------------------------------------------------


class RoutedSender(RawPutSender):
    """RawPutSender to the port named in the path, ``<port>|<path>``: run_producers gives
    every producer the same port, and each writer here has its shard's node."""

    def __init__(self, _port: int, batches: list[Batch], path: str) -> None:
        port, _, real_path = path.partition("|")
        super().__init__(int(port), batches, real_path)


@dataclass
class Measure:
    run: IngestRun
    cpu_s: float  # the three nodes' CPU inside the window
    fsyncs: float  # the three nodes' fsyncs over the whole case (warm-up included)

    @property
    def requests(self) -> int:
        return self.run.total("ok_requests")

    @property
    def fsyncs_per_request(self) -> float:
        """Over every request sent in the case, as the fsyncs are counted."""
        sent = self.run.total("total_requests")
        return self.fsyncs / sent if sent else float("nan")


def measure(cluster: Cluster, batches: list[Batch], writers: int, args: argparse.Namespace
            ) -> Measure:  # fmt: skip
    """Writer i to shard i mod shards at its leader; the nodes' CPU over the window."""
    paths = tuple(
        f"{cluster.nodes[cluster.leaders[shard]].port}|/logstores/{LOGSTORE}/shards/{shard}"
        for shard in range(min(writers, len(cluster.leaders)))
    )
    window_start = time.monotonic() + 0.5 + args.warmup  # as run_producers places it
    cpu: list[float] = []

    def sample() -> None:
        for at in (window_start, window_start + args.seconds):
            time.sleep(max(0.0, at - time.monotonic()))
            cpu.append(cluster.cpu_seconds())

    fsyncs_before = cluster.fsyncs()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        sampled = pool.submit(sample)
        run = run_producers(
            SimpleNamespace(port=0, pid=cluster.nodes[0].pid), batches, writers, paths=paths,
            warmup_s=args.warmup, seconds=args.seconds, sender_factory=RoutedSender,
        )  # fmt: skip
        sampled.result()
    return Measure(run, cpu[1] - cpu[0], cluster.fsyncs() - fsyncs_before)


@dataclass
class Series:
    """The runs of one replication factor."""

    logs_per_s: list[float] = field(default_factory=list)
    mb_per_s: list[float] = field(default_factory=list)
    cores: list[float] = field(default_factory=list)  # the nodes' CPU / wall, case A
    fsyncs_per_request: list[float] = field(default_factory=list)  # case A
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    p999_ms: list[float] = field(default_factory=list)
    latency_samples: list[int] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)


def _errors(run: IngestRun, into: dict[str, int]) -> str:
    for key, value in run.errors.items():
        into[key] = into.get(key, 0) + value
    if not run.errors:
        return ""
    top = sorted(run.errors.items(), key=lambda kv: -kv[1])[:3]
    return "; ERRORS: " + "; ".join(f"{v} x {k[:160]}" for k, v in top)


def measure_rf(cluster: Cluster, args: argparse.Namespace, throughput: list[Batch],
               small: list[Batch], series: Series) -> None:  # fmt: skip
    a = measure(cluster, throughput, args.writers, args)
    window = a.run.window_s
    logs_per_s = a.run.total("ok_logs") / window
    series.logs_per_s.append(logs_per_s)
    series.mb_per_s.append(mb(a.run.total("ok_raw_bytes")) / window)
    series.cores.append(a.cpu_s / window)
    series.fsyncs_per_request.append(a.fsyncs_per_request)
    print(
        f"    A: {fmt_int(logs_per_s)} logs/s, {series.mb_per_s[-1]:.1f} MB/s raw, "
        f"{a.requests / window:.0f} PutLogs/s, p50 "
        f"{1e3 * percentile(a.run.latencies_s, 0.5):.1f} ms; nodes' CPU "
        f"{series.cores[-1]:.2f} cores, {series.fsyncs_per_request[-1]:.2f} fsyncs/PutLogs "
        f"(all nodes){_errors(a.run, series.errors)}"
    )
    b = measure(cluster, small, 1, args)
    latencies = b.run.latencies_s
    series.p50_ms.append(1e3 * percentile(latencies, 0.5))
    series.p99_ms.append(1e3 * percentile(latencies, 0.99))
    series.p999_ms.append(1e3 * percentile(latencies, 0.999))
    series.latency_samples.append(len(latencies))
    print(
        f"    B: ack latency p50 {series.p50_ms[-1]:.2f} ms, p99 {series.p99_ms[-1]:.2f} ms, "
        f"p99.9 {series.p999_ms[-1]:.2f} ms ({len(latencies)} PutLogs of {LATENCY_LOGS} logs, "
        f"{b.fsyncs_per_request:.2f} fsyncs/PutLogs)"
        f"{_errors(b.run, series.errors)}"
    )
    changed = cluster.isr_changes(len(cluster.leaders))
    if changed:
        print(f"    leadership or ISR changed during the cases: {'; '.join(changed)}")
        series.errors[f"RF {cluster.rf}: leadership or ISR changed: {'; '.join(changed)}"] = 1


def _load() -> str:
    return load_average().removeprefix("load ").removesuffix(" (1/5/15 min)")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: list[float], digits: int = 0) -> str:
    if not values:
        return "-"
    shown = [f"{v:,.{digits}f}" for v in (median(values), min(values), max(values))]
    return f"{shown[0]} ({shown[1]}-{shown[2]})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds a case (10)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds a case (1)")
    parser.add_argument("--runs", type=int, default=1, help="runs of both RFs, interleaved (1)")
    parser.add_argument("--writers", type=int, default=6, help="writer processes in case A (6)")
    parser.add_argument("--logs", type=int, default=256, help="logs per PutLogs in case A (256)")
    parser.add_argument("--shards", type=int, default=3, help="shards of the logstore (3)")
    parser.add_argument(
        "--min-insync-replicas", type=int, default=2, help="at RF 3 (2, the default)"
    )
    parser.add_argument("--data-dir", default=None, help="parent of the temp data directory")
    parser.add_argument("--smoke", action="store_true", help="a tiny run (1 s a case, 1 writer)")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.warmup, args.runs, args.writers, args.logs = 1.0, 0.2, 1, 1, 64
    etcd_module = _load_test_etcd()
    etcd_module.find_etcd()  # EtcdNotInstalled says what to install

    print(f"machine: {machine_summary()}; {load_average()}")
    data_dir = make_data_dir(args.data_dir, "loghub-bench-replication-")
    print(f"data dir: {data_dir} on {describe_filesystem(data_dir)}")
    throughput = build_batches(16, args.logs)
    small = build_batches(16, LATENCY_LOGS)
    series = {1: Series(), 3: Series()}
    loads = [f"start {_load()}"]
    try:
        for run in range(args.runs):
            for rf in (1, 3) if run % 2 == 0 else (3, 1):
                print(f"run {run + 1} of {args.runs}, RF {rf} ({load_average()})")
                started = time.monotonic()
                base = data_dir / f"run{run}-rf{rf}"
                with running_cluster(etcd_module, base, rf, 3, args.min_insync_replicas) as cluster:
                    where = cluster.settle(args.shards)
                    print(f"    cluster ready in {time.monotonic() - started:.1f} s: {where}")
                    measure_rf(cluster, args, throughput, small, series[rf])
                loads.append(f"after run {run + 1} RF {rf} {_load()}")
                remove_tree(base)
    finally:
        remove_tree(data_dir)
    loads.append(f"end {_load()}")
    rows = summarise(series, args)
    notes = [
        f"3 nodes and a 3-member etcd on this one machine (all share its cores and disk), a "
        f"fresh cluster for each RF in each run; {args.shards} shards; {args.runs} runs of "
        f"{args.seconds:g} s a case after {args.warmup:g} s of warm-up, the RF order "
        "alternating; fsync always",
        f"A: {args.writers} writer processes, {args.logs} logs (~200 B) a PutLogs (lz4), one "
        "request in flight each, each writer straight to its shard's leader (RF 1: owner); "
        "MB/s counts raw LogGroup bytes",
        f"B: 1 writer, {LATENCY_LOGS} logs a PutLogs, one in flight, to shard 0's leader; "
        "'added' is RF 3 - RF 1 in the same run",
        "RF 3: --min-insync-replicas "
        f"{args.min_insync_replicas}; a write is acknowledged once all 3 in-sync replicas "
        "fsynced it",
        "load average (1/5/15 min): " + "; ".join(loads),
    ]
    for rf in (1, 3):
        for key, value in sorted(series[rf].errors.items(), key=lambda kv: -kv[1])[:5]:
            notes.append(f"RF {rf} errors: {value} x {key[:200]}")
    path = save("replication", "Replication: RF 3 beside RF 1 on a 3-node cluster", rows, notes)
    print(f"saved {path}")


def summarise(series: dict[int, Series], args: argparse.Namespace) -> list[Row]:
    one, three = series[1], series[3]
    ratio = median(three.logs_per_s) / (median(one.logs_per_s) or float("nan"))
    added_p50 = [b - a for a, b in zip(one.p50_ms, three.p50_ms, strict=True)]
    added_p99 = [b - a for a, b in zip(one.p99_ms, three.p99_ms, strict=True)]
    print(f"summary, median (min-max) of {args.runs} runs ({load_average()}):")
    for rf, s in series.items():
        print(
            f"  RF {rf}: A {spread(s.logs_per_s)} logs/s, {spread(s.mb_per_s, 1)} MB/s, nodes "
            f"{spread(s.cores, 2)} cores, {spread(s.fsyncs_per_request, 2)} fsyncs/PutLogs; "
            f"B p50 {spread(s.p50_ms, 2)} ms, p99 {spread(s.p99_ms, 2)} ms, p99.9 "
            f"{spread(s.p999_ms, 2)} ms"
        )
    print(
        f"  RF 3 / RF 1 throughput: {ratio:.2f}x; added ack latency p50 {spread(added_p50, 2)} "
        f"ms, p99 {spread(added_p99, 2)} ms"
    )
    case_a = f"{args.writers} writers x {args.logs} logs, {args.shards} shards, RF 3"
    case_b = f"1 writer x {LATENCY_LOGS} logs, RF 3"
    reference = "RF 1, 3 nodes, same run"
    rows = [
        Row(case_a, "logs/s", three.logs_per_s, reference=Reference(reference, one.logs_per_s),
            extra={"nodes_cores": three.cores, "reference_nodes_cores": one.cores,
                   "fsyncs_per_putlogs": three.fsyncs_per_request,
                   "reference_fsyncs_per_putlogs": one.fsyncs_per_request}),
        Row(case_a, "MB/s", three.mb_per_s, reference=Reference(reference, one.mb_per_s)),
    ]  # fmt: skip
    for metric, mine, theirs in (
        ("p50 ack ms", three.p50_ms, one.p50_ms),
        ("p99 ack ms", three.p99_ms, one.p99_ms),
        ("p99.9 ack ms", three.p999_ms, one.p999_ms),
    ):
        rows.append(
            Row(case_b, metric, mine, reference=Reference(reference, theirs),
                higher_is_better=False,
                extra={"samples": three.latency_samples,
                       "reference_samples": one.latency_samples})
        )  # fmt: skip
    rows += [
        Row(f"{case_b} minus RF 1, p50", "added ack ms", added_p50, higher_is_better=False),
        Row(f"{case_b} minus RF 1, p99", "added ack ms", added_p99, higher_is_better=False),
    ]  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
