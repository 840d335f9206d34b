"""Log groups on the wire: parse, build and frame the protobuf messages of ``loghub.proto``.

A PutLogs body (after decompression) is one serialized ``LogGroup``; a pull response is a
``LogGroupList``. A ``LogGroupList`` is nothing but its groups, each written as field 1 of
the list: ``0x0A <varint length> <LogGroup bytes>``. ``frame_log_group`` writes that entry, so
storage can keep each received group framed exactly as a pull returns it and serve a pull by
concatenating stored bytes, with no re-encoding.

``parse_log_group`` builds the message for a reader: anything that is not a complete
``LogGroup`` (bad encoding, a required field missing) is ``PostBodyInvalid``. The server's
check of what it is about to store gives the same verdict without building the message
(``loghub.wire.logcheck``).
Content values are proto ``string`` fields, but the SDK writes them as bytes and other writers
may put non-UTF-8 data there; the upb runtime accepts that and hands such a value back as
``bytes``, which ``log_group_to_dict`` decodes with replacement characters.

A pull may carry ``loghub_max_bytes=B``, a bound of LogHub's own (the hosted service has no
such parameter and ignores unknown ones): the reply then holds at most ``B`` raw bytes of
groups, or its first group whatever its size, and echoes the bound it applied in the
``x-loghub-max-bytes`` header, so a client can tell a server that honoured it from one that
ignored it.

In a cluster, ListShards names each shard's node (``node``, ``nodeAddress``), and a client
that sends a shard's pulls straight to that node marks them ``x-loghub-owner-only: 1``: a
node that does not own the shard (any more) then answers ``ServerBusy`` instead of passing
the request on, so the client learns its list is stale and can go back to its endpoint.

Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypedDict

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]  # no stubs

from loghub.errors import PostBodyInvalid
from loghub.wire.proto import LogGroup, LogGroupList

__all__ = [
    "OWNER_ONLY_HEADER",
    "PULL_BYTES_MAX_HEADER",
    "PULL_BYTES_MAX_PARAM",
    "PULL_WAIT_MS_HEADER",
    "PULL_WAIT_MS_PARAM",
    "LogDict",
    "LogGroupDict",
    "frame_log_group",
    "log_group_list_entry_head",
    "log_group_to_dict",
    "make_log_group",
    "parse_log_group",
    "parse_log_group_list",
    "parse_pulled_log_group_list",
    "split_log_group_list",
]

PULL_BYTES_MAX_PARAM = "loghub_max_bytes"
PULL_BYTES_MAX_HEADER = "x-loghub-max-bytes"
# LogHub's long poll: a pull at the end of a shard waits up to this many ms for new data; the
# reply echoes the wait the server applied (0: it did not wait).
PULL_WAIT_MS_PARAM = "loghub_wait_ms"
PULL_WAIT_MS_HEADER = "x-loghub-wait-ms"
# a shard request sent to the node ListShards named: served there, or refused, never passed on
OWNER_ONLY_HEADER = "x-loghub-owner-only"

_LOG_GROUP_LIST_ENTRY_TAG = b"\x0a"  # field 1 (LogGroups), wire type 2 (length-delimited)


class LogDict(TypedDict):
    time: int  # unix seconds
    time_ns: int  # nanosecond part, 0 when the writer sent none
    contents: dict[str, str]


class LogGroupDict(TypedDict):
    topic: str
    source: str
    tags: dict[str, str]
    logs: list[LogDict]


def parse_log_group(raw: bytes) -> LogGroup:
    """The ``LogGroup`` serialized in ``raw``; ``PostBodyInvalid`` when it is not one."""
    return _parse(LogGroup, raw)


def parse_log_group_list(raw: bytes) -> LogGroupList:
    """The ``LogGroupList`` serialized in ``raw``; ``PostBodyInvalid`` when it is not one."""
    return _parse(LogGroupList, raw)


def parse_pulled_log_group_list(raw: bytes) -> LogGroupList:
    """A pull reply's ``LogGroupList``, without the required-field walk: every group in it
    was checked when it was written, and the walk costs as much as the parse itself (about
    2 µs a log, half of what a consumer spends per log). A reply that is not a protobuf
    ``LogGroupList`` still raises ``PostBodyInvalid``."""
    message = LogGroupList()
    try:
        message.ParseFromString(raw)
    except DecodeError as exc:
        raise PostBodyInvalid("body is not a protobuf LogGroupList") from exc
    return message


def _parse(message_class: type[LogGroup], raw: bytes) -> LogGroup:
    message = message_class()
    try:
        message.ParseFromString(raw)
    except DecodeError as exc:
        raise PostBodyInvalid(f"body is not a protobuf {message_class.__name__}") from exc
    # upb parses partial messages; a group missing a required field is still invalid.
    missing = message.FindInitializationErrors()
    if missing:
        raise PostBodyInvalid(
            f"protobuf {message_class.__name__} lacks required fields: {', '.join(missing[:5])}"
        )
    return message


def frame_log_group(raw: bytes) -> bytes:
    """``raw`` (a serialized ``LogGroup``) as one entry of a serialized ``LogGroupList``."""
    return log_group_list_entry_head(len(raw)) + raw


def log_group_list_entry_head(size: int) -> bytes:
    """What comes before a ``size``-byte ``LogGroup`` in a serialized ``LogGroupList``: the
    field's tag and the group's length."""
    return _LOG_GROUP_LIST_ENTRY_TAG + _varint(size)


def split_log_group_list(data: bytes) -> list[bytes]:
    """The serialized groups of a serialized ``LogGroupList`` (the inverse of concatenating
    ``frame_log_group`` entries), without parsing the groups."""
    groups: list[bytes] = []
    pos = 0
    while pos < len(data):
        if data[pos : pos + 1] != _LOG_GROUP_LIST_ENTRY_TAG:
            raise PostBodyInvalid("not a LogGroupList: an entry is not field 1")
        pos += 1
        size, shift = 0, 0
        while True:
            byte = data[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
        groups.append(data[pos : pos + size])
        pos += size
    return groups


def _varint(value: int) -> bytes:
    assert value >= 0, value
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def make_log_group(
    records: Iterable[tuple[int, Mapping[str, str]]],
    *,
    topic: str = "",
    source: str = "",
    tags: Mapping[str, str] | None = None,
) -> LogGroup:
    """A ``LogGroup`` of ``records``, each ``(unix seconds, contents)``, as the SDK builds one."""
    group = LogGroup()
    group.Topic = topic
    group.Source = source
    for time_s, contents in records:
        log = group.Logs.add()
        log.Time = time_s
        for key, value in contents.items():
            content = log.Contents.add()
            content.Key = key
            content.Value = value
    for key, value in (tags or {}).items():
        tag = group.LogTags.add()
        tag.Key = key
        tag.Value = value
    return group


def log_group_to_dict(group: LogGroup) -> LogGroupDict:
    """``group`` as plain data (for display and tests). Repeated keys: the last one wins."""
    logs: list[LogDict] = [
        {
            "time": int(log.Time),
            "time_ns": int(log.Time_ns),
            "contents": {_text(c.Key): _text(c.Value) for c in log.Contents},
        }
        for log in group.Logs
    ]
    return {
        "topic": _text(group.Topic),
        "source": _text(group.Source),
        "tags": {_text(t.Key): _text(t.Value) for t in group.LogTags},
        "logs": logs,
    }


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
