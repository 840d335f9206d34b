"""The official aliyun-log-python-sdk, unmodified and pinned, against a real `loghub serve`.

The SDK reaches `<project>.127.0.0.1:PORT` through HTTP_PROXY (see conftest): no DNS tricks
and no changes to the SDK. Every request is signed, as against the hosted service.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import pytest
from aliyun.log import LogClient, LogException, LogItem, PutLogsRequest
from server_process import ServerProcess

PROJECT = "sdkproj"
LOGSTORE = "sdkstore"

pytestmark = pytest.mark.usefixtures("sdk_proxy_env")


def _client(server: ServerProcess, secret: str = "sk", **kwargs: object) -> LogClient:
    return LogClient(server.endpoint, "ak", secret, **kwargs)


@pytest.fixture(scope="module")
def client(signed_server: ServerProcess, sdk_proxy_env: None) -> Iterator[LogClient]:
    sdk = _client(signed_server)
    sdk.create_project(PROJECT, "sdk compatibility")
    sdk.create_logstore(PROJECT, LOGSTORE, ttl=7, shard_count=2)
    yield sdk


def _items(prefix: str, count: int) -> list[LogItem]:
    items = []
    for i in range(count):
        item = LogItem(timestamp=1_700_000_000 + i, time_nano_part=123_456_789)
        item.set_contents([("msg", f"{prefix} {i}"), ("level", "INFO")])
        items.append(item)
    return items


def _put(client: LogClient, prefix: str, count: int, **kwargs: object) -> None:
    request = PutLogsRequest(
        PROJECT,
        LOGSTORE,
        f"topic-{prefix}",
        "10.0.0.9",
        _items(prefix, count),
        logtags=[("env", prefix)],
        **kwargs,
    )
    client.put_logs(request)


def _pull_all(client: LogClient, shard: int, **kwargs: object) -> list[dict[str, object]]:
    cursor = client.get_cursor(PROJECT, LOGSTORE, shard, "begin").get_cursor()
    end = client.get_cursor(PROJECT, LOGSTORE, shard, "end").get_cursor()
    logs: list[dict[str, object]] = []
    while cursor != end:
        response = client.pull_logs(PROJECT, LOGSTORE, shard, cursor, count=1000, **kwargs)
        logs.extend(response.get_flatten_logs_json())
        cursor = response.get_next_cursor()
    return logs


def _all_logs(client: LogClient, **kwargs: object) -> list[dict[str, object]]:
    return [log for shard in (0, 1) for log in _pull_all(client, shard, **kwargs)]


def test_project_and_logstore_calls(client: LogClient) -> None:
    project = client.get_project(PROJECT)
    assert project.get_projectname() == PROJECT
    logstore = client.get_logstore(PROJECT, LOGSTORE)
    assert logstore.get_ttl() == 7
    assert logstore.get_shard_count() == 2
    assert LOGSTORE in client.list_logstore(PROJECT).get_logstores()
    shards = client.list_shards(PROJECT, LOGSTORE).get_shards_info()
    assert [s["shardID"] for s in shards] == [0, 1]
    assert all(s["status"] == "readwrite" for s in shards)
    assert shards[0]["inclusiveBeginKey"] == "0" * 32
    assert shards[0]["exclusiveEndKey"] == shards[1]["inclusiveBeginKey"] == "8" + "0" * 31
    assert shards[1]["exclusiveEndKey"] == "f" * 32


def test_put_lz4_and_uncompressed_then_pull_every_compression(client: LogClient) -> None:
    _put(client, "lz4", 5)
    _put(client, "plain", 3, compress=False)
    for kwargs in ({}, {"compress": False}, {"accept_compress_type": "deflate"}):
        logs = [
            log
            for log in _all_logs(client, **kwargs)
            if str(log["msg"]).startswith(("lz4 ", "plain "))
        ]
        assert sorted(str(log["msg"]) for log in logs) == sorted(
            [f"lz4 {i}" for i in range(5)] + [f"plain {i}" for i in range(3)]
        ), kwargs
        first = next(log for log in logs if log["msg"] == "lz4 0")
        assert first["__topic__"] == "topic-lz4"
        assert first["__source__"] == "10.0.0.9"
        assert first["__tag__:env"] == "lz4"
        assert first["__time__"] == 1_700_000_000
        assert first["level"] == "INFO"
        assert first["__time_ns_part__"] == (123_456_789,)  # the SDK's own trailing comma


def test_put_with_hash_key_lands_in_the_covering_shard(client: LogClient) -> None:
    for key, shard in (("0" * 31 + "1", 0), ("9" + "0" * 31, 1), ("ff", 1), ("7f", 0)):
        before = client.get_cursor(PROJECT, LOGSTORE, shard, "end").get_cursor()
        _put(client, f"key{key}", 2, hashKey=key)
        response = client.pull_logs(PROJECT, LOGSTORE, shard, before, count=10)
        assert response.get_loggroup_count() == 1
        assert [log["msg"] for log in response.get_flatten_logs_json()] == [
            f"key{key} 0",
            f"key{key} 1",
        ]


def test_cursors_by_position_and_time(client: LogClient) -> None:
    begin = client.get_begin_cursor(PROJECT, LOGSTORE, 0).get_cursor()
    assert begin == "MA=="
    before_s = int(time.time())
    time.sleep(1.1)  # receive times are in seconds: the next write is in a later second
    end_before = client.get_end_cursor(PROJECT, LOGSTORE, 0).get_cursor()
    _put(client, "timed", 1, hashKey="00")
    at_time = client.get_cursor(PROJECT, LOGSTORE, 0, before_s + 1).get_cursor()
    assert at_time == end_before
    cursor_time = client.get_cursor_time(PROJECT, LOGSTORE, 0, at_time).get_cursor_time()
    assert before_s < cursor_time <= int(time.time())
    end = client.get_end_cursor(PROJECT, LOGSTORE, 0).get_cursor()
    assert client.get_cursor_time(PROJECT, LOGSTORE, 0, end).get_cursor_time() >= cursor_time
    future = client.get_cursor(PROJECT, LOGSTORE, 0, int(time.time()) + 3600).get_cursor()
    assert future == end


def test_pull_counts_cursors_and_the_end(client: LogClient) -> None:
    _put(client, "count", 4, hashKey="01")
    begin = client.get_begin_cursor(PROJECT, LOGSTORE, 0).get_cursor()
    end = client.get_end_cursor(PROJECT, LOGSTORE, 0).get_cursor()
    first = client.pull_logs(PROJECT, LOGSTORE, 0, begin, count=1)
    assert first.get_loggroup_count() == 1
    assert first.get_next_cursor() != begin
    at_end = client.pull_logs(PROJECT, LOGSTORE, 0, end, count=1000)
    assert at_end.get_loggroup_count() == 0
    assert at_end.get_log_count() == 0
    assert at_end.get_next_cursor() == end
    groups = list(client.pull_log(PROJECT, LOGSTORE, 0, "begin", "end"))  # must terminate
    assert groups[-1].get_next_cursor() == end
    assert sum(g.get_loggroup_count() for g in groups) == int(base64.b64decode(end))


def test_v4_signatures(signed_server: ServerProcess, client: LogClient) -> None:
    v4 = _client(signed_server, auth_version="v4", region="cn-local")
    assert len(v4.list_shards(PROJECT, LOGSTORE).get_shards_info()) == 2
    before = v4.get_cursor(PROJECT, LOGSTORE, 1, "end").get_cursor()
    request = PutLogsRequest(PROJECT, LOGSTORE, "v4", "10.0.0.9", _items("v4", 2), hashKey="f0")
    v4.put_logs(request)
    response = v4.pull_logs(PROJECT, LOGSTORE, 1, before, count=10)
    assert [log["msg"] for log in response.get_flatten_logs_json()] == ["v4 0", "v4 1"]


def test_wrong_secret_is_refused_at_once(signed_server: ServerProcess, client: LogClient) -> None:
    for kwargs in ({}, {"auth_version": "v4", "region": "cn-local"}):
        wrong = _client(signed_server, secret="not-the-secret", **kwargs)
        started = time.monotonic()
        with pytest.raises(LogException) as raised:
            wrong.list_shards(PROJECT, LOGSTORE)
        assert time.monotonic() - started < 2, "an auth error must not be retried"
        assert raised.value.get_error_code() == "SignatureNotMatch"
        assert raised.value.resp_status == 401


def test_missing_logstore_and_bad_cursor_errors(client: LogClient) -> None:
    with pytest.raises(LogException) as missing:
        client.get_logstore(PROJECT, "no-such-store")
    assert missing.value.get_error_code() == "LogStoreNotExist"
    for cursor in ("bm90LWEtbnVtYmVy", "%%%", "OTk5OTk5"):  # not a number, not base64, past end
        started = time.monotonic()
        with pytest.raises(LogException) as bad:
            client.pull_logs(PROJECT, LOGSTORE, 0, cursor, count=10)
        assert bad.value.get_error_code() == "InvalidCursor"
        assert time.monotonic() - started < 2
