"""Streaming reads: offsets in the checkpoint, exactly once into Parquet across a stop, read
limits, and shards that split and merge while the query runs."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery
from spark_helpers import PROJECT, LogStore, numbered

from loghub.wire.cursor import decode_cursor, encode_cursor


def _stream(spark: SparkSession, logstore: LogStore, **options: Any) -> DataFrame:
    return (
        spark.readStream.format("loghub")
        .options(**logstore.options(startingOffsets="earliest", **options))
        .load()
    )


def _to_parquet(df: DataFrame, tmp_path: Path, **trigger: Any) -> StreamingQuery:
    return (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(**trigger)
        .start()
    )


def _wait_for_batches(query: StreamingQuery, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while len([p for p in query.recentProgress if p["numInputRows"]]) < count:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the query made no progress"
        time.sleep(0.2)


def test_stop_and_restart_from_checkpoint_delivers_every_log_once(
    spark: SparkSession, logstore: LogStore, tmp_path: Path
) -> None:
    for i in range(12):
        logstore.put(numbered(i * 10, 10), shard_id=i % 2)
    query = _to_parquet(
        _stream(spark, logstore, maxOffsetsPerTrigger=2), tmp_path, processingTime="0 seconds"
    )
    try:
        _wait_for_batches(query, 2)
    finally:
        query.stop()  # may cancel a batch in flight; the restart replays it
    for i in range(12, 16):
        logstore.put(numbered(i * 10, 10), shard_id=i % 2)
    query = _to_parquet(
        _stream(spark, logstore, maxOffsetsPerTrigger=2), tmp_path, availableNow=True
    )
    try:
        assert query.awaitTermination(180)
    finally:
        query.stop()
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    delivered = Counter((r.shard, r.cursor, r.log_index) for r in rows)
    assert max(delivered.values()) == 1
    assert sorted(int(r.contents["n"]) for r in rows) == list(range(160))


def test_available_now_reads_at_most_max_offsets_per_trigger_groups_a_batch(
    spark: SparkSession, logstore: LogStore, tmp_path: Path
) -> None:
    for i in range(10):
        logstore.put(numbered(i * 3, 3), shard_id=0)
    query = (
        _stream(spark, logstore, maxOffsetsPerTrigger=4)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120)
        rows_per_batch = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert rows_per_batch == [12, 12, 6]  # 4 + 4 + 2 groups of 3 logs


def test_consumer_group_option_writes_progress_as_group_checkpoints(
    spark: SparkSession, logstore: LogStore, tmp_path: Path
) -> None:
    for i in range(10):
        logstore.put(numbered(i * 3, 3), shard_id=0)
    query = (
        _stream(spark, logstore, maxOffsetsPerTrigger=4, consumerGroup="spark-lag")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()
    project, name = logstore.options()["project"], logstore.name
    groups = logstore.client.list_consumer_groups(project, name)
    assert [g["name"] for g in groups] == ["spark-lag"]
    checkpoints = logstore.client.get_checkpoints(project, name, "spark-lag")
    # batches of 4, 4 and 2 groups: Spark commits all but the last one before it stops
    assert checkpoints[0] == encode_cursor(8)


def test_split_and_merge_while_streaming_lose_nothing_and_ordered_keeps_key_order(
    spark: SparkSession, logstore: LogStore
) -> None:
    keys = [f"{i:x}" * 32 for i in range(16)]  # hash keys spread over the whole key space
    sent: dict[str, int] = {key: 0 for key in keys}

    def produce(rounds: int) -> None:
        for _ in range(rounds):
            for key in keys:
                logstore.put(numbered(sent[key], 2, key=key), hash_key=key)
                sent[key] += 2

    delivered: list[tuple[int, int, int, int, str, int]] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        delivered.extend(
            (
                batch_id,
                r.shard,
                decode_cursor(r.cursor),
                r.log_index,
                r.contents["key"],
                int(r.contents["n"]),
            )
            for r in batch.collect()
        )

    produce(2)
    query = (
        _stream(spark, logstore, ordered="true", maxOffsetsPerTrigger=8)
        .writeStream.foreachBatch(collect)
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        _wait_for_batches(query, 1)
        logstore.client.split_shard(PROJECT, "app", 0)  # shards 2 and 3 take 0's range
        produce(2)
        logstore.client.merge_shard(PROJECT, "app", 3)  # 3 and 1 become shard 4
        produce(2)
        query.processAllAvailable()
    finally:
        query.stop()
    shards = {s.shard_id: s for s in logstore.client.list_shards(PROJECT, "app")}
    assert shards[0].children and shards[4].parents == (3, 1)
    got = Counter((key, n) for *_, key, n in delivered)
    assert got == Counter((key, n) for key, total in sent.items() for n in range(total))
    for key in keys:
        counters = [n for *_, k, n in sorted(delivered) if k == key]
        assert counters == sorted(counters), f"key {key} out of order: {counters}"
    by_shard_batch = {(shard, batch) for batch, shard, *_ in delivered}
    first_batch = {s: min(b for sh, b in by_shard_batch if sh == s) for s, _ in by_shard_batch}
    last_batch = {s: max(b for sh, b in by_shard_batch if sh == s) for s, _ in by_shard_batch}
    for shard_id, shard in shards.items():
        for parent in shard.parents:
            if shard_id in first_batch and parent in last_batch:
                assert first_batch[shard_id] > last_batch[parent]
