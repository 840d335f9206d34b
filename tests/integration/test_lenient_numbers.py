"""Numbers and booleans are read as leniently as the hosted service reads them.

Clients write integers as floats (the official SDK sends a consumer group's timeout as
``heartbeat_interval * 2``, so ``4.0``) or as strings (``"4.0"``, ``"true"``); query
parameters built from floats read ``size=100.0``. Each such value names an integer (or a
boolean) without doubt, so it is taken; a value that does not (``size=1.5``) is still a 400
in LogHub's error format. Signed v4 requests to a real keyed server, and the official SDK.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aliyun.log import LogClient, LogItem, PutLogsRequest
from aliyun.log.consumer import ConsumerProcessorBase, ConsumerWorker, CursorPosition, LogHubConfig
from raw_http import RawConnection, Reply, signed, target
from server_process import ServerProcess

PROJECT = "lenient"
HOST = f"{PROJECT}.127.0.0.1"


def _send(
    http: RawConnection,
    method: str,
    path: str,
    query: list[tuple[str, str]] | None = None,
    body: object = None,
) -> Reply:
    query = query or []
    data = b"" if body is None else json.dumps(body).encode()
    return http.send(
        method, target(path, query), signed("v4", method, HOST, path, query, data), data
    )


@pytest.fixture(scope="module")
def http(signed_server: ServerProcess) -> Iterator[RawConnection]:
    with RawConnection(signed_server.port) as connection:
        assert _send(connection, "POST", "/", body={}).status == 200
        store = {"logstoreName": "store", "shardCount": 2, "ttl": 7}
        assert _send(connection, "POST", "/logstores", body=store).status == 200
        group = {"consumerGroup": "fixed", "timeout": 10}
        assert (
            _send(connection, "POST", "/logstores/store/consumergroups", body=group).status == 200
        )
        yield connection


@pytest.mark.usefixtures("sdk_proxy_env")
def test_the_sdk_float_group_timeout_is_taken_and_a_fraction_rounded_up(
    http: RawConnection, signed_server: ServerProcess
) -> None:
    """What a ConsumerWorker with ``heartbeat_interval=2.0`` (or 1.25) sends."""
    sdk = LogClient(signed_server.endpoint, "ak", "sk")
    sdk.create_consumer_group(PROJECT, "store", "sdk-float", 2.0 * 2)
    sdk.update_consumer_group(PROJECT, "store", "sdk-float", timeout=1.25 * 2)
    groups = sdk.list_consumer_group(PROJECT, "store").get_consumer_groups()
    timeouts = {g.get_consumer_group_name(): g.get_timeout() for g in groups}
    assert timeouts["sdk-float"] == 3


def test_group_numbers_and_flags_written_as_strings_are_taken(http: RawConnection) -> None:
    path = "/logstores/store/consumergroups"
    body = {"consumerGroup": "strings", "timeout": "4.0", "order": "true"}
    reply = _send(http, "POST", path, body=body)
    assert reply.status == 200, reply.body
    reply = _send(http, "PUT", path + "/strings", body={"order": "False", "timeout": "6"})
    assert reply.status == 200, reply.body
    groups = {g["name"]: g for g in _send(http, "GET", path).json()}
    assert (groups["strings"]["timeout"], groups["strings"]["order"]) == (6, False)
    reply = _send(http, "POST", path + "/strings", [("type", "heartbeat"), ("consumer", "c")], [])
    assert reply.status == 200, reply.body
    checkpoint = {"shard": 0.0, "checkpoint": "MA=="}
    query = [("type", "checkpoint"), ("consumer", "c")]
    assert _send(http, "POST", path + "/strings", query, checkpoint).status == 200


def test_logstore_quotas_may_be_integral_floats(http: RawConnection) -> None:
    body = {
        "logstoreName": "quota",
        "shardCount": 1.0,
        "ttl": "7",
        "shardWriteQuotaBytesPerSecond": 1048576.0,
        "shardReadQuotaBytesPerSecond": "2097152",
    }
    reply = _send(http, "POST", "/logstores", body=body)
    assert reply.status == 200, reply.body
    described = _send(http, "GET", "/logstores/quota").json()
    assert described["shardWriteQuotaBytesPerSecond"] == 1048576
    assert described["shardReadQuotaBytesPerSecond"] == 2097152


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/logstores", [("offset", "0.0"), ("size", "10.0")]),
        ("/logstores/store/shards/0", [("type", "cursor"), ("from", "1700000000.0")]),
        ("/logstores/store/consumergroups/fixed", [("shard", "0.0")]),
    ],
)
def test_integral_query_numbers_written_as_floats_are_taken(
    http: RawConnection, path: str, query: list[tuple[str, str]]
) -> None:
    reply = _send(http, "GET", path, query)
    assert reply.status == 200, reply.body


def test_pull_count_written_as_a_float_is_taken(http: RawConnection) -> None:
    query = [("type", "cursor"), ("from", "begin")]
    cursor = _send(http, "GET", "/logstores/store/shards/0", query).json()["cursor"]
    query = [("type", "log"), ("cursor", cursor), ("count", "100.0")]
    reply = _send(http, "GET", "/logstores/store/shards/0", query)
    assert reply.status == 200, reply.body


@pytest.mark.parametrize(
    ("method", "path", "query", "body"),
    [
        ("GET", "/logstores", [("size", "1.5")], None),
        ("GET", "/logstores/store/shards/0", [("type", "cursor"), ("from", "17.5")], None),
        ("POST", "/logstores/store/consumergroups", [], {"consumerGroup": "x", "timeout": "x"}),
        ("POST", "/logstores/store/consumergroups", [], {"consumerGroup": "y", "order": "yes"}),
        ("POST", "/logstores", [], {"logstoreName": "bad", "shardCount": 2.5, "ttl": 7}),
    ],
)
def test_values_that_name_no_integer_are_still_refused(
    http: RawConnection, method: str, path: str, query: list[tuple[str, str]], body: object
) -> None:
    reply = _send(http, method, path, query, body)
    assert reply.status == 400, reply.body
    assert reply.error_code() in ("ParameterInvalid", "LogStoreInfoInvalid"), reply.body


@pytest.mark.usefixtures("sdk_proxy_env")
def test_an_sdk_consumer_worker_with_a_float_heartbeat_interval_consumes(
    http: RawConnection, signed_server: ServerProcess
) -> None:
    """The case as a user meets it: ``heartbeat_interval=2.0`` makes the worker create its
    group with ``timeout: 4.0``; the worker must start and read what is there."""
    sdk = LogClient(signed_server.endpoint, "ak", "sk")
    item = LogItem(timestamp=1_700_000_000)
    item.set_contents([("n", "1")])
    sdk.put_logs(PutLogsRequest(PROJECT, "store", "", "10.0.0.1", [item], hashKey="00"))
    seen = threading.Event()

    class Processor(ConsumerProcessorBase):  # type: ignore[misc]
        def process(self, log_groups: Any, tracker: Any) -> None:
            if any(group.Logs for group in log_groups.LogGroups):
                seen.set()
            tracker.save_check_point(True)

    config = LogHubConfig(
        signed_server.endpoint,
        "ak",
        "sk",
        PROJECT,
        "store",
        "float-heartbeat",
        "worker-1",
        cursor_position=CursorPosition.BEGIN_CURSOR,
        heartbeat_interval=2.0,
        data_fetch_interval=0.2,
    )
    worker = ConsumerWorker(Processor, consumer_option=config)
    worker.start()
    try:
        assert seen.wait(timeout=30), "the worker read nothing"
    finally:
        worker.shutdown()
        worker.join(timeout=30)
    groups = sdk.list_consumer_group(PROJECT, "store").get_consumer_groups()
    assert {g.get_consumer_group_name(): g.get_timeout() for g in groups}["float-heartbeat"] == 4
