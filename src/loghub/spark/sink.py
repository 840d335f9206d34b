"""The `loghub` sinks: DataFrame rows into a logstore, as log groups.

Row to log: every column becomes a content key (values as text: numbers as Python writes
them, booleans as ``true``/``false``, nested values as JSON), except these, which mean what
they mean in the source's schema:

    contents   map          its entries become contents too (a column of the same name wins)
    log_time   timestamp    the log's time (or an integer of unix seconds); null or absent:
               or integer   the time of writing
    topic      string       the group's topic
    source     string       the group's source
    tags       map          the group's tags
    shard, cursor, log_index, receive_time      ignored, so a DataFrame read from one
                                                logstore can be written to another as it is

Logs with equal topic, source, tags (and shard, when routed) go into one group of at most
``logsPerGroup`` logs (and about 4 MiB). With ``hashKeyColumn``, each log is routed by the MD5
of that column (as ``loghub produce --hash-key-field`` does): the writer keeps a snapshot of
the shards' key ranges, sends each group to the readwrite shard covering its keys by shard id,
and, when a split or merge made that shard read-only (``ShardReadOnly``: nothing was written),
refreshes the snapshot and routes again. Within one task, logs of one key keep their order.

Delivery is at least once: a LogHub write cannot be made idempotent, so a task retried by
Spark, or a streaming batch replayed after a crash, writes its logs again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type information
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    IntegralType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from loghub._clock import SystemClock
from loghub.client import LogHubClient
from loghub.errors import LogHubError, ParameterInvalid, ShardReadOnly
from loghub.spark.options import WriteOptions
from loghub.wire.proto import LogGroup

__all__ = ["LogHubBatchWriter", "LogHubStreamWriter", "WriteResult", "check_schema", "hash_key"]

_GROUP_BYTES_MAX = 4 * 1024 * 1024  # well under the service's 32 MiB per request
_IGNORED = frozenset({"shard", "cursor", "log_index", "receive_time"})
_SPECIAL = frozenset({"contents", "log_time", "topic", "source", "tags"})
_REROUTES_MAX = 5
_KEY_SPACE_END = 2**128


@dataclass
class WriteResult(WriterCommitMessage):
    logs: int
    groups: int


def check_schema(schema: StructType, options: WriteOptions) -> None:
    """Fails at ``save()``/``start()`` on columns the sink cannot write."""
    fields = {f.name: f.dataType for f in schema.fields}
    for name in ("contents", "tags"):
        data_type = fields.get(name)
        if data_type is not None and not (
            isinstance(data_type, MapType) and isinstance(data_type.keyType, StringType)
        ):
            raise ParameterInvalid(f"column {name} must be a map with string keys")
    for name in ("topic", "source"):
        if name in fields and not isinstance(fields[name], StringType):
            raise ParameterInvalid(f"column {name} must be a string")
    if "log_time" in fields and not isinstance(
        fields["log_time"], TimestampType | TimestampNTZType | IntegralType
    ):
        raise ParameterInvalid("column log_time must be a timestamp or unix seconds")
    if options.hash_key_column is not None and options.hash_key_column not in fields:
        raise ParameterInvalid(f"hashKeyColumn {options.hash_key_column!r} is not a column")


class _Router:
    """Readwrite shards by hash-key range, from a snapshot refreshed on ``ShardReadOnly``."""

    def __init__(self, client: LogHubClient, options: WriteOptions) -> None:
        self._client, self._options = client, options
        self._ranges: list[tuple[int, int, int]] = []
        self.refresh()

    def refresh(self) -> None:
        connection = self._options.connection
        shards = self._client.list_shards(connection.project, connection.logstore)
        self._ranges = sorted(
            (_key(s.inclusive_begin_key), _end_key(s.exclusive_end_key), s.shard_id)
            for s in shards
            if s.writable
        )

    def shard_for(self, key: int) -> int:
        for begin, end, shard_id in self._ranges:
            if begin <= key < end:
                return shard_id
        raise LogHubError(f"no readwrite shard covers hash key {key:032x}")


def _key(text: str) -> int:
    return int(text.ljust(32, "0"), 16)


def _end_key(text: str) -> int:
    """An exclusive end; 32 ``f`` stands for the end of the key space, as the service writes
    it."""
    value = _key(text)
    return _KEY_SPACE_END if value == _KEY_SPACE_END - 1 else value


def hash_key(value: Any) -> int:
    """The MD5 of a value's text (UTF-8) as a 128-bit key; null hashes as ""."""
    text = "" if value is None else _text(value)
    return int.from_bytes(hashlib.md5(text.encode("utf-8")).digest(), "big")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return json.dumps(value, default=str, ensure_ascii=False)


@dataclass
class _Pending:
    logs: list[tuple[int | None, int, int, list[tuple[str, str]]]] = field(default_factory=list)
    size_bytes: int = 0


class _GroupWriter:
    """Collects logs into groups and sends them; one per task."""

    def __init__(self, options: WriteOptions) -> None:
        self._options = options
        self._client = options.connection.client()
        self._router = _Router(self._client, options) if options.hash_key_column else None
        self._pending: dict[tuple[Any, ...], _Pending] = {}
        self._now_s = SystemClock().wall_ms() // 1000
        self.logs = 0
        self.groups = 0

    def close(self) -> None:
        self._client.close()

    def add(
        self,
        key: int | None,
        header: tuple[str, str, tuple[tuple[str, str], ...]],
        time_s: int | None,
        time_ns: int,
        contents: list[tuple[str, str]],
    ) -> None:
        shard_id = None if key is None or self._router is None else self._router.shard_for(key)
        group_key = (shard_id, *header)
        pending = self._pending.setdefault(group_key, _Pending())
        pending.logs.append((key, self._now_s if time_s is None else time_s, time_ns, contents))
        pending.size_bytes += 16 + sum(len(k) + len(v) + 4 for k, v in contents)
        if (
            len(pending.logs) >= self._options.logs_per_group_max
            or pending.size_bytes >= _GROUP_BYTES_MAX
        ):
            del self._pending[group_key]
            self._send(group_key, pending.logs)

    def flush(self) -> None:
        while self._pending:
            group_key = next(iter(self._pending))
            self._send(group_key, self._pending.pop(group_key).logs)

    def _send(
        self,
        group_key: tuple[Any, ...],
        logs: Sequence[tuple[int | None, int, int, list[tuple[str, str]]]],
        attempt: int = 0,
    ) -> None:
        shard_id, topic, source, tags = group_key
        connection = self._options.connection
        group = _log_group(logs, topic, source, tags)
        try:
            self._client.put_log_group(
                connection.project, connection.logstore, group, shard_id=shard_id
            )
        except ShardReadOnly:
            if self._router is None or attempt >= _REROUTES_MAX:
                raise
            self._router.refresh()  # split or merged since the snapshot: route again
            by_shard: dict[int, list[tuple[int | None, int, int, list[tuple[str, str]]]]] = {}
            for log in logs:
                assert log[0] is not None
                by_shard.setdefault(self._router.shard_for(log[0]), []).append(log)
            for new_shard, part in by_shard.items():
                self._send((new_shard, topic, source, tags), part, attempt + 1)
            return
        self.logs += len(logs)
        self.groups += 1


def _log_group(
    logs: Sequence[tuple[int | None, int, int, list[tuple[str, str]]]],
    topic: str,
    source: str,
    tags: tuple[tuple[str, str], ...],
) -> LogGroup:
    group = LogGroup()
    group.Topic = topic
    group.Source = source
    for _key, time_s, time_ns, contents in logs:
        log = group.Logs.add()
        log.Time = time_s
        if time_ns:
            log.Time_ns = time_ns
        for name, value in contents:
            content = log.Contents.add()
            content.Key = name
            content.Value = value
    for name, value in tags:
        tag = group.LogTags.add()
        tag.Key = name
        tag.Value = value
    return group


def _write(options: WriteOptions, batches: Iterator[Any]) -> WriteResult:
    writer = _GroupWriter(options)
    try:
        for batch in batches:
            _add_batch(writer, options, batch)
        writer.flush()
    finally:
        writer.close()
    return WriteResult(writer.logs, writer.groups)


def _add_batch(writer: _GroupWriter, options: WriteOptions, batch: Any) -> None:
    names = batch.schema.names
    columns = {name: _column_values(batch.column(i)) for i, name in enumerate(names)}
    plain = [n for n in names if n not in _SPECIAL and n not in _IGNORED]
    hash_column = options.hash_key_column
    if "log_time" in columns and not pa.types.is_timestamp(batch.schema.field("log_time").type):
        columns["log_time"] = [None if s is None else s * 1_000_000 for s in columns["log_time"]]
    absent = [None] * batch.num_rows
    for row in range(batch.num_rows):
        contents: dict[str, str] = {}
        for name, value in columns.get("contents", absent)[row] or ():
            if value is not None:
                contents[_text(name)] = _text(value)
        for name in plain:
            value = columns[name][row]
            if value is not None:
                contents[name] = _text(value)
        time_us = columns["log_time"][row] if "log_time" in columns else None
        tags = tuple((k, _text(v)) for k, v in (columns.get("tags", absent)[row] or ()))
        header = (
            (columns["topic"][row] or "") if "topic" in columns else "",
            (columns["source"][row] or "") if "source" in columns else "",
            tags,
        )
        key = None if hash_column is None else hash_key(columns[hash_column][row])
        writer.add(
            key,
            header,
            None if time_us is None else time_us // 1_000_000,
            0 if time_us is None else (time_us % 1_000_000) * 1000,
            list(contents.items()),
        )


def _column_values(column: Any) -> list[Any]:
    """Python values; timestamps as microseconds since the epoch."""
    if pa.types.is_timestamp(column.type):
        return list(column.cast(pa.timestamp("us")).cast(pa.int64()).to_pylist())
    return list(column.to_pylist())


class LogHubBatchWriter(DataSourceArrowWriter):
    """``df.write.format("loghub").mode("append")``."""

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ParameterInvalid("a logstore is append-only: use mode('append')")
        check_schema(schema, options)
        self._options = options

    def write(self, iterator: Iterator[Any]) -> WriteResult:
        return _write(self._options, iterator)


class LogHubStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("loghub")``: at least once (see the module docstring)."""

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        check_schema(schema, options)
        self._options = options

    def write(self, iterator: Iterator[Any]) -> WriteResult:
        return _write(self._options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing to publish: the tasks wrote their groups already."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing to undo: groups sent cannot be taken back (at least once)."""
