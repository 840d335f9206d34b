"""The official SDK's consumer-group calls against a real `loghub serve` (checklist item 7)."""

from __future__ import annotations

import time

import pytest
from aliyun.log import LogClient, LogException, LogItem, PutLogsRequest
from server_process import ServerProcess

PROJECT = "cgapi"
LOGSTORE = "events"

pytestmark = pytest.mark.usefixtures("sdk_proxy_env")


@pytest.fixture(scope="module")
def sdk(signed_server: ServerProcess, sdk_proxy_env: None) -> LogClient:
    client = LogClient(signed_server.endpoint, "ak", "sk")
    client.create_project(PROJECT, "")
    client.create_logstore(PROJECT, LOGSTORE, ttl=1, shard_count=2)
    item = LogItem(timestamp=1_700_000_000)
    item.set_contents([("k", "v")])
    for _ in range(3):
        client.put_logs(PutLogsRequest(PROJECT, LOGSTORE, "", "10.0.0.1", [item], hashKey="00"))
    return client


def test_group_definition_calls(sdk: LogClient) -> None:
    sdk.create_consumer_group(PROJECT, LOGSTORE, "cg-a", 30, in_order=False)
    with pytest.raises(LogException) as duplicate:
        sdk.create_consumer_group(PROJECT, LOGSTORE, "cg-a", 30)
    assert duplicate.value.get_error_code() == "ConsumerGroupAlreadyExist"
    sdk.update_consumer_group(PROJECT, LOGSTORE, "cg-a", timeout=10, in_order=True)
    groups = sdk.list_consumer_group(PROJECT, LOGSTORE).get_consumer_groups()
    assert [(g.get_consumer_group_name(), g.get_timeout(), g.is_in_order()) for g in groups] == [
        ("cg-a", 10, True)
    ]
    sdk.delete_consumer_group(PROJECT, LOGSTORE, "cg-a")
    assert sdk.list_consumer_group(PROJECT, LOGSTORE).get_consumer_groups() == []
    with pytest.raises(LogException) as missing:
        sdk.update_consumer_group(PROJECT, LOGSTORE, "cg-a", timeout=5)
    assert missing.value.get_error_code() == "ConsumerGroupNotExist"


def test_heartbeat_and_checkpoints(sdk: LogClient) -> None:
    sdk.create_consumer_group(PROJECT, LOGSTORE, "cg-b", 5)
    assert sdk.heart_beat(PROJECT, LOGSTORE, "cg-b", "c1", []).get_shards() == [0, 1]
    assert sdk.heart_beat(PROJECT, LOGSTORE, "cg-b", "c2", []).get_shards() == []
    # c1 is told to give up one shard; c2 gets it only once c1 stops reporting it
    assert sdk.heart_beat(PROJECT, LOGSTORE, "cg-b", "c1", [0, 1]).get_shards() == [0]
    assert sdk.heart_beat(PROJECT, LOGSTORE, "cg-b", "c2", []).get_shards() == []
    sdk.update_check_point(PROJECT, LOGSTORE, "cg-b", 1, "MA==", "c1", force_success=False)
    assert sdk.heart_beat(PROJECT, LOGSTORE, "cg-b", "c1", [0]).get_shards() == [0]
    assert sdk.heart_beat(PROJECT, LOGSTORE, "cg-b", "c2", []).get_shards() == [1]

    before = time.time()
    sdk.update_check_point(PROJECT, LOGSTORE, "cg-b", 0, "Mw==", "c1")
    one = sdk.get_check_point(PROJECT, LOGSTORE, "cg-b", 0).get_consumer_group_check_points()
    assert [(c["shard"], c["checkpoint"], c["consumer"]) for c in one] == [(0, "Mw==", "c1")]
    assert one[0]["updateTime"] / 1e6 >= before - 1
    every = sdk.get_check_point(PROJECT, LOGSTORE, "cg-b").get_consumer_group_check_points()
    assert [(c["shard"], c["checkpoint"]) for c in every] == [(0, "Mw=="), (1, "MA==")]
    # "consumer" names the owner: c1 wrote shard 1's checkpoint, but c2 holds it now.
    assert [(c["shard"], c["consumer"]) for c in every] == [(0, "c1"), (1, "c2")]
    fixed = sdk.get_check_point_fixed(PROJECT, LOGSTORE, "cg-b", 0)
    assert fixed.get_consumer_group_check_points()[0]["checkpoint_previous_cursor_time"] > 0
    assert sdk.get_check_point(PROJECT, LOGSTORE, "cg-b", 7).get_consumer_group_check_points() == []


def test_checkpoint_fencing_and_bad_checkpoints(sdk: LogClient) -> None:
    sdk.create_consumer_group(PROJECT, LOGSTORE, "cg-c", 5)
    assert sdk.heart_beat(PROJECT, LOGSTORE, "cg-c", "owner", []).get_shards() == [0, 1]
    with pytest.raises(LogException) as fenced:
        sdk.update_check_point(PROJECT, LOGSTORE, "cg-c", 0, "MQ==", "intruder", False)
    assert fenced.value.get_error_code() == "ConsumerNotMatch"
    sdk.update_check_point(PROJECT, LOGSTORE, "cg-c", 0, "MQ==", "intruder", True)  # forced
    empty = sdk.get_check_point(PROJECT, LOGSTORE, "cg-c", 1).get_consumer_group_check_points()
    assert empty == [{"shard": 1, "checkpoint": "", "updateTime": 0, "consumer": "owner"}]
    for bad in ("not base64!", "OTk5OTk="):  # undecodable, past the end
        with pytest.raises(LogException) as invalid:
            sdk.update_check_point(PROJECT, LOGSTORE, "cg-c", 0, bad, "owner")
        assert invalid.value.get_error_code() == "InvalidShardCheckPoint"
    with pytest.raises(LogException) as no_shard:
        sdk.update_check_point(PROJECT, LOGSTORE, "cg-c", 9, "MA==", "owner")
    assert no_shard.value.get_error_code() == "ShardNotExist"
