"""Requests for APIs LogHub lacks are refused, never served by an API sharing their path;
CreateProject works in both of its forms; an empty optional query parameter is an absent one.

Signed v4 requests over a plain socket to a real keyed server (v4 signs Host, so the same
request may go to several projects without the v1 replay rule getting in the way).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest
from aliyun.log import GetHistogramsRequest, ListTopicsRequest, LogClient, LogException
from raw_http import RawConnection, Reply, signed, target
from server_process import ServerProcess

from loghub.wire.logs import make_log_group

PROJECT = "refusals"
HOST = f"{PROJECT}.127.0.0.1"
STORE = "/logstores/store"


def _send(
    http: RawConnection,
    method: str,
    path: str,
    query: list[tuple[str, str]] | None = None,
    body: bytes = b"",
    host: str = HOST,
) -> Reply:
    query = query or []
    headers = signed("v4", method, host, path, query, body)
    return http.send(method, target(path, query), headers, body)


@pytest.fixture(scope="module")
def http(signed_server: ServerProcess) -> Iterator[RawConnection]:
    with RawConnection(signed_server.port) as connection:
        body = json.dumps({"projectName": PROJECT}).encode()
        assert _send(connection, "POST", "/", body=body, host="127.0.0.1").status == 200
        body = json.dumps({"logstoreName": "store", "shardCount": 2, "ttl": 7}).encode()
        assert _send(connection, "POST", "/logstores", body=body).status == 200
        yield connection


def _refused(reply: Reply, status: int, code: str) -> None:
    assert (reply.status, reply.error_code()) == (status, code), reply.body


QUERIES = [
    ("GET", STORE, [("type", "log"), ("from", "1700000000"), ("to", "1700000060")], b""),
    ("GET", STORE, [("type", "histogram"), ("from", "1700000000"), ("to", "1700000060")], b""),
    ("GET", STORE, [("type", "topic"), ("line", "100")], b""),
    ("POST", STORE + "/logs", [], b'{"from": 1700000000, "to": 1700000060, "query": "*"}'),
    ("GET", STORE + "/index", [], b""),
    ("GET", STORE + "/index", [("type", "histogram"), ("from", "1"), ("to", "2")], b""),
]


@pytest.mark.parametrize(("method", "path", "query", "body"), QUERIES)
def test_queries_are_refused_as_for_a_logstore_without_an_index(
    http: RawConnection, method: str, path: str, query: list[tuple[str, str]], body: bytes
) -> None:
    _refused(_send(http, method, path, query, body), 400, "IndexConfigNotExist")
    missing = path.replace("/store", "/missing")
    _refused(_send(http, method, missing, query, body), 404, "LogStoreNotExist")


@pytest.mark.usefixtures("sdk_proxy_env")
@pytest.mark.parametrize("v2", [False, True], ids=["getlogs-v1", "getlogs-v2"])
def test_the_python_sdk_queries_fail_at_once_with_index_config_not_exist(
    http: RawConnection, signed_server: ServerProcess, v2: bool
) -> None:
    """The classic SDK's queries: before, GetLogs v1 was answered with the logstore's
    description and the SDK failed on a missing x-log-progress header."""
    sdk = LogClient(signed_server.endpoint, "ak", "sk")
    sdk._get_logs_v2_enabled = v2  # the SDK's switch between the two GetLogs APIs
    now_s = int(time.time())
    calls: list[Callable[[], object]] = [
        lambda: sdk.get_log(PROJECT, "store", now_s - 60, now_s, query="*"),
        lambda: sdk.get_histograms(GetHistogramsRequest(PROJECT, "store", now_s - 60, now_s)),
        lambda: sdk.list_topics(ListTopicsRequest(PROJECT, "store")),
        lambda: sdk.get_index_config(PROJECT, "store"),
    ]
    for call in calls:
        started = time.monotonic()
        with pytest.raises(LogException) as raised:
            call()
        assert raised.value.get_error_code() == "IndexConfigNotExist", raised.value
        assert raised.value.resp_status == 400
        assert time.monotonic() - started < 2, "a refused query must not be retried"


@pytest.mark.parametrize(
    ("method", "path", "query", "body"),
    [
        ("GET", STORE, [("type", "cursor")], b""),  # a type of another path
        ("GET", STORE, [("type", "bogus")], b""),
        ("PUT", STORE, [("type", "log")], b"{}"),
        ("GET", STORE, [("action", "split")], b""),
        ("GET", "/logstores", [("type", "log")], b""),
        ("GET", "/", [("type", "log")], b""),
        ("GET", STORE + "/shards", [("type", "log")], b""),
        ("GET", STORE + "/shards/0", [("type", "bogus")], b""),
        ("GET", STORE + "/shards/0", [("type", "cursor"), ("from", "begin"), ("action", "x")], b""),
        ("POST", STORE + "/shards/0", [("action", "bogus")], b""),
        ("POST", STORE + "/shards/lb", [("type", "log")], b""),
        ("DELETE", STORE + "/shards/0", [], b""),
        ("POST", STORE + "/consumergroups/cg", [("type", "bogus"), ("consumer", "c")], b"[]"),
        ("POST", STORE + "/consumergroups/cg", [("action", "split")], b"[]"),
        ("GET", STORE + "/consumergroups/cg", [("type", "heartbeat")], b""),
        ("DELETE", STORE + "/consumergroups/cg", [("type", "checkpoint")], b""),
        ("GET", STORE + "/consumergroups", [("type", "log")], b""),
        ("PUT", STORE + "/index", [], b"{}"),
        ("GET", STORE + "/logs", [], b""),
        ("GET", "/logs", [("query", "*")], b""),
    ],
)
def test_a_type_or_action_naming_an_api_loghub_lacks_is_refused(
    http: RawConnection, method: str, path: str, query: list[tuple[str, str]], body: bytes
) -> None:
    _refused(_send(http, method, path, query, body), 400, "ParameterInvalid")


def test_getlogstore_is_still_getlogstore(http: RawConnection) -> None:
    for query in ([], [("type", "")]):  # an empty type is no type
        reply = _send(http, "GET", STORE, query)
        assert reply.status == 200, reply.body
        assert reply.json()["logstoreName"] == "store"


def test_empty_optional_query_parameters_mean_absent(http: RawConnection) -> None:
    # what the Node.js SDK sends for listLogStore(project, {})
    empty = [("logstoreName", ""), ("offset", ""), ("size", "")]
    reply = _send(http, "GET", "/logstores", empty)
    assert reply.status == 200, reply.body
    assert reply.json()["logstores"] == ["store"]
    reply = _send(
        http, "GET", "/", [("offset", ""), ("size", ""), ("projectName", "")], host="127.0.0.1"
    )
    assert reply.status == 200, reply.body
    assert PROJECT in [p["projectName"] for p in reply.json()["projects"]]
    group = make_log_group([(1_700_000_000, {"msg": "empty action"})]).SerializeToString()
    reply = _send(http, "POST", STORE + "/shards/lb", [("action", ""), ("type", "")], group)
    assert reply.status == 200, reply.body  # PutLogs, as without them
    reply = _send(http, "GET", STORE + "/shards/0", [("type", "cursor"), ("from", "end")])
    end = reply.json()["cursor"]
    reply = _send(
        http,
        "GET",
        STORE + "/shards/0",
        [("type", "log"), ("cursor", "MA=="), ("count", ""), ("end_cursor", ""), ("action", "")],
    )
    assert reply.status == 200, reply.body
    assert reply.headers["x-log-cursor"] == end


def test_create_project_in_both_forms(http: RawConnection) -> None:
    bare = json.dumps({"projectName": "bare-form", "description": "at the endpoint"}).encode()
    assert _send(http, "POST", "/", body=bare, host="127.0.0.1").status == 200
    reply = _send(http, "GET", "/", host="bare-form.127.0.0.1")
    assert (reply.json()["projectName"], reply.json()["description"]) == (
        "bare-form",
        "at the endpoint",
    )
    hosted = json.dumps({"projectName": "host-form", "description": "d"}).encode()
    assert _send(http, "POST", "/", body=hosted, host="host-form.127.0.0.1").status == 200
    nameless = json.dumps({"description": "the name only in Host"}).encode()
    assert _send(http, "POST", "/", body=nameless, host="host-only.127.0.0.1").status == 200
    # the same validation and the same duplicate check in both forms
    for host in ("127.0.0.1", "bare-form.127.0.0.1"):
        _refused(_send(http, "POST", "/", body=bare, host=host), 400, "ProjectAlreadyExist")
    bad = json.dumps({"projectName": "Bad_Name!"}).encode()
    invalid = _send(http, "POST", "/", body=bad, host="127.0.0.1")
    assert invalid.status == 400 and invalid.error_code() is not None, invalid.body


@pytest.mark.parametrize(
    ("host", "body", "code"),
    [
        ("other.127.0.0.1", {"projectName": "not-other"}, "ParameterInvalid"),
        ("127.0.0.1", {"description": "no name anywhere"}, "ParameterInvalid"),
        ("127.0.0.1", {"projectName": ""}, "ParameterInvalid"),
        ("127.0.0.1", {"projectName": 7}, "PostBodyInvalid"),
        ("127.0.0.1", ["not", "an", "object"], "PostBodyInvalid"),
    ],
)
def test_create_project_refuses_a_missing_or_conflicting_name(
    http: RawConnection, host: str, body: object, code: str
) -> None:
    reply = _send(http, "POST", "/", body=json.dumps(body).encode(), host=host)
    _refused(reply, 400, code)
    reply = _send(http, "GET", "/", host="other.127.0.0.1")
    assert reply.error_code() == "ProjectNotExist", reply.body


def test_update_logstore_refuses_a_rename_and_keeps_the_logstore(http: RawConnection) -> None:
    renamed = json.dumps({"logstoreName": "renamed", "ttl": 9}).encode()
    _refused(_send(http, "PUT", STORE, body=renamed), 400, "LogStoreInfoInvalid")
    reply = _send(http, "GET", STORE)
    assert (reply.json()["logstoreName"], reply.json()["ttl"]) == ("store", 7), reply.body
    assert _send(http, "GET", "/logstores/renamed").error_code() == "LogStoreNotExist"
    # the body may name the logstore itself, as the SDKs' updates do, or not name it at all
    for body in ({"logstoreName": "store", "ttl": 8}, {"ttl": 7}):
        reply = _send(http, "PUT", STORE, body=json.dumps(body).encode())
        assert reply.status == 200, reply.body
    assert _send(http, "GET", STORE).json()["ttl"] == 7


def test_checkpoint_refuses_a_missing_shard_and_a_force_success_that_is_not_a_boolean(
    http: RawConnection,
) -> None:
    groups = STORE + "/consumergroups"
    body = json.dumps({"consumerGroup": "refusals", "timeout": 10, "order": False}).encode()
    assert _send(http, "POST", groups, body=body).status == 200
    path = groups + "/refusals"

    def checkpoint(force: str, body: dict[str, object]) -> Reply:
        query = [("type", "checkpoint"), ("consumer", "c1"), ("forceSuccess", force)]
        return _send(http, "POST", path, query, json.dumps(body).encode())

    reply = checkpoint("true", {"checkpoint": "MA=="})
    _refused(reply, 400, "ParameterInvalid")
    assert "shard" in reply.json()["errorMessage"] and "None" not in reply.json()["errorMessage"]
    # "yes" is not read as false, which would fence the write and answer ConsumerNotMatch
    for force in ("yes", "1", "truee"):
        _refused(checkpoint(force, {"shard": 0, "checkpoint": "MA=="}), 400, "ParameterInvalid")
    for force in ("True", "true", "TRUE", ""):  # the Python SDK sends True; empty is absent
        reply = checkpoint(force, {"shard": 0, "checkpoint": "MA=="})
        assert reply.status == 200, (force, reply.body)
    _refused(checkpoint("False", {"shard": 0, "checkpoint": "MA=="}), 400, "ConsumerNotMatch")
