"""Prometheus metrics, served at `GET /metrics` (signed or HTTP Basic when keys are set).

One registry per application (not the process-global one), so several servers in one process
(tests, the demo) do not collide. Request counts are labelled by API, not by path, so the
label set stays small whatever names clients use: the API is the method with the path's
shape, e.g. ``GET /logstores/{logstore}/shards/{shard}?type=log``.

What is counted where, and what it costs:

- On the data path (every PutLogs and PullLogs): per (project, logstore, shard) counters.
  The four label children of a shard are looked up once and cached in one dict keyed by the
  tuple, so a request pays a dict lookup and four increments, not four label resolutions.
  Ingest counts logs (the body check counts them anyway) and uncompressed bytes; pull counts
  log groups, the unit stored and read back, because counting the logs of a reply would parse
  every byte the pull path otherwise only copies.
- On every fdatasync of a log file: one histogram observation (``StorageConfig``'s observer).
- On every heartbeat of a server-side consumer group: a counter, and counters of rebalances
  (the assignment changed) and hand-offs (a shard went from one consumer to another).
- On every error answer: a counter by LogHub error code.
- At scrape time only: disk bytes per logstore, free space, and each group's lag per shard,
  read by a collector from the service (``SnapshotSource``). Their cost grows with the number
  of shards and groups and is paid by the scraper, never by the data path.

Thread-safety: prometheus-client's metrics are thread-safe; the child cache is filled under
a lock (a lookup that misses takes it once per shard and process lifetime).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
    if selector in ("log", "cursor", "cursor_time", "heartbeat", "checkpoint", "split", "merge"):
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


@dataclass(frozen=True)
class _ShardCounters:
    ingest_logs: Counter
    ingest_bytes: Counter
    pull_log_groups: Counter
    pull_bytes: Counter


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "loghub_requests", "Requests answered, by API and HTTP status.",
            ["api", "status"], registry=self.registry,
        )  # fmt: skip
        self.request_seconds = Histogram(
            "loghub_request_seconds", "Time to answer a request, by API.", ["api"],
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )  # fmt: skip
        self.errors = Counter(
            "loghub_errors", "Error answers, by LogHub error code.", ["code"],
            registry=self.registry,
        )  # fmt: skip
        self.ingest_logs = Counter(
            "loghub_ingest_logs", "Logs stored by PutLogs.", _SHARD_LABELS,
            registry=self.registry,
        )  # fmt: skip
        self.ingest_bytes = Counter(
            "loghub_ingest_bytes", "Uncompressed bytes stored by PutLogs.", _SHARD_LABELS,
            registry=self.registry,
        )  # fmt: skip
        self.pull_log_groups = Counter(
            "loghub_pull_log_groups", "Log groups returned by PullLogs.", _SHARD_LABELS,
            registry=self.registry,
        )  # fmt: skip
        self.pull_bytes = Counter(
            "loghub_pull_bytes", "Uncompressed bytes returned by PullLogs.", _SHARD_LABELS,
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
        self._shards: dict[tuple[str, str, int], _ShardCounters] = {}
        self._shards_lock = threading.Lock()

    def _shard(self, project: str, logstore: str, shard_id: int) -> _ShardCounters:
        key = (project, logstore, shard_id)
        counters = self._shards.get(key)
        if counters is None:
            with self._shards_lock:
                labels = (project, logstore, str(shard_id))
                counters = self._shards[key] = _ShardCounters(
                    self.ingest_logs.labels(*labels),
                    self.ingest_bytes.labels(*labels),
                    self.pull_log_groups.labels(*labels),
                    self.pull_bytes.labels(*labels),
                )
        return counters

    def count_ingest(
        self, project: str, logstore: str, shard_id: int, logs: int, raw_bytes: int
    ) -> None:
        counters = self._shard(project, logstore, shard_id)
        counters.ingest_logs.inc(logs)
        counters.ingest_bytes.inc(raw_bytes)

    def count_pull(
        self, project: str, logstore: str, shard_id: int, log_groups: int, raw_bytes: int
    ) -> None:
        counters = self._shard(project, logstore, shard_id)
        counters.pull_log_groups.inc(log_groups)
        counters.pull_bytes.inc(raw_bytes)

    def count_heartbeat(self, group: tuple[str, str, str], changed: bool, handoffs: int) -> None:
        self.heartbeats.labels(*group).inc()
        if changed:
            self.rebalances.labels(*group).inc()
        if handoffs:
            self.handoffs.labels(*group).inc(handoffs)

    def forget_logstore(self, project: str, logstore: str) -> None:
        """Drops a deleted logstore's series, so that a scrape does not report it forever
        (and a new logstore of the same name starts from zero)."""
        with self._shards_lock:
            for key in [key for key in self._shards if key[:2] == (project, logstore)]:
                del self._shards[key]
                labels = (project, logstore, str(key[2]))
                for counter in (
                    self.ingest_logs,
                    self.ingest_bytes,
                    self.pull_log_groups,
                    self.pull_bytes,
                ):
                    counter.remove(*labels)

    def ingest_totals(self) -> dict[tuple[str, str], tuple[float, float]]:
        """(logs, bytes) ingested since start, per (project, logstore): for the console."""
        totals: dict[tuple[str, str], tuple[float, float]] = {}
        for counter, index in ((self.ingest_logs, 0), (self.ingest_bytes, 1)):
            for metric in counter.collect():
                for sample in metric.samples:
                    if not sample.name.endswith("_total"):
                        continue
                    key = (sample.labels["project"], sample.labels["logstore"])
                    pair = list(totals.get(key, (0.0, 0.0)))
                    pair[index] += sample.value
                    totals[key] = (pair[0], pair[1])
        return totals

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

    def watch_service(self, source: SnapshotSource) -> None:
        """Registers the scrape-time gauges: disk, free space and consumer-group lag."""
        self.registry.register(_SnapshotCollector(source))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


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


def _reader(statistics: Callable[[], ShardStoreStatistics], field: str) -> Callable[[], float]:
    def read() -> float:
        return float(getattr(statistics(), field))

    return read
