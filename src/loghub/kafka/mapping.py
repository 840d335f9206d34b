"""How LogHub's logstores, shards, log groups and logs look to a Kafka client.

- topic = ``project<separator>logstore`` (separator ``.`` by default); the project name may
  not contain the separator, so the first one splits the name.
- partition = shard id. Shard ids are dense and append-only (0..n-1 at creation; split and
  merge give children the next ids; read-only shards stay listed), which is exactly what
  Kafka's partition ids must be.
- offset: a shard stores log groups under consecutive sequence numbers, and a log group holds
  many logs. A Kafka record is one log, at offset ``sequence * 2**20 + index in its group``.
  Offsets are therefore increasing but not dense (as in a compacted Kafka topic, which both
  clients handle): one stored group is one record batch, and the next group starts at the next
  multiple of 2**20. ``logs_per_group_max`` (512 000) stays below 2**20.

Records and logs (docs/kafka.md has the table):

- produce: every header becomes a content ``name=value``; the key becomes ``__key__``, the
  value ``__value__`` (``__key_base64__`` / ``__value_base64__`` when not UTF-8, and
  ``__value_null__`` for a null value); the log time
  is the record timestamp (seconds, with the milliseconds in ``Time_ns``).
- fetch of a log written that way gives back the same key, value and headers. A log written
  through the REST API (no ``__value__``) becomes a record whose value is a JSON object of its
  contents, with no key, and the group's topic, source and tags as headers ``__topic__``,
  ``__source__`` and ``__tag__:<name>``.

Pure functions; thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import json

from loghub.wire.kafka.records import Record
from loghub.wire.logs import parse_log_group
from loghub.wire.proto import LogGroup

__all__ = [
    "KEY_FIELD",
    "OFFSET_SHIFT",
    "VALUE_FIELD",
    "group_to_records",
    "offset_of",
    "position_of",
    "records_to_group",
    "split_topic",
    "topic_name",
]

OFFSET_SHIFT = 20
_INDEX_MASK = (1 << OFFSET_SHIFT) - 1
KEY_FIELD = "__key__"
VALUE_FIELD = "__value__"
_KEY_B64 = "__key_base64__"
_VALUE_B64 = "__value_base64__"
_VALUE_NULL = "__value_null__"  # a record with a null value (a tombstone)
_VALUE_FIELDS = frozenset({VALUE_FIELD, _VALUE_B64, _VALUE_NULL})


def topic_name(project: str, logstore: str, separator: str) -> str:
    return f"{project}{separator}{logstore}"


def split_topic(topic: str, separator: str) -> tuple[str, str] | None:
    """(project, logstore) of a topic name, or None when it has no separator."""
    project, found, logstore = topic.partition(separator)
    if not found or not project or not logstore:
        return None
    return project, logstore


def offset_of(sequence: int, index: int = 0) -> int:
    assert 0 <= index <= _INDEX_MASK, index
    return (sequence << OFFSET_SHIFT) | index


def position_of(offset: int) -> tuple[int, int]:
    """(sequence, index in the group) of a Kafka offset."""
    return offset >> OFFSET_SHIFT, offset & _INDEX_MASK


def _text(blob: bytes) -> tuple[str, bool]:
    """The blob as text, and whether it had to be base64 (it was not UTF-8)."""
    try:
        return blob.decode(), False
    except UnicodeDecodeError:
        return base64.b64encode(blob).decode(), True


def records_to_group(records: list[Record], source: str = "") -> bytes:
    """A serialized LogGroup holding one log per record."""
    group = LogGroup()
    group.Source = source
    for record in records:
        log = group.Logs.add()
        seconds, millis = divmod(max(record.timestamp_ms, 0), 1000)
        log.Time = min(seconds, 2**32 - 1)
        log.Time_ns = millis * 1_000_000
        for name, header_value in record.headers:
            content = log.Contents.add()
            content.Key = name
            content.Value = "" if header_value is None else header_value.decode(errors="replace")
        for blob, plain, encoded in (
            (record.key, KEY_FIELD, _KEY_B64),
            (record.value, VALUE_FIELD, _VALUE_B64),
        ):
            if blob is None:
                if plain == VALUE_FIELD:
                    content = log.Contents.add()
                    content.Key = _VALUE_NULL
                    content.Value = ""
                continue
            text, was_base64 = _text(blob)
            content = log.Contents.add()
            content.Key = encoded if was_base64 else plain
            content.Value = text
    data: bytes = group.SerializeToString()
    return data


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _as_str(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode(errors="replace")


def group_to_records(raw: bytes) -> list[Record]:
    """The records of one stored LogGroup; ``offset_delta`` is the log's index."""
    group = parse_log_group(raw)
    group_headers: list[tuple[str, bytes | None]] = []
    if group.Topic:
        group_headers.append(("__topic__", _bytes(group.Topic)))
    if group.Source:
        group_headers.append(("__source__", _bytes(group.Source)))
    for tag in group.LogTags:
        group_headers.append(
            (f"__tag__:{_bytes(tag.Key).decode(errors='replace')}", _bytes(tag.Value))
        )
    records = []
    value_fields = _VALUE_FIELDS
    for index, log in enumerate(group.Logs):
        timestamp_ms = log.Time * 1000 + log.Time_ns // 1_000_000
        contents = [(_as_str(c.Key), _bytes(c.Value)) for c in log.Contents]
        # a log written through Kafka ends with its value (records_to_group writes it last)
        if contents and (contents[-1][0] in value_fields or value_fields & dict(contents).keys()):
            records.append(_kafka_written(contents, timestamp_ms, index))
        else:
            value = json.dumps(
                {name: value.decode(errors="replace") for name, value in contents},
                ensure_ascii=False,
                separators=(",", ":"),
            ).encode()
            records.append(Record(timestamp_ms, None, value, tuple(group_headers), index))
    return records


def _kafka_written(contents: list[tuple[str, bytes]], timestamp_ms: int, index: int) -> Record:
    key: bytes | None = None
    value: bytes | None = None
    headers: list[tuple[str, bytes | None]] = []
    for name, data in contents:
        if name == KEY_FIELD:
            key = data
        elif name == VALUE_FIELD:
            value = data
        elif name == _VALUE_NULL:
            value = None
        elif name in (_KEY_B64, _VALUE_B64):
            try:
                decoded = base64.b64decode(data, validate=True)
            except binascii.Error:
                decoded = data
            if name == _KEY_B64:
                key = decoded
            else:
                value = decoded
        else:
            headers.append((name, data))
    return Record(timestamp_ms, key, value, tuple(headers), index)
