"""Batch reads: exactly what was written, between any two positions."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession
from spark_helpers import PROJECT, LogStore

from loghub.wire.cursor import encode_cursor
from loghub.wire.proto import LogGroup


def _group(logs: list[tuple[int, int, dict[str, str]]], **fields: Any) -> LogGroup:
    group = LogGroup()
    for time_s, time_ns, contents in logs:
        log = group.Logs.add()
        log.Time = time_s
        if time_ns:
            log.Time_ns = time_ns
        for key, value in contents.items():
            content = log.Contents.add()
            content.Key, content.Value = key, value
    group.Topic = fields.get("topic", "")
    group.Source = fields.get("source", "")
    for key, value in fields.get("tags", {}).items():
        tag = group.LogTags.add()
        tag.Key, tag.Value = key, value
    return group


def _us(moment: datetime) -> int:
    """Microseconds since the epoch of a timestamp as collect() returns it (naive, local)."""
    return round(moment.timestamp() * 1_000_000)


def test_batch_read_returns_exactly_what_was_written(
    spark: SparkSession, logstore: LogStore
) -> None:
    expected: dict[tuple[int, str, int], tuple[Any, ...]] = {}
    long_value = "x" * 300 + "é" * 100  # lengths that need two-byte varints
    for shard_id in (0, 1):
        for seq in range(6):
            logs = [
                (1_700_000_000 + seq, 123_456_789 * (i % 2), {"n": str(i), "shard": str(shard_id)})
                for i in range(seq + 1)
            ]
            logs.append((1_700_000_100, 0, {"long": long_value, "": "empty key", "u": "日本"}))
            logs.append((1_700_000_101, 0, {}))
            fields = {"topic": f"t{seq}", "source": "10.0.0.1", "tags": {"env": "test"}}
            logstore.client.put_log_group(PROJECT, "app", _group(logs, **fields), shard_id=shard_id)
            for index, (time_s, time_ns, contents) in enumerate(logs):
                moment = time_s * 1_000_000 + time_ns // 1000
                expected[(shard_id, encode_cursor(seq), index)] = (
                    moment,
                    f"t{seq}",
                    "10.0.0.1",
                    {"env": "test"},
                    contents,
                )
    rows = spark.read.format("loghub").options(**logstore.options()).load().collect()
    got = {
        (r.shard, r.cursor, r.log_index): (_us(r.log_time), r.topic, r.source, r.tags, r.contents)
        for r in rows
    }
    assert len(rows) == len(expected)
    assert got == expected
    assert all(r.receive_time is None for r in rows)


def test_batch_read_between_two_positions(spark: SparkSession, logstore: LogStore) -> None:
    for n in range(10):
        logstore.put([{"n": str(n)}], shard_id=0)
        logstore.put([{"n": str(n)}], shard_id=1)
    options = logstore.options(startingOffsets='{"0": 3, "1": "latest"}', endingOffsets='{"0": 7}')
    rows = spark.read.format("loghub").options(**options).load().collect()
    assert sorted(int(r.contents["n"]) for r in rows) == [3, 4, 5, 6]
    assert {r.shard for r in rows} == {0}


def test_batch_read_positions_by_receive_time(spark: SparkSession, logstore: LogStore) -> None:
    logstore.put([{"n": "1"}], shard_id=0)
    now_s = int(time.time())

    def count(**options: str) -> int:
        return spark.read.format("loghub").options(**logstore.options(**options)).load().count()

    assert count(startingOffsets=str(now_s - 600)) == 1
    assert count(startingOffsets=str(now_s + 600)) == 0
    assert count(endingOffsets=str(now_s - 600)) == 0
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_s + 600))
    assert count(endingOffsets=later) == 1


def test_a_logstore_of_wide_heterogeneous_logs_reads_every_row(
    spark: SparkSession, logstore: LogStore
) -> None:
    """Groups whose logs have keys no other log has, around the 64 distinct keys at which the
    fast decoder once crashed (shard 1 holds exactly the reported group, so its pull is one
    chunk of 64 distinct keys): every row comes back with its fields."""
    expected: dict[tuple[int, str, int], dict[str, str]] = {}
    shapes = {  # shard: logs x keys a log
        0: [(7, 9), (5, 13), (64, 1), (3, 150)],
        1: [(8, 8)],
    }
    for shard_id, groups in shapes.items():
        for seq, (logs_count, keys_per_log) in enumerate(groups):
            logs = [
                (1_700_000_000, 0, {f"k{i}_{j}": f"{seq}.{i}.{j}" for j in range(keys_per_log)})
                for i in range(logs_count)
            ]
            logstore.client.put_log_group(PROJECT, "app", _group(logs), shard_id=shard_id)
            for index, (_time_s, _ns, contents) in enumerate(logs):
                expected[(shard_id, encode_cursor(seq), index)] = contents
    rows = spark.read.format("loghub").options(**logstore.options()).load().collect()
    assert {(r.shard, r.cursor, r.log_index): r.contents for r in rows} == expected
    assert len(rows) == 8 + 7 + 5 + 64 + 3
