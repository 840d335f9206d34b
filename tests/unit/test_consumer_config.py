"""ConsumerConfig's checks and the shard-ordering rules of lease mode (the memory budget is in
test_consumer_budget.py)."""

from __future__ import annotations

import pickle

import pytest

from loghub.client import ShardInfo
from loghub.consumer import ConsumerConfig
from loghub.consumer.shards import consumable_shards, finished_shards
from loghub.errors import ParameterInvalid


def config(**fields: object) -> ConsumerConfig:
    names = {"endpoint": "127.0.0.1:8080", "project": "proj", "logstore": "logs"}
    names |= {"group": "grp", "worker_name": "w1"}
    return ConsumerConfig(**(names | fields))  # type: ignore[arg-type]


def test_defaults_are_valid_and_the_config_survives_pickling() -> None:
    made = config()
    assert made.start_cursor_position == "begin"
    assert made.group_timeout_s == 15
    assert pickle.loads(pickle.dumps(made)) == made
    assert made.for_worker("w1-3").worker_name == "w1-3"


@pytest.mark.parametrize(
    "fields",
    [
        {"start_position": "yesterday"},
        {"fetch_log_groups_max": 0},
        {"fetch_log_groups_max": 1001},
        {"heartbeat_interval_ms": 10},
        {"heartbeat_interval_ms": 5_000, "timeout_ms": 9_999},
        {"coordination": "zookeeper"},
        {"coordination": "lease"},  # no lease_url
        {"on_process_error": "ignore"},
        {"pool_threads": 0},
        {"buffer_bytes_max": 0},
        {"checkpoint_interval_ms": -1},
        {"worker_name": ""},
    ],
)
def test_settings_that_cannot_work_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ParameterInvalid):
        config(**fields)


def test_a_start_time_and_a_timeout_in_whole_seconds() -> None:
    made = config(start_position="1700000000", timeout_ms=2_500, heartbeat_interval_ms=1_000)
    assert made.start_cursor_position == 1_700_000_000
    assert made.group_timeout_s == 3, "rounded up: the server never gives up before we do"


def test_the_logstore_signature_ignores_scheme_and_case() -> None:
    assert (
        config(endpoint="HTTP://Host:80/").logstore_sig == config(endpoint="host:80").logstore_sig
    )


def shard(shard_id: int, *, parents: tuple[int, ...] = (), end: str | None = None) -> ShardInfo:
    status = "readwrite" if end is None else "readonly"
    return ShardInfo(shard_id, status, "", "", 0, parents, end_cursor=end)


def test_a_read_only_shard_is_finished_when_its_checkpoint_is_its_end() -> None:
    shards = {0: shard(0, end="NQ=="), 1: shard(1, end="MA=="), 2: shard(2)}
    assert finished_shards(shards, {0: "NQ==", 1: "", 2: "MA=="}) == {0}


def test_ordered_children_wait_for_every_ancestor() -> None:
    # 0 split into 1 and 2; 2 and 3 merged into 4
    shards = {
        0: shard(0, end="MTA="),
        1: shard(1),
        2: shard(2, parents=(0,), end="NQ=="),
        3: shard(3, end="Mw=="),
        4: shard(4, parents=(2, 3)),
    }
    shards[1] = shard(1, parents=(0,))
    assert consumable_shards(shards, set(), ordered=True) == {0, 3}
    assert consumable_shards(shards, {0}, ordered=True) == {1, 2, 3}
    assert consumable_shards(shards, {0, 2, 3}, ordered=True) == {1, 4}
    assert consumable_shards(shards, set(), ordered=False) == {0, 1, 2, 3, 4}


def test_a_parent_deleted_by_retention_does_not_block_its_children() -> None:
    assert consumable_shards({5: shard(5, parents=(1,))}, set(), ordered=True) == {5}


def test_a_grandchild_waits_for_its_grandparent() -> None:
    shards = {
        0: shard(0, end="MQ=="),
        1: shard(1, parents=(0,), end="MA=="),
        2: shard(2, parents=(1,)),
    }
    assert consumable_shards(shards, {1}, ordered=True) == {0}
