"""Hostile input at the data path: random bodies, headers, compression types, cursors and
counts at PutLogs, PullLogs and GetCursor. The server must answer every one with a LogHub
error body and a 4xx (or accept it when it happens to be valid), never a 5xx, never crash,
and never change or lose what was stored before.

The app runs in this process behind Starlette's test client (no socket: the socket is not
what is under test here).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import lz4.block
import pytest
from asgi_client import AsgiClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loghub.server.app import LogHubApp, build_app
from loghub.server.config import Limits, ServerConfig
from loghub.wire.logs import make_log_group, parse_log_group_list

HOST = {"host": "fuzz.127.0.0.1"}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LogHubApp]:
    data_dir: Path = tmp_path_factory.mktemp("fuzz")
    limits = Limits(
        request_body_bytes_max=64 * 1024, raw_body_bytes_max=256 * 1024, logs_per_group_max=100
    )
    application = build_app(ServerConfig(data_dir=data_dir, limits=limits))
    yield application
    application.service.close()


@pytest.fixture(scope="module")
def http(app: LogHubApp) -> Iterator[AsgiClient]:
    c = AsgiClient(app, base_url="http://fuzz.127.0.0.1")
    try:
        assert c.post("/", headers=HOST, json={"projectName": "fuzz"}).status_code == 200
        assert (
            c.post(
                "/logstores",
                headers=HOST,
                json={"logstoreName": "store", "shardCount": 2, "ttl": 7},
            ).status_code
            == 200
        )
        for i in range(5):
            body = make_log_group([(1_700_000_000, {"seed": str(i)})]).SerializeToString()
            reply = c.post(
                "/logstores/store/shards/0",
                headers={**HOST, "x-log-bodyrawsize": str(len(body))},
                content=body,
            )
            assert reply.status_code == 200, reply.text
        yield c
    finally:
        c.close()


def _snapshot(http: AsgiClient) -> dict[int, bytes]:
    """Every stored group of every shard, as raw LogGroupList bytes."""
    shards = {}
    for shard in (0, 1):
        reply = http.get(
            f"/logstores/store/shards/{shard}",
            params={"type": "log", "cursor": "MA==", "count": "1000"},
            headers={**HOST, "accept-encoding": ""},
        )
        assert reply.status_code == 200
        shards[shard] = reply.content
    return shards


def _assert_error_reply(status: int, body: bytes) -> None:
    assert status < 500, body
    if status != 200:
        error = json.loads(body)
        assert set(error) >= {"errorCode", "errorMessage"}


compress_types = st.sampled_from(["", "lz4", "zstd", "deflate", "gzip", "snappy", "LZ4", "\x00"])
raw_sizes = st.one_of(st.none(), st.integers(-5, 2**40).map(str), st.text(max_size=8))
cursors = st.one_of(
    st.text(max_size=24),
    st.sampled_from(["MA==", "MQ==", "NQ==", "MTAw", "LTE=", "MA==\n", " MA== "]),
)
counts = st.one_of(st.integers(-10, 5000).map(str), st.text(max_size=6))


def _bodies() -> st.SearchStrategy[bytes]:
    valid = make_log_group([(1_700_000_000, {"k": "v"})]).SerializeToString()
    return st.one_of(
        st.binary(max_size=2048),
        st.just(valid),
        st.binary(max_size=64).map(lambda junk: valid[: len(valid) // 2] + junk),
        st.binary(max_size=512).map(lambda data: lz4.block.compress(data, store_size=False)),
        st.just(b"\x0a\xff\xff\xff\xff\x0f"),  # a length far past the end
        st.just(b"x" * (70 * 1024)),  # over the request body limit
    )


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    body=_bodies(),
    compress=compress_types,
    raw_size=raw_sizes,
    target=st.sampled_from(["lb", "route", "0", "1", "7", "-1", "x"]),
    key=st.one_of(st.none(), st.text(max_size=40)),
)
def test_random_put_logs_never_5xx_and_never_touch_stored_data(
    http: AsgiClient,
    body: bytes,
    compress: str,
    raw_size: str | None,
    target: str,
    key: str | None,
) -> None:
    before = _snapshot(http)
    headers = {**HOST}
    if compress:
        headers["x-log-compresstype"] = compress
    if raw_size is not None:
        headers["x-log-bodyrawsize"] = raw_size.encode("ascii", "replace").decode()
    params = {"key": key} if key is not None else {}
    reply = http.post(
        f"/logstores/store/shards/{target}", params=params, headers=headers, content=body
    )
    _assert_error_reply(reply.status_code, reply.content)
    after = _snapshot(http)
    for shard, stored in before.items():
        assert after[shard].startswith(stored), "stored groups changed"
        added = parse_log_group_list(after[shard][len(stored) :])
        if reply.status_code != 200:
            assert not added.LogGroups, "a refused write left data behind"
        for group in added.LogGroups:
            assert group.Logs, "an accepted group holds no logs"


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    cursor=cursors,
    end_cursor=st.one_of(st.none(), cursors),
    count=counts,
    shard=st.sampled_from(["0", "1", "9", "abc", "-1", "00"]),
    accept=st.one_of(st.none(), compress_types, st.text(max_size=12)),
)
def test_random_pulls_never_5xx(
    http: AsgiClient,
    cursor: str,
    end_cursor: str | None,
    count: str,
    shard: str,
    accept: str | None,
) -> None:
    params = {"type": "log", "cursor": cursor, "count": count}
    if end_cursor is not None:
        params["end_cursor"] = end_cursor
    headers = {**HOST}
    if accept is not None:
        headers["accept-encoding"] = accept.encode("ascii", "replace").decode()
    reply = http.get(f"/logstores/store/shards/{shard}", params=params, headers=headers)
    _assert_error_reply(reply.status_code, reply.content)
    if reply.status_code == 200:
        assert int(reply.headers["x-log-count"]) >= 0
        assert reply.headers["x-log-cursor"]


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kind=st.sampled_from(["cursor", "cursor_time", "", "log2"]),
    position=st.one_of(
        st.text(max_size=16),
        st.integers(-(2**63), 2**63).map(str),
        st.sampled_from(["begin", "end", " begin", "BEGIN"]),
    ),
    shard=st.sampled_from(["0", "1", "5", "z"]),
)
def test_random_get_cursor_never_5xx(
    http: AsgiClient, kind: str, position: str, shard: str
) -> None:
    params = {"type": kind, "from": position, "cursor": position}
    reply = http.get(f"/logstores/store/shards/{shard}", params=params, headers=HOST)
    _assert_error_reply(reply.status_code, reply.content)
