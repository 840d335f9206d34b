"""GET /metrics: request counts by API and status, and the data path's volumes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from loghub.client import LogHubClient
from loghub.errors import LogStoreNotExist
from loghub.server.config import ServerConfig
from loghub.server.embedded import EmbeddedServer
from loghub.server.metrics import api_label
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
    assert _value(text, "loghub_put_groups_total") == 4
    assert _value(text, "loghub_put_bytes_total") == 4 * raw_size
    assert _value(text, "loghub_pull_groups_total") == 4
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
