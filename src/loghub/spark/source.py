"""The `loghub` data source: batch and streaming reads of a logstore, and its sinks.

Where each piece runs (pyspark's Python data source API; see docs/spark.md):

- ``LogHubDataSource`` is created for every ``load()``/``save()`` in a throwaway Python
  worker; ``schema()`` runs there.
- The stream reader's planning methods (``initialOffset``, ``latestOffset``, ``partitions``,
  ``commit``) run in one long-lived Python process per query, the source runner.
- ``read(partition)`` runs on executors, on a pickled copy of the reader made right after
  ``__init__``. So a reader holds only its options, opens its HTTP client lazily, and puts
  everything ``read()`` needs (shard, range) into the ``ShardRange`` partition.

Offsets (``offsets.py``): per shard, the next log-group sequence number. A micro-batch reads
each shard's ``[start, end)`` in one partition, in order; ``read()`` depends only on the
range, so a batch replayed from the checkpoint after a crash reads exactly the same groups.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from loghub.client import LogHubClient
from loghub.errors import ConsumerGroupAlreadyExist, ParameterInvalid
from loghub.spark import _decode, _worker
from loghub.spark._client import ShardPulls, list_extents
from loghub.spark._prefetch import prefetched
from loghub.spark.offsets import ShardExtent, plan_end, resolve_position
from loghub.spark.options import (
    Position,
    ReadOptions,
    parse_read_options,
    parse_write_options,
)
from loghub.spark.schema import parse_content_columns, spark_schema
from loghub.spark.sink import LogHubBatchWriter, LogHubStreamWriter
from loghub.wire.cursor import encode_cursor

# A streaming query writing consumer-group checkpoints: the consumer name its checkpoints show,
# and the timeout of a group it has to create (nothing heartbeats in it; the timeout only
# matters if consumers of the same group ever heartbeat).
_SPARK_CONSUMER = "spark"
_GROUP_TIMEOUT_S = 60

__all__ = ["LogHubDataSource", "ShardRange"]

_DECODE_BYTES_MIN = 4 * 1024 * 1024  # pulls are joined until this much, then decoded at once
_RECEIVE_TIME_TAG = "__receive_time__"  # what the hosted service adds with appendMeta
_PREFETCH_BATCHES = 2  # record batches decoded ahead of Spark, per task


@dataclass
class ShardRange(InputPartition):
    """Groups ``[start, end)`` of one shard: one partition of a batch. ``node_address`` is
    where the shard's log was at planning, in a LogHub cluster: the executor pulls from
    there (see ``ShardPulls``)."""

    shard_id: int
    start: int
    end: int
    node_address: str | None = None


class LogHubDataSource(DataSource):
    """``spark.read.format("loghub")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return "loghub"

    def schema(self) -> StructType:
        _worker.prepare()  # planning's Python workers collect garbage as often as executors'
        # Not parse_read_options: schema() cannot tell a batch read from a streaming one.
        return spark_schema(parse_content_columns(self.options.get("contentcolumns", "")))

    def reader(self, schema: StructType) -> DataSourceReader:
        _worker.prepare()
        options = parse_read_options(self.options, streaming=False)
        _check_schema(schema, options)
        return LogHubBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _worker.prepare()
        options = parse_read_options(self.options, streaming=True)
        _check_schema(schema, options)
        return LogHubStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return LogHubBatchWriter(parse_write_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return LogHubStreamWriter(parse_write_options(self.options), schema, overwrite)


def _check_schema(schema: StructType, options: ReadOptions) -> None:
    expected = spark_schema(options.content_columns)
    if [(f.name, f.dataType) for f in schema.fields] != [
        (f.name, f.dataType) for f in expected.fields
    ]:
        raise ParameterInvalid(
            "the loghub source has a fixed schema; choose typed content columns with the "
            f"option contentColumns instead of .schema() (expected {expected.simpleString()})"
        )


class _Reader:
    """What the batch and the stream reader share: options, a lazy client, ``read()``."""

    def __init__(self, options: ReadOptions) -> None:
        self._options = options
        self._client: LogHubClient | None = None
        # shard id -> host:port of its cluster node, from the last shard list (planning only)
        self._nodes: dict[int, str] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # never ship a connection pool
        return state

    def _planning_client(self) -> LogHubClient:
        if self._client is None:
            self._client = self._options.connection.client()
        return self._client

    def _close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _extents(self, position: Position | None = None) -> list[ShardExtent]:
        at_time = position.time_s if position is not None and position.kind == "time" else None
        extents = list_extents(self._planning_client(), self._options.connection, at_time)
        self._nodes = {e.shard_id: e.node_address for e in extents if e.node_address}
        return extents

    def _range(self, shard: str, start: int, end: int) -> ShardRange:
        assert self._nodes is not None, "partitions are planned from a shard list"
        return ShardRange(int(shard), start, end, self._nodes.get(int(shard)))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The rows of one shard range as Arrow record batches, in sequence order; pulled and
        decoded a batch or two ahead, in a thread (see ``_prefetch``)."""
        if not isinstance(partition, ShardRange):  # no ranges: Spark sends one empty partition
            return iter(())
        _worker.prepare()
        return prefetched(lambda: self._read_range(partition), _PREFETCH_BATCHES)

    def _read_range(self, partition: ShardRange) -> Iterator[Any]:
        pulls = ShardPulls(self._options.connection, partition.node_address)
        try:
            pending: list[bytes] = []
            pending_bytes, first_seq, seq = 0, partition.start, partition.start
            for pull in pulls.iter_range(
                partition.shard_id, partition.start, partition.end, self._options.pull_compression
            ):
                pending.append(pull.data)
                pending_bytes += len(pull.data)
                seq = pull.next_seq
                if pending_bytes >= _DECODE_BYTES_MIN or seq >= partition.end:
                    yield from self._batches(
                        pulls.client, partition.shard_id, first_seq, b"".join(pending)
                    )
                    pending, pending_bytes, first_seq = [], 0, seq
            assert not pending and seq == partition.end, (seq, partition)
        finally:
            pulls.close()

    def _batches(
        self, client: LogHubClient, shard_id: int, first_seq: int, data: bytes
    ) -> Iterator[Any]:
        # LogGroupList bytes concatenate: the joined pulls are one list.
        for logs in _decode.decode(data):
            seq = first_seq + logs.first_group
            if self._options.receive_time == "server":
                connection = self._options.connection
                receive_times: list[int | None] = [
                    client.get_cursor_time(
                        connection.project, connection.logstore, shard_id, encode_cursor(seq + i)
                    )
                    for i in range(len(logs.logs_per_group))
                ]
            else:
                receive_times = [_tag_time(tags) for tags in logs.tags]
            yield _decode.to_record_batch(
                logs, shard_id, seq, receive_times, self._options.content_columns
            )


def _tag_time(tags: dict[str, str]) -> int | None:
    value = tags.get(_RECEIVE_TIME_TAG, "")
    return int(value) if value.isdigit() else None


class LogHubBatchReader(_Reader, DataSourceReader):
    """``spark.read``: every shard from ``startingOffsets`` (default earliest) to
    ``endingOffsets`` (default latest, as of planning)."""

    def partitions(self) -> Sequence[ShardRange]:
        try:
            extents = self._extents(self._options.starting)
            start = resolve_position(self._options.starting, extents)
            if self._options.ending.kind == "time":
                ending_extents = self._extents(self._options.ending)
            else:
                ending_extents = extents
            end = resolve_position(self._options.ending, ending_extents)
        finally:
            self._close_client()
        return [
            self._range(key, start[key], end[key])
            for key in sorted(start, key=int)
            if key in end and end[key] > start[key]
        ]


class LogHubStreamReader(_Reader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: offsets in Spark's checkpoint; new shards join as they appear."""

    def __init__(self, options: ReadOptions) -> None:
        super().__init__(options)
        self._cap: dict[str, int] | None = None  # set for Trigger.AvailableNow
        self._latest: dict[str, int] | None = None
        self._group_ready = False

    def initialOffset(self) -> dict[str, int]:
        return resolve_position(self._options.starting, self._extents(self._options.starting))

    def getDefaultReadLimit(self) -> ReadLimit:
        groups_max = self._options.max_groups_per_trigger
        return ReadAllAvailable() if groups_max is None else ReadMaxRows(groups_max)

    def prepareForTriggerAvailableNow(self) -> None:
        self._cap = {str(extent.shard_id): extent.end for extent in self._extents()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        extents = self._extents()
        self._latest = {**start, **{str(e.shard_id): e.end for e in extents}}
        groups_max = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return plan_end(
            start, extents, ordered=self._options.ordered, groups_max=groups_max, cap=self._cap
        )

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self._latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[ShardRange]:
        if self._nodes is None:
            # a batch replayed from the checkpoint after a restart is planned before any
            # latestOffset: one shard list tells where the shards are
            self._extents()
        return [
            self._range(key, start[key], end[key])
            for key in sorted(end, key=int)
            if key in start and end[key] > start[key]
        ]

    def commit(self, end: dict[str, int]) -> None:
        """The position lives in Spark's checkpoint; with ``consumerGroup`` it is also written
        as that group's checkpoints (forced: Spark, not the group, decides who reads), so lag
        shows in LogHub's tools. Spark calls this one batch late and not for the last batch
        before a stop, so the group's checkpoints trail Spark's by up to one batch."""
        group = self._options.consumer_group
        if group is None:
            return
        connection = self._options.connection
        client = self._planning_client()
        if not self._group_ready:
            with contextlib.suppress(ConsumerGroupAlreadyExist):
                client.create_consumer_group(
                    connection.project, connection.logstore, group,
                    _GROUP_TIMEOUT_S, self._options.ordered,
                )  # fmt: skip
            self._group_ready = True
        for shard, sequence in sorted(end.items(), key=lambda item: int(item[0])):
            client.update_checkpoint(
                connection.project, connection.logstore, group, int(shard),
                encode_cursor(sequence), consumer=_SPARK_CONSUMER,
            )  # fmt: skip

    def stop(self) -> None:
        self._close_client()
