"""Per-shard quotas on a real server: a burst over the quota gets 403 with the hosted
service's codes, another shard is not affected, and after waiting the shard serves again.

The server runs with small server-wide quotas (20,000 bytes a second to write and to read
per shard); one logstore overrides them through its own JSON keys. Our client and the
official SDK (through HTTP_PROXY, as in test_sdk_compat) both see the codes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from aliyun.log import LogClient, LogException, LogItem, PutLogsRequest
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.errors import LogStoreInfoInvalid, ShardReadQuotaExceed, ShardWriteQuotaExceed
from loghub.wire.logs import make_log_group

KEYS = {"ak": "sk"}
PROJECT = "quotaproj"
RATE = 20_000  # bytes per second per shard, for writes and for reads
GROUP_BYTES = 8_000  # roughly, one group's raw size


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    flags = ("--shard-write-bytes-per-s", str(RATE), "--shard-read-bytes-per-s", str(RATE))
    process = ServerProcess(
        tmp_path_factory.mktemp("quota") / "data", keys=KEYS, extra_args=flags
    ).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[LogHubClient]:
    with LogHubClient(server.endpoint, "ak", "sk") as loghub:
        loghub.create_project(PROJECT)
        yield loghub


def _group(tag: str) -> bytes:
    return make_log_group(
        [(1_700_000_000, {"tag": tag, "pad": "x" * GROUP_BYTES})]
    ).SerializeToString()


def _burst_until_refused(client: LogHubClient, logstore: str, shard_id: int) -> int:
    """Writes to one shard until the quota refuses one; returns how many were accepted."""
    for accepted in range(50):
        try:
            client.put_log_group(PROJECT, logstore, _group(f"b{accepted}"), shard_id=shard_id)
        except ShardWriteQuotaExceed as exc:
            assert exc.status == 403
            return accepted
    raise AssertionError("50 writes of 8 KB in a burst were all accepted under 20 KB/s")


def test_a_write_burst_over_the_quota_is_refused_with_403_and_passes_after_waiting(
    client: LogHubClient,
) -> None:
    client.create_logstore(PROJECT, "writes", shard_count=2)
    accepted = _burst_until_refused(client, "writes", 0)
    assert 2 <= accepted <= 4  # one second of burst (20 KB) plus the request that overdrew it
    client.put_log_group(PROJECT, "writes", _group("other shard"), shard_id=1)
    time.sleep((accepted * GROUP_BYTES - RATE) / RATE + 0.3)  # the debt is refilled by then
    client.put_log_group(PROJECT, "writes", _group("after waiting"), shard_id=0)


def test_a_read_burst_over_the_quota_is_refused_with_403_and_passes_after_waiting(
    client: LogHubClient,
) -> None:
    # this logstore takes writes without a quota (its override 0), to store data quickly
    client.create_logstore(PROJECT, "reads", shard_count=2, shardWriteQuotaBytesPerSecond=0)
    for i in range(6):  # 48 KB in each shard: over one second of read quota
        for shard_id in (0, 1):
            client.put_log_group(PROJECT, "reads", _group(f"r{i}"), shard_id=shard_id)
    begin = client.get_cursor(PROJECT, "reads", 0, "begin")
    first = client.pull_logs(PROJECT, "reads", 0, begin, count=1000)
    assert first.count == 6  # a read is admitted whole; its bytes then overdraw the bucket
    with pytest.raises(ShardReadQuotaExceed) as caught:
        client.pull_logs(PROJECT, "reads", 0, begin, count=1)
    assert caught.value.status == 403
    assert client.pull_logs(PROJECT, "reads", 1, begin, count=1000).count == 6  # another shard
    time.sleep((first.raw_size - RATE) / RATE + 0.3)
    assert client.pull_logs(PROJECT, "reads", 0, begin, count=1).count == 1


def test_a_logstore_overrides_the_server_quota_with_its_own_keys(client: LogHubClient) -> None:
    client.create_logstore(
        PROJECT,
        "requests",
        shard_count=1,
        shardWriteQuotaBytesPerSecond=0,  # no byte quota here
        shardWriteQuotaRequestsPerSecond=3,
    )
    assert client.get_logstore(PROJECT, "requests")["shardWriteQuotaRequestsPerSecond"] == 3
    tiny = make_log_group([(1_700_000_000, {"n": "1"})]).SerializeToString()
    with pytest.raises(ShardWriteQuotaExceed, match="3 requests/s"):
        for _ in range(30):  # 3 at once, then 3 a second: refused unless a write took 1/3 s
            client.put_log_group(PROJECT, "requests", tiny, shard_id=0)
    client.update_logstore(PROJECT, "requests", shardWriteQuotaRequestsPerSecond=0)
    for _ in range(10):  # no quota at all now
        client.put_log_group(PROJECT, "requests", tiny, shard_id=0)


def test_a_bad_quota_value_is_a_400_never_a_500(client: LogHubClient) -> None:
    for value in (-1, "many", 2**41, "-1", "²", "٣", "9" * 5000, 1.5, True):
        with pytest.raises(LogStoreInfoInvalid) as caught:
            client.create_logstore(PROJECT, "bad", shardReadQuotaBytesPerSecond=value)
        assert caught.value.status == 400


@pytest.fixture
def sdk(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> LogClient:
    proxy = f"http://{server.endpoint}"
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, proxy)
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    return LogClient(server.endpoint, "ak", "sk", source="127.0.0.1")


def test_the_official_sdk_gets_the_codes_at_once_and_keeps_loghub_keys(
    client: LogHubClient, sdk: LogClient
) -> None:
    client.create_logstore(PROJECT, "sdk", shard_count=2, shardReadQuotaBytesPerSecond=1000)
    item = LogItem(timestamp=1_700_000_000)
    item.set_contents([("pad", "y" * GROUP_BYTES)])
    started = time.monotonic()
    with pytest.raises(LogException) as caught:
        for _ in range(50):
            sdk.put_logs(PutLogsRequest(PROJECT, "sdk", "", "", [item], hashKey="00"))
    assert caught.value.get_error_code() == "ShardWriteQuotaExceed"
    assert caught.value.get_resp_status() == 403
    assert time.monotonic() - started < 5  # no ten retries a second apart: 403 is not retried
    cursor = sdk.get_cursor(PROJECT, "sdk", 0, "begin").get_cursor()
    sdk.pull_logs(PROJECT, "sdk", 0, cursor, count=1)
    with pytest.raises(LogException) as caught:
        sdk.pull_logs(PROJECT, "sdk", 0, cursor, count=1)
    assert caught.value.get_error_code() == "ShardReadQuotaExceed"
    assert caught.value.get_resp_status() == 403
    # the SDK ignores the LogHub-only keys, and its update (which sends only the keys it knows)
    # leaves them in place
    assert sdk.get_logstore(PROJECT, "sdk").get_shard_count() == 2
    sdk.update_logstore(PROJECT, "sdk", ttl=3, hot_ttl=1)
    stored = client.get_logstore(PROJECT, "sdk")
    assert stored["ttl"] == 3 and stored["shardReadQuotaBytesPerSecond"] == 1000
