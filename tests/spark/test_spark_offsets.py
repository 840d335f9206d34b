"""The micro-batch planner and the option parser (pure functions: no Spark, no server)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loghub.errors import ParameterInvalid
from loghub.spark.offsets import ShardExtent, allocate, plan_end, resolve_position
from loghub.spark.options import Position, parse_position, parse_read_options

BASE = {"endpoint": "127.0.0.1:1", "project": "p", "logstore": "s"}


def test_a_new_shard_enters_at_its_beginning_and_is_read_from_the_next_batch() -> None:
    shards = [ShardExtent(0, 0, 10), ShardExtent(1, 4, 9)]
    end = plan_end({"0": 2}, shards, ordered=False)
    assert end == {"0": 10, "1": 4}
    assert plan_end(end, shards, ordered=False) == {"0": 10, "1": 9}


def test_a_shard_no_longer_listed_keeps_its_position() -> None:
    assert plan_end({"0": 5, "7": 3}, [ShardExtent(0, 0, 6)], ordered=False) == {"0": 6, "7": 3}


def test_ordered_holds_children_until_the_batch_start_shows_every_parent_finished() -> None:
    parent_a = ShardExtent(0, 0, 10, read_only=True)
    parent_b = ShardExtent(1, 0, 5, read_only=True)
    child = ShardExtent(2, 0, 7, parents=(0, 1))
    shards = [parent_a, parent_b, child]
    start = {"0": 4, "1": 5, "2": 0}
    first = plan_end(start, shards, ordered=True)
    assert first == {"0": 10, "1": 5, "2": 0}  # parent 0 is read to its end in this batch
    assert plan_end(first, shards, ordered=True) == {"0": 10, "1": 5, "2": 7}
    assert plan_end(start, shards, ordered=False) == {"0": 10, "1": 5, "2": 7}


def test_ordered_treats_an_expired_parent_as_finished_and_a_writable_one_as_not() -> None:
    child = ShardExtent(2, 0, 7, parents=(0,))
    assert plan_end({"2": 0}, [child], ordered=True) == {"2": 7}
    writable_parent = ShardExtent(0, 0, 3)
    assert plan_end({"0": 3, "2": 0}, [writable_parent, child], ordered=True)["2"] == 0


def test_available_now_cap_bounds_shards_and_leaves_later_shards_out() -> None:
    shards = [ShardExtent(0, 0, 10), ShardExtent(1, 0, 10)]
    assert plan_end({"0": 0}, shards, ordered=False, cap={"0": 6}) == {"0": 6}


def test_limit_is_shared_by_backlog_and_exactly_used() -> None:
    shards = [ShardExtent(0, 0, 100), ShardExtent(1, 0, 10), ShardExtent(2, 0, 0)]
    end = plan_end({"0": 0, "1": 0, "2": 0}, shards, ordered=False, groups_max=11)
    assert end == {"0": 10, "1": 1, "2": 0}


def test_a_small_limit_takes_turns_instead_of_starving_a_shard() -> None:
    shards = [ShardExtent(0, 0, 100), ShardExtent(1, 0, 100)]
    start = {"0": 0, "1": 0}
    for _ in range(4):
        start = plan_end(start, shards, ordered=False, groups_max=1)
    assert start == {"0": 2, "1": 2}


@given(st.dictionaries(st.sampled_from("0123456789"), st.integers(0, 1000)), st.integers(1, 500))
def test_allocate_never_exceeds_the_limit_or_a_backlog(backlog: dict[str, int], limit: int) -> None:
    backlog = {k: v for k, v in backlog.items() if v}
    granted = allocate(backlog, limit)
    assert sum(granted.values()) == min(limit, sum(backlog.values()))
    assert all(0 < granted[k] <= backlog[k] for k in granted)


def test_positions_resolve_per_shard_and_clamp_to_what_is_held() -> None:
    shards = [ShardExtent(0, 5, 20), ShardExtent(1, 0, 8), ShardExtent(2, 0, 3)]
    position = parse_position('{"0": 2, "1": 6, "2": "latest"}', "startingOffsets", "earliest")
    assert resolve_position(position, shards) == {"0": 5, "1": 6, "2": 3}
    assert resolve_position(Position("latest"), shards) == {"0": 20, "1": 8, "2": 3}
    partial = parse_position('{"1": 6}', "endingOffsets", "latest")
    assert resolve_position(partial, shards) == {"0": 20, "1": 6, "2": 3}


def test_times_are_unix_seconds_or_iso_8601_in_utc_by_default() -> None:
    assert parse_position("1700000000", "o", "earliest") == Position("time", time_s=1700000000)
    iso = parse_position("2023-11-14T22:13:20", "o", "earliest")
    assert iso.time_s == 1700000000
    assert parse_position("2023-11-14T23:13:20+01:00", "o", "earliest").time_s == 1700000000


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"consumergroup": "g"}, False, "consumerGroup applies to streaming reads only"),
        ({"endingoffsets": "latest"}, True, "endingOffsets applies to batch reads only"),
        ({"maxoffsetspertrigger": "5"}, False, "applies to streaming reads only"),
        ({"maxoffsetspertrigger": "0"}, True, "at least 1"),
        ({"ordered": "yes"}, True, "ordered must be true or false"),
        ({"startingoffsets": "soon"}, True, "startingOffsets must be earliest"),
        ({"startingoffsets": '{"a": 1}'}, True, "is not a number"),
        ({"startingoffsets": '{"0": -1}'}, True, "sequence number >= 0"),
        ({"endingoffsets": "earliest"}, False, "cannot be earliest"),
        ({"contentcolumns": "status date"}, False, "type 'date'"),
        ({"contentcolumns": "shard int"}, False, "already taken"),
        ({"accesskeyid": "ak"}, False, "set both accessKeyId and accessKeySecret"),
        ({"receivetime": "now"}, False, "receiveTime must be tag or server"),
    ],
)
def test_bad_options_fail_with_a_message_naming_the_option(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(ParameterInvalid, match=message):
        parse_read_options({**BASE, **options}, streaming=streaming)


def test_missing_connection_options_are_named() -> None:
    with pytest.raises(ParameterInvalid, match="endpoint, logstore"):
        parse_read_options({"project": "p"}, streaming=False)
