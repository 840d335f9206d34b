"""GET /metrics: request counts by API and status, the data path's volumes per logstore and
shard, fsync and disk figures, and consumer-group lag, heartbeats, rebalances and hand-offs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from heartbeat_members import HeartbeatMembers
from prometheus_client.parser import text_string_to_metric_families
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.errors import LogStoreNotExist
from loghub.server.config import ServerConfig
from loghub.server.embedded import EmbeddedServer
from loghub.server.metrics import ServerMetrics, api_label
from loghub.wire.logs import make_log_group


def _value(text: str, prefix: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, (prefix, lines)
    return float(lines[0].rsplit(" ", 1)[1])


def test_metrics_count_requests_by_api_and_the_bytes_stored_and_pulled(tmp_path: Path) -> None:
    config = ServerConfig(data_dir=tmp_path / "data", port=0)
    with EmbeddedServer(config) as server, LogHubClient(server.endpoint) as client:
        client.create_project("metrics")
        client.create_logstore("metrics", "store", shard_count=1)
        group = make_log_group([(1_700_000_000, {"k": "v" * 100})] * 3)
        for _ in range(4):
            client.put_log_group("metrics", "store", group)
        client.pull_logs("metrics", "store", 0, "MA==")
        with pytest.raises(LogStoreNotExist):
            client.get_logstore("metrics", "missing")
        with httpx.Client(trust_env=False) as http:
            text = http.get(f"http://{server.endpoint}/metrics").text
    raw_size = len(group.SerializeToString())
    shard = '{logstore="store",project="metrics",shard="0"}'
    assert _value(text, "loghub_ingest_logs_total" + shard) == 4 * 3
    assert _value(text, "loghub_ingest_bytes_total" + shard) == 4 * raw_size
    assert _value(text, "loghub_pull_log_groups_total" + shard) == 4
    assert _value(text, 'loghub_errors_total{code="LogStoreNotExist"}') == 1
    assert (
        _value(
            text,
            'loghub_requests_total{api="POST /logstores/{logstore}/shards/{shard}",status="200"}',
        )
        == 4
    )
    assert _value(text, 'loghub_requests_total{api="GET /logstores/{logstore}",status="404"}') == 1


def test_api_labels_name_the_operation_not_the_names() -> None:
    assert api_label("GET", ["logstores", "a", "shards", "3"], {"type": "log"}) == (
        "GET /logstores/{logstore}/shards/{shard}?type=log"
    )
    assert api_label("POST", ["logstores", "a", "consumergroups", "g"], {"type": "heartbeat"}) == (
        "POST /logstores/{logstore}/consumergroups/{group}?type=heartbeat"
    )
    assert api_label("POST", ["logstores", "a", "shards", "1"], {"action": "split"}) == (
        "POST /logstores/{logstore}/shards/{shard}?action=split"
    )
    assert api_label("GET", ["x", "y"], {}) == "GET unknown"
    assert api_label("GET", [], {"type": "evil-label-value"}) == "GET /"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by name and sorted labels (prometheus-client's parser,
    so the page must be valid Prometheus text)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_scrape_during_traffic_shows_a_lagging_groups_lag_and_ingest_per_logstore(
    tmp_path: Path,
) -> None:
    server = ServerProcess(tmp_path / "data").start()
    stop = threading.Event()
    try:
        with LogHubClient(server.endpoint) as client:
            client.create_project("ops")
            client.create_logstore("ops", "busy", shard_count=2)
            client.create_logstore("ops", "quiet", shard_count=1)
            client.create_consumer_group("ops", "busy", "slow", timeout_s=10)
            group = make_log_group([(1_700_000_000, {"k": "v" * 50})] * 5)
            for shard_id in (0, 1):
                client.put_log_group("ops", "busy", group, shard_id=shard_id)
            # the group reads one group of shard 0 and then falls behind
            client.update_checkpoint(
                "ops", "busy", "slow", 0, client.get_cursor("ops", "busy", 0, "begin")
            )

            def produce() -> None:
                with LogHubClient(server.endpoint) as producer:
                    while not stop.wait(0.05):
                        for shard_id in (0, 1):
                            producer.put_log_group("ops", "busy", group, shard_id=shard_id)

            traffic = threading.Thread(target=produce, daemon=True)
            traffic.start()
            where = (server.endpoint, "ops", "busy", "slow")
            with HeartbeatMembers(*where, ["first"]) as first:
                _wait_for(lambda: len(first.owners()) == 2)
                with HeartbeatMembers(*where, ["second"]) as second:
                    _wait_for(lambda: len(first.owners()) == 1 and len(second.owners()) == 1)
                    time.sleep(1.5)  # traffic keeps coming: the lag grows in seconds too
                    with pytest.raises(LogStoreNotExist):
                        client.get_logstore("ops", "missing")
                    with httpx.Client(trust_env=False) as http:
                        text = http.get(f"http://{server.endpoint}/metrics").text
            assert traffic.is_alive(), "the scrape is meant to happen during traffic"
    finally:
        stop.set()
        server.stop()
    samples = _samples(text)

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    busy = {"project": "ops", "logstore": "busy"}
    lagging = {**busy, "consumer_group": "slow", "shard": "0"}
    assert value("loghub_consumer_group_lag_log_groups", **lagging) >= 5
    assert value("loghub_consumer_group_lag_seconds", **lagging) >= 1.0
    never_read = {**busy, "consumer_group": "slow", "shard": "1"}
    assert value("loghub_consumer_group_lag_log_groups", **never_read) >= 5
    for shard in ("0", "1"):
        assert value("loghub_ingest_logs_total", **busy, shard=shard) >= 5 * 5
        assert value("loghub_ingest_bytes_total", **busy, shard=shard) > 0
    assert not any(
        name == "loghub_ingest_logs_total" and ("logstore", "quiet") in labels
        for name, labels in samples
    )
    assert value("loghub_logstore_disk_bytes", **busy) > 0
    assert value("loghub_logstore_disk_bytes", project="ops", logstore="quiet") == 0
    assert value("loghub_disk_free_bytes") > 0
    assert value("loghub_fsync_seconds_count") > 0
    group_labels = {**busy, "consumer_group": "slow"}
    assert value("loghub_consumer_group_heartbeats_total", **group_labels) >= 4
    assert value("loghub_consumer_group_rebalances_total", **group_labels) >= 2
    assert value("loghub_consumer_group_handoffs_total", **group_labels) == 1
    assert value("loghub_errors_total", code="LogStoreNotExist") == 1
    put_api = "POST /logstores/{logstore}/shards/{shard}"
    assert value("loghub_request_seconds_count", api=put_api) >= 2 * 5


def test_data_path_counts_are_plain_tallies_read_at_scrape_time() -> None:
    metrics = ServerMetrics()
    metrics.count_ingest("p", "s", 3, 10, 100)
    metrics.count_ingest("p", "s", 3, 5, 50)
    metrics.count_request("POST /logstores/{logstore}/shards/{shard}", 200, 0.002)
    assert metrics.ingest_totals() == {("p", "s"): (15.0, 150.0)}
    text = metrics.exposition().decode()
    assert 'loghub_ingest_logs_total{logstore="s",project="p",shard="3"} 15.0' in text
    assert (
        'loghub_request_seconds_bucket{api="POST /logstores/{logstore}/shards/{shard}",le="0.005"}'
        " 1.0" in text
    )
    metrics.forget_logstore("p", "s")
    assert metrics.ingest_totals() == {}
    assert "loghub_ingest_logs_total{" not in metrics.exposition().decode()
