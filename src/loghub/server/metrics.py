"""Prometheus metrics, served at `GET /metrics` (no project, no auth, like /health).

One registry per application (not the process-global one), so several servers in one process
(tests, the demo) do not collide. Request counts are labelled by API, not by path, so the
label set stays small whatever names clients use: the API is the method with the path's
shape, e.g. ``GET /logstores/{logstore}/shards/{shard}?type=log``.

Thread-safety: prometheus-client's metrics are thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from loghub.storage import ShardStoreStatistics

__all__ = ["CONTENT_TYPE", "ServerMetrics", "api_label"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_SHAPES = {
    0: "/",
    1: "/logstores",
    2: "/logstores/{logstore}",
    3: "/logstores/{logstore}/{kind}",
    4: "/logstores/{logstore}/{kind}/{name}",
}


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
        self.put_groups = Counter(
            "loghub_put_groups", "Log groups stored by PutLogs.", registry=self.registry
        )
        self.put_bytes = Counter(
            "loghub_put_bytes", "Uncompressed bytes stored by PutLogs.", registry=self.registry
        )
        self.pull_groups = Counter(
            "loghub_pull_groups", "Log groups returned by PullLogs.", registry=self.registry
        )
        self.pull_bytes = Counter(
            "loghub_pull_bytes", "Uncompressed bytes returned by PullLogs.",
            registry=self.registry,
        )  # fmt: skip

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

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _reader(statistics: Callable[[], ShardStoreStatistics], field: str) -> Callable[[], float]:
    def read() -> float:
        return float(getattr(statistics(), field))

    return read
