"""Prometheus metrics, served at `GET /metrics` (signed or HTTP Basic when keys are set).

One registry per application (not the process-global one), so several servers in one process
(tests, the demo) do not collide. Request counts are labelled by API, not by path, so the
label set stays small whatever names clients use: the API is the method with the path's
shape, e.g. ``GET /logstores/{logstore}/shards/{shard}?type=log``.

What is counted where, and what it costs:

- On the data path (every PutLogs and PullLogs): per (project, logstore, shard) counters,
  and per request its API's count, by status, and its time. These are plain integers in
  dicts (``_ShardTally``, ``_RequestTally``) under one lock, turned into Prometheus series
  by a collector at scrape time: a request pays a dict lookup and a few additions (well
  under a microsecond), not prometheus-client's label resolution and per-value locks.
  Ingest counts logs (the body check counts them anyway) and uncompressed bytes; pull counts
  log groups, the unit stored and read back, because counting the logs of a reply would parse
  every byte the pull path otherwise only copies.
- On every fdatasync of a log file: one histogram observation (``StorageConfig``'s observer).
- On every heartbeat of a server-side consumer group: a counter, and counters of rebalances
  (the assignment changed) and hand-offs (a shard went from one consumer to another).
- On every error answer: a counter by LogHub error code.
- In a cluster, on every request passed on to another node: a counter by API.
- At scrape time only: disk bytes per logstore, free space, and each group's lag per shard,
  read by a collector from the service (``SnapshotSource``). Their cost grows with the number
  of shards and groups and is paid by the scraper, never by the data path. In a cluster
  also the cluster's status as this node sees it (``NodeAgent.status``, built from the
  agent's dictionaries, which its loop replaces and never changes in place, so a scrape
  thread reads them whole).

Thread-safety: prometheus-client's metrics are thread-safe; the child cache is filled under
a lock (a lookup that misses takes it once per shard and process lifetime).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from loghub.server.admission import BodyBudget
from loghub.storage import ShardStoreStatistics

__all__ = [
    "CONTENT_TYPE",
    "GroupShardLag",
    "LogstoreDisk",
    "ServerMetrics",
    "SnapshotSource",
    "api_label",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_SHAPES = {
    0: "/",
    1: "/logstores",
    2: "/logstores/{logstore}",
    3: "/logstores/{logstore}/{kind}",
    4: "/logstores/{logstore}/{kind}/{name}",
}
_SHARD_LABELS = ("project", "logstore", "shard")
_GROUP_LABELS = ("project", "logstore", "consumer_group")
# fdatasync on a local disk takes 0.1-20 ms; a slow or shared disk up to seconds.
_FSYNC_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


def api_label(method: str, parts: list[str], query: dict[str, str]) -> str:
    """The request's API: its method, the shape of its path, and the operation selector."""
    if parts and parts[0] != "logstores":
        return f"{method} unknown"
    shape = _SHAPES.get(len(parts), "unknown")
    if len(parts) >= 3:
        kind = parts[2] if parts[2] in ("shards", "consumergroups") else "unknown"
        shape = shape.replace("{kind}", kind)
        if len(parts) == 4:
            shape = shape.replace("{name}", "{shard}" if kind == "shards" else "{group}")
    selector = query.get("type") or query.get("action")
    if selector in (
        "log",
        "cursor",
        "cursor_time",
        "heartbeat",
        "checkpoint",
        "split",
        "merge",
        "replica",
    ):
        shape += f"?{'action' if 'action' in query else 'type'}={selector}"
    return f"{method} {shape}"


@dataclass(frozen=True)
class GroupShardLag:
    """How far one consumer group is behind on one shard, for the lag gauges."""

    project: str
    logstore: str
    group: str
    shard_id: int
    lag_log_groups: int  # stored log groups after the checkpoint
    lag_s: float  # newest data's receive time minus that of the first unread group


@dataclass(frozen=True)
class LogstoreDisk:
    project: str
    logstore: str
    size_bytes: int  # committed bytes of its shard logs on disk


class SnapshotSource(Protocol):
    """What the scrape-time collector reads from the service."""

    def logstore_disk(self) -> list[LogstoreDisk]: ...

    def group_lags(self) -> list[GroupShardLag]: ...

    def disk_free_bytes(self) -> int: ...


class _ShardTally:
    """A shard's data-path counters, plain integers (see the module docstring)."""

    __slots__ = ("ingest_bytes", "ingest_logs", "pull_bytes", "pull_log_groups")

    def __init__(self) -> None:
        self.ingest_logs = self.ingest_bytes = self.pull_log_groups = self.pull_bytes = 0


_REQUEST_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class _RequestTally:
    """One API's answers: how many by status, and a histogram of their times."""

    __slots__ = ("by_status", "in_bucket", "sum_s")

    def __init__(self) -> None:
        self.by_status: dict[int, int] = {}
        self.in_bucket = [0] * (len(_REQUEST_BUCKETS_S) + 1)  # the last: over the largest
        self.sum_s = 0.0


# (counter name, help, _ShardTally attribute)
_SHARD_SERIES = (
    ("loghub_ingest_logs", "Logs stored by PutLogs.", "ingest_logs"),
    ("loghub_ingest_bytes", "Uncompressed bytes stored by PutLogs.", "ingest_bytes"),
    ("loghub_pull_log_groups", "Log groups returned by PullLogs.", "pull_log_groups"),
    ("loghub_pull_bytes", "Uncompressed bytes returned by PullLogs.", "pull_bytes"),
)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.errors = Counter(
            "loghub_errors", "Error answers, by LogHub error code.", ["code"],
            registry=self.registry,
        )  # fmt: skip
        self.fsync_seconds = Histogram(
            "loghub_fsync_seconds", "Time an fdatasync of a shard's log file took.",
            registry=self.registry, buckets=_FSYNC_BUCKETS_S,
        )  # fmt: skip
        self.heartbeats = Counter(
            "loghub_consumer_group_heartbeats", "Heartbeats of server-side consumer groups.",
            _GROUP_LABELS, registry=self.registry,
        )  # fmt: skip
        self.rebalances = Counter(
            "loghub_consumer_group_rebalances",
            "Heartbeats after which a group's assignment of shards had changed.",
            _GROUP_LABELS, registry=self.registry,
        )  # fmt: skip
        self.handoffs = Counter(
            "loghub_consumer_group_handoffs",
            "Shards that went from one live consumer to another.",
            _GROUP_LABELS, registry=self.registry,
        )  # fmt: skip
        # in a cluster: how many requests a node could not serve itself (its clients' shard
        # lists, or their choice of node, cost a hop); a pull here means a reader that did not
        # go to the shard's owner
        self.forwarded = Counter(
            "loghub_cluster_forwarded_requests",
            "Requests passed on to the node that serves them (cluster mode), by API.",
            ["api"], registry=self.registry,
        )  # fmt: skip
        self._tally_lock = threading.Lock()
        self._shards: dict[tuple[str, str, int], _ShardTally] = {}
        self._requests: dict[str, _RequestTally] = {}
        self.registry.register(_TallyCollector(self))

    def _shard(self, key: tuple[str, str, int]) -> _ShardTally:
        tally = self._shards.get(key)
        if tally is None:
            tally = self._shards[key] = _ShardTally()
        return tally

    def count_request(self, api: str, status: int, elapsed_s: float) -> None:
        with self._tally_lock:
            tally = self._requests.get(api)
            if tally is None:
                tally = self._requests[api] = _RequestTally()
            tally.by_status[status] = tally.by_status.get(status, 0) + 1
            tally.in_bucket[bisect.bisect_left(_REQUEST_BUCKETS_S, elapsed_s)] += 1
            tally.sum_s += elapsed_s

    def count_ingest(
        self, project: str, logstore: str, shard_id: int, logs: int, raw_bytes: int
    ) -> None:
        with self._tally_lock:
            tally = self._shard((project, logstore, shard_id))
            tally.ingest_logs += logs
            tally.ingest_bytes += raw_bytes

    def count_pull(
        self, project: str, logstore: str, shard_id: int, log_groups: int, raw_bytes: int
    ) -> None:
        with self._tally_lock:
            tally = self._shard((project, logstore, shard_id))
            tally.pull_log_groups += log_groups
            tally.pull_bytes += raw_bytes

    def count_heartbeat(self, group: tuple[str, str, str], changed: bool, handoffs: int) -> None:
        self.heartbeats.labels(*group).inc()
        if changed:
            self.rebalances.labels(*group).inc()
        if handoffs:
            self.handoffs.labels(*group).inc(handoffs)

    def forget_logstore(self, project: str, logstore: str) -> None:
        """Drops a deleted logstore's series, so that a scrape does not report it forever
        (and a new logstore of the same name starts from zero)."""
        with self._tally_lock:
            for key in [key for key in self._shards if key[:2] == (project, logstore)]:
                del self._shards[key]

    def ingest_totals(self) -> dict[tuple[str, str], tuple[float, float]]:
        """(logs, bytes) ingested since start, per (project, logstore): for the console."""
        totals: dict[tuple[str, str], tuple[float, float]] = {}
        with self._tally_lock:
            for (project, logstore, _shard_id), tally in self._shards.items():
                logs, size = totals.get((project, logstore), (0.0, 0.0))
                totals[(project, logstore)] = (logs + tally.ingest_logs, size + tally.ingest_bytes)
        return totals

    def tallies(self) -> tuple[list[tuple[tuple[str, str, int], _ShardTally]], list[Metric]]:
        """A copy of the shard tallies and the request families, for the collector."""
        with self._tally_lock:
            shards = []
            for key, tally in self._shards.items():
                copy = _ShardTally()
                for name in _ShardTally.__slots__:
                    setattr(copy, name, getattr(tally, name))
                shards.append((key, copy))
            requests = CounterMetricFamily(
                "loghub_requests", "Requests answered, by API and HTTP status.",
                labels=["api", "status"],
            )  # fmt: skip
            seconds = HistogramMetricFamily(
                "loghub_request_seconds", "Time to answer a request, by API.", labels=["api"]
            )
            for api, request_tally in self._requests.items():
                for status, count in request_tally.by_status.items():
                    requests.add_metric([api, str(status)], count)
                cumulative, buckets = 0, []
                for bound, count in zip(
                    (*_REQUEST_BUCKETS_S, float("inf")), request_tally.in_bucket, strict=True
                ):
                    cumulative += count
                    buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
                seconds.add_metric([api], buckets, request_tally.sum_s)
        return shards, [requests, seconds]

    def watch_storage(self, statistics: Callable[[], ShardStoreStatistics]) -> None:
        """Gauges read from the shard store at each scrape: damage found on disk (what an
        operator must hear about, see docs/operations.md) and descriptors held."""
        gauges = (
            ("loghub_storage_lost_records", "Log groups lost to damage on disk, found so far "
             "in the open shards (reads of them get DataCorrupted).", "lost_record_count"),
            ("loghub_storage_lost_ranges", "Damaged ranges found so far in the open shards.",
             "lost_range_count"),
            ("loghub_storage_open_files", "Log file descriptors open right now.",
             "open_file_count"),
            ("loghub_storage_open_shards", "Shard logs open.", "open_shard_count"),
        )  # fmt: skip
        for name, help_text, field in gauges:
            gauge = Gauge(name, help_text, registry=self.registry)
            gauge.set_function(_reader(statistics, field))

    def watch_body_budget(self, budget: BodyBudget) -> None:
        """Gauges of the request-body budget (``--inflight-body-bytes-max``): how much of it
        is taken, and how many requests wait for room (each gets 503 if it waits past
        ``--inflight-wait-s``)."""
        in_use = Gauge(
            "loghub_http_body_bytes_in_use",
            "Bytes of the request-body budget held by requests being handled.",
            registry=self.registry,
        )
        in_use.set_function(lambda: float(budget.in_use_bytes))
        waiting = Gauge(
            "loghub_http_bodies_waiting",
            "Requests waiting for room in the request-body budget.",
            registry=self.registry,
        )
        waiting.set_function(lambda: float(budget.waiting))

    def watch_service(self, source: SnapshotSource) -> None:
        """Registers the scrape-time gauges: disk, free space and consumer-group lag."""
        self.registry.register(_SnapshotCollector(source))

    def watch_cluster(self, status: Callable[[], dict[str, Any] | None]) -> None:
        """Registers the cluster gauges, read at scrape time from ``status`` (the node's
        view in the shape of ``loghub cluster status --json``; None before it joined)."""
        self.registry.register(_ClusterCollector(status))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _TallyCollector(Collector):
    """The data-path counters, read from their tallies at scrape time."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        shards, request_families = self._metrics.tallies()
        for name, help_text, attribute in _SHARD_SERIES:
            family = CounterMetricFamily(name, help_text, labels=list(_SHARD_LABELS))
            for (project, logstore, shard_id), tally in shards:
                family.add_metric([project, logstore, str(shard_id)], getattr(tally, attribute))
            yield family
        yield from request_families


class _SnapshotCollector(Collector):
    def __init__(self, source: SnapshotSource) -> None:
        self._source = source

    def describe(self) -> Iterable[Metric]:
        return []  # the names are fixed, but reading them on registration would scan disk

    def collect(self) -> Iterator[Metric]:
        free = GaugeMetricFamily(
            "loghub_disk_free_bytes", "Free bytes on the file system of the data directory."
        )
        free.add_metric([], float(self._source.disk_free_bytes()))
        yield free
        disk = GaugeMetricFamily(
            "loghub_logstore_disk_bytes",
            "Bytes of a logstore's shard logs on disk.",
            labels=["project", "logstore"],
        )
        for item in self._source.logstore_disk():
            disk.add_metric([item.project, item.logstore], float(item.size_bytes))
        yield disk
        labels = [*_GROUP_LABELS, "shard"]
        lag_groups = GaugeMetricFamily(
            "loghub_consumer_group_lag_log_groups",
            "Log groups stored after a consumer group's checkpoint in a shard.",
            labels=labels,
        )
        lag_seconds = GaugeMetricFamily(
            "loghub_consumer_group_lag_seconds",
            "Receive time of a shard's newest data minus that of the first group a consumer "
            "group has not checkpointed (0 when it is caught up).",
            labels=labels,
        )
        for lag in self._source.group_lags():
            values = [lag.project, lag.logstore, lag.group, str(lag.shard_id)]
            lag_groups.add_metric(values, float(lag.lag_log_groups))
            lag_seconds.add_metric(values, lag.lag_s)
        yield lag_groups
        yield lag_seconds


class _ClusterCollector(Collector):
    """What ``loghub cluster status`` shows, as this node sees it: a scrape of any node
    tells whether the cluster has a controller, which nodes are in it, and what waits."""

    def __init__(self, status: Callable[[], dict[str, Any] | None]) -> None:
        self._status = status

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        if status is None:
            return
        nodes = GaugeMetricFamily(
            "loghub_cluster_nodes", "Nodes holding a live lease in the cluster."
        )
        nodes.add_metric([], float(len(status["nodes"])))
        yield nodes
        shards = GaugeMetricFamily(
            "loghub_cluster_node_shards",
            "Writable shards placed on a live node (rack and drain mark as labels).",
            labels=["node", "rack", "draining"],
        )
        for node in status["nodes"]:
            labels = [node["node"], node["rack"], "1" if node["draining"] else "0"]
            shards.add_metric(labels, float(node["shards"]))
        yield shards
        controller = GaugeMetricFamily(
            "loghub_cluster_controller_epoch",
            "The controller's epoch (its key's create revision), labelled with its node; "
            "absent while no node is controller.",
            labels=["node"],
        )
        if status["controller"] is not None:
            controller.add_metric([status["controller"]], float(status["controller_epoch"]))
        yield controller
        unavailable = GaugeMetricFamily(
            "loghub_cluster_unavailable_shards",
            "Shards placed on a node that is gone (with one replica, unreadable until it returns).",
        )
        unavailable.add_metric([], float(len(status["unavailable_shards"])))
        yield unavailable
        moving = GaugeMetricFamily(
            "loghub_cluster_handovers", "Shards being handed over to another node."
        )
        moving.add_metric([], float(len(status["handovers"])))
        yield moving
        lagging = GaugeMetricFamily(
            "loghub_cluster_under_replicated_shards",
            "Replicated shards with fewer replicas in sync than they have.",
        )
        lagging.add_metric([], float(len(status["under_replicated_shards"])))
        yield lagging


def _reader(statistics: Callable[[], ShardStoreStatistics], field: str) -> Callable[[], float]:
    def read() -> float:
        return float(getattr(statistics(), field))

    return read
