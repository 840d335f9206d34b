"""LogHubClient's consumer-group calls against the server in-process (no socket needed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loghub.client import LogHubClient
from loghub.errors import ConsumerGroupAlreadyExist, ConsumerNotMatch
from loghub.server.config import ServerConfig
from loghub.server.embedded import EmbeddedServer
from loghub.wire.logs import make_log_group


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[LogHubClient]:
    config = ServerConfig(data_dir=tmp_path / "data", port=0)
    with EmbeddedServer(config) as server, LogHubClient(server.endpoint) as c:
        c.create_project("groups")
        c.create_logstore("groups", "store", shard_count=2)
        yield c


def test_group_lifecycle_heartbeats_and_checkpoints(client: LogHubClient) -> None:
    client.create_consumer_group("groups", "store", "cg", 10, ordered=True)
    with pytest.raises(ConsumerGroupAlreadyExist):
        client.create_consumer_group("groups", "store", "cg", 10)
    client.update_consumer_group("groups", "store", "cg", ordered=False)
    assert client.list_consumer_groups("groups", "store") == [
        {"name": "cg", "timeout": 10, "order": False}
    ]
    assert client.heartbeat("groups", "store", "cg", "a", []) == [0, 1]
    client.put_log_group("groups", "store", make_log_group([(1, {"k": "v"})]), shard_id=0)
    client.update_checkpoint("groups", "store", "cg", 0, "MQ==", "a", force=False)
    with pytest.raises(ConsumerNotMatch):
        client.update_checkpoint("groups", "store", "cg", 0, "MA==", "b", force=False)
    assert client.get_checkpoints("groups", "store", "cg") == {0: "MQ==", 1: ""}
    assert client.get_checkpoints("groups", "store", "cg", 1) == {1: ""}
    client.delete_consumer_group("groups", "store", "cg")
    assert client.list_consumer_groups("groups", "store") == []


def test_transport_errors_are_loghub_errors() -> None:
    with LogHubClient("127.0.0.1:1", timeout_s=2) as client, pytest.raises(Exception) as raised:
        client.list_shards("groups", "store")
    assert raised.type.__name__ == "TransportError"
    assert isinstance(raised.value.__cause__, httpx.HTTPError)
