"""Routing at the edges of the route table: what a path matches is decided by whole segments.

The server routes with Starlette's routes; these cases pin what the hand-written routing
did before, where a regular expression router differs by default: a trailing newline
(``$`` matches before it), HEAD (Starlette adds it to every GET route), empty segments, and a
method the path's only API does not take.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from raw_http import RawConnection, Reply
from server_process import ServerProcess

PROJECT = "routing"
HOST = f"{PROJECT}.127.0.0.1"


def _send(http: RawConnection, method: str, target: str, body: bytes = b"") -> Reply:
    return http.send(method, target, [("Host", HOST), ("Content-Type", "application/json")], body)


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RawConnection]:
    server = ServerProcess(tmp_path_factory.mktemp("routing") / "data").start()
    try:
        with RawConnection(server.port) as connection:
            assert _send(connection, "POST", "/", b"{}").status == 200
            body = json.dumps({"logstoreName": "store", "shardCount": 2, "ttl": 7}).encode()
            assert _send(connection, "POST", "/logstores", body).status == 200
            yield connection
    finally:
        server.stop()


@pytest.mark.parametrize(
    "target",
    ["//logstores//store/", "/logstores/store/", "/logstores///store"],
)
def test_empty_path_segments_are_dropped(http: RawConnection, target: str) -> None:
    reply = _send(http, "GET", target)
    assert reply.status == 200, reply.body
    assert reply.json()["logstoreName"] == "store"


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/logstores%0A"),  # the literal segment with a newline is another segment
        ("GET", "/logstores/store/shards%0A"),
        ("POST", "/logstores/store/logs%0A"),
        ("HEAD", "/logstores/missing/index"),  # GetIndex is GET only: not a 404
        ("GET", "/logstores/store/logs"),  # GetLogs v2 is POST only
        ("PUT", "/logstores/store/shards"),  # ListShards is GET only
        ("GET", "/logstores/store/shards/0/more"),
        ("GET", "/projects"),
    ],
)
def test_a_path_or_method_no_api_takes_is_parameter_invalid(
    http: RawConnection, method: str, target: str
) -> None:
    reply = _send(http, method, target)
    assert reply.status == 400
    if method != "HEAD":  # a reply to HEAD has no body
        assert reply.error_code() == "ParameterInvalid", reply.body


def test_path_parameters_reach_their_endpoints(http: RawConnection) -> None:
    reply = _send(http, "GET", "/logstores/store/shards/1?type=cursor&from=begin")
    assert reply.status == 200, reply.body
    assert "cursor" in reply.json()
    reply = _send(http, "GET", "/logstores/missing/consumergroups/group")
    assert (reply.status, reply.error_code()) == (404, "LogStoreNotExist"), reply.body
