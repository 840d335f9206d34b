"""Typed columns, receive times, the sinks, and the errors a user sees."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F
from spark_helpers import PROJECT, LogStore, numbered

from loghub.spark.sink import hash_key


def test_typed_content_columns_and_receive_times_from_the_server(
    spark: SparkSession, logstore: LogStore
) -> None:
    before_s = int(time.time())
    logstore.put([{"status": "200", "latency": "1.5"}, {"status": "oops"}], shard_id=0)
    df = (
        spark.read.format("loghub")
        .options(
            **logstore.options(contentColumns="status int, latency double", receiveTime="server")
        )
        .load()
    )
    assert df.schema["status"].dataType.simpleString() == "int"
    # what is never null says so (Spark then skips the checks); what can be null says so too
    nullable = {field.name: field.nullable for field in df.schema.fields}
    assert [name for name, can in nullable.items() if can] == ["receive_time", "status", "latency"]
    assert df.schema["contents"].dataType.valueContainsNull is False
    assert df.schema["tags"].dataType.valueContainsNull is False
    rows = df.orderBy("log_index").collect()
    assert [(r.status, r.latency) for r in rows] == [(200, 1.5), (None, None)]
    assert rows[0].contents == {"status": "200", "latency": "1.5"}
    received_s = rows[0].receive_time.timestamp()
    assert before_s - 1 <= received_s <= time.time() + 1


def test_batch_write_then_read_gives_back_the_rows(spark: SparkSession, logstore: LogStore) -> None:
    logstore.client.create_logstore(PROJECT, "out", shard_count=1)
    moment = datetime(2024, 5, 1, 12, 0, 0, 250_000, tzinfo=UTC)
    df = spark.createDataFrame(
        [
            Row(
                path="/a",
                status=200,
                ok=True,
                log_time=moment,
                topic="web",
                tags={"env": "t"},
                contents={"extra": "x"},
            ),
            Row(
                path="/b",
                status=None,
                ok=False,
                log_time=moment,
                topic="web",
                tags={"env": "t"},
                contents={},
            ),
        ]
    )
    df.write.format("loghub").options(**logstore.options()).option("logstore", "out").mode(
        "append"
    ).save()
    rows = (
        spark.read.format("loghub")
        .options(**logstore.options())
        .option("logstore", "out")
        .load()
        .collect()
    )
    assert sorted(sorted(r.contents.items()) for r in rows) == [
        sorted({"path": "/a", "status": "200", "ok": "true", "extra": "x"}.items()),
        sorted({"path": "/b", "ok": "false"}.items()),
    ]
    assert {(r.topic, r.log_time.timestamp(), tuple(r.tags.items())) for r in rows} == {
        ("web", moment.timestamp(), (("env", "t"),))
    }


def test_streaming_copy_routed_by_hash_key_puts_each_key_in_one_shard(
    spark: SparkSession, logstore: LogStore, tmp_path: Path
) -> None:
    logstore.client.create_logstore(PROJECT, "copy", shard_count=4)
    for i in range(8):
        logstore.put(numbered(i * 10, 10, user=f"u{i % 5}"), shard_id=i % 2)
    source = (
        spark.readStream.format("loghub")
        .options(**logstore.options(startingOffsets="earliest"))
        .load()
        .withColumn("user", F.col("contents")["user"])
    )
    query = (
        source.writeStream.format("loghub")
        .options(**logstore.options(hashKeyColumn="user"))
        .option("logstore", "copy")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()
    rows = (
        spark.read.format("loghub")
        .options(**logstore.options())
        .option("logstore", "copy")
        .load()
        .collect()
    )
    assert sorted(int(r.contents["n"]) for r in rows) == list(range(80))
    shards_of_user: dict[str, set[int]] = defaultdict(set)
    for row in rows:
        shards_of_user[row.contents["user"]].add(row.shard)
    ranges = {
        s.shard_id: (int(s.inclusive_begin_key, 16), int(s.exclusive_end_key, 16))
        for s in logstore.client.list_shards(PROJECT, "copy")
    }
    for user, shards in shards_of_user.items():
        (shard,) = shards
        begin, end = ranges[shard]
        assert begin <= hash_key(user) < end or (end == 2**128 - 1 and hash_key(user) >= begin)


@pytest.mark.parametrize(
    ("configure", "message"),
    [
        (lambda r: r.option("consumerGroup", "g"), "consumerGroup applies to streaming reads"),
        (lambda r: r.schema("n int"), "fixed schema"),
        (lambda r: r.option("startingOffsets", "tomorrow"), "startingOffsets must be"),
    ],
)
def test_bad_read_options_fail_at_load_with_the_reason(
    spark: SparkSession, logstore: LogStore, configure: object, message: str
) -> None:
    reader = spark.read.format("loghub").options(**logstore.options())
    with pytest.raises(PySparkException, match=message):
        configure(reader).load().collect()  # type: ignore[operator]


def test_overwrite_is_refused(spark: SparkSession, logstore: LogStore) -> None:
    df = spark.createDataFrame([Row(a="1")])
    with pytest.raises(PySparkException, match="append-only"):
        df.write.format("loghub").options(**logstore.options()).mode("overwrite").save()
