"""Proving bytes a complete LogGroup, in one pass over the wire bytes, and the wire format's
numbers written once.

Why: the server must refuse a PutLogs body that is not a complete LogGroup (other clients,
the Java and Go SDKs among them, refuse a whole pull reply that holds one incomplete group),
and building protobuf objects only to count them and look at their required fields cost about
half of the server's CPU at full ingest. ``count_logs`` walks the bytes instead, building
nothing, and gives exactly the verdict of the protobuf runtime (upb, proto2) followed by its
required-field check. A compiled twin (``_logcheck.c``) does the same walk at native speed and
is used when it was built; ``tests/unit/test_logcheck.py`` holds the two, and the protobuf
runtime, to the same answers on every input.

What upb accepts, measured on protobuf 5.29 (and what both walks therefore accept):

    tag           a varint of at most 5 bytes whose value fits 32 bits; field number 0 and
                  wire types 6 and 7 are refused
    varint (0)    at most 10 bytes (bits past the 64th are dropped)
    fixed (1, 5)  8 or 4 bytes
    length (2)    a varint of at most 10 bytes, then that many bytes, all inside the message
    group (3, 4)  an unknown group must end with an end-group tag of its own field number;
                  an end-group tag anywhere else is refused. A group costs one level, as a
                  message does, and at most 100 levels may sit below the top message.
    unknown       kept, never looked into (but groups, which have no length, are walked)
    wrong type    a known field with another wire type is an unknown field
    strings       proto2 ``string`` fields are not checked for UTF-8

Known fields, the ones the verdict depends on (``Reserved``, ``Topic``, ``Source``,
``MachineUUID`` and ``Time_ns`` are read past as any field of their wire type):

    LogGroup   1 Logs (message, repeated)   6 LogTags (message, repeated)
    Log        1 Time (varint, required)    2 Contents (message, repeated)
    Content    1 Key (bytes, required)      2 Value (bytes, required)
    LogTag     1 Key (bytes, required)      2 Value (bytes, required)

A body that is malformed anywhere is malformed, even when a required field is also missing
(upb refuses the parse before the required-field check).

Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from loghub.errors import PostBodyInvalid

__all__ = [
    "DEPTH_MAX",
    "FIELD_GROUP_LOGS",
    "FIELD_GROUP_TAGS",
    "FIELD_KEY",
    "FIELD_LOG_CONTENTS",
    "FIELD_LOG_TIME",
    "FIELD_LOG_TIME_NS",
    "FIELD_VALUE",
    "IMPLEMENTATION",
    "MALFORMED_DEPTH",
    "MALFORMED_GROUP",
    "MALFORMED_TAG",
    "MALFORMED_TRUNCATED",
    "MALFORMED_VARINT",
    "MISSING_CONTENT_KEY",
    "MISSING_CONTENT_VALUE",
    "MISSING_LOG_TIME",
    "MISSING_TAG_KEY",
    "MISSING_TAG_VALUE",
    "OK",
    "TAG_CONTENT_KEY",
    "TAG_CONTENT_VALUE",
    "TAG_GROUP_LOG",
    "TAG_LOG_CONTENT",
    "TAG_LOG_TIME",
    "TAG_LOG_TIME_NS",
    "WIRE_END_GROUP",
    "WIRE_FIXED32",
    "WIRE_FIXED64",
    "WIRE_LENGTH",
    "WIRE_START_GROUP",
    "WIRE_VARINT",
    "BytesLike",
    "Scan",
    "count_logs",
    "scan_python",
]

# -- the wire format -------------------------------------------------------------------------

WIRE_VARINT: Final = 0
WIRE_FIXED64: Final = 1
WIRE_LENGTH: Final = 2
WIRE_START_GROUP: Final = 3
WIRE_END_GROUP: Final = 4
WIRE_FIXED32: Final = 5

FIELD_GROUP_LOGS: Final = 1  # LogGroup.Logs
FIELD_GROUP_TAGS: Final = 6  # LogGroup.LogTags
FIELD_LOG_TIME: Final = 1  # Log.Time
FIELD_LOG_CONTENTS: Final = 2  # Log.Contents
FIELD_LOG_TIME_NS: Final = 4  # Log.Time_ns
FIELD_KEY: Final = 1  # Content.Key, LogTag.Key
FIELD_VALUE: Final = 2  # Content.Value, LogTag.Value


def _tag(field: int, wire_type: int) -> int:
    return field << 3 | wire_type


# The one-byte tags as every serializer writes them.
TAG_GROUP_LOG: Final = _tag(FIELD_GROUP_LOGS, WIRE_LENGTH)  # 0x0A
TAG_LOG_TIME: Final = _tag(FIELD_LOG_TIME, WIRE_VARINT)  # 0x08
TAG_LOG_CONTENT: Final = _tag(FIELD_LOG_CONTENTS, WIRE_LENGTH)  # 0x12
TAG_LOG_TIME_NS: Final = _tag(FIELD_LOG_TIME_NS, WIRE_FIXED32)  # 0x25
TAG_CONTENT_KEY: Final = _tag(FIELD_KEY, WIRE_LENGTH)  # 0x0A
TAG_CONTENT_VALUE: Final = _tag(FIELD_VALUE, WIRE_LENGTH)  # 0x12

DEPTH_MAX: Final = 100  # upb's default recursion limit

# -- verdicts --------------------------------------------------------------------------------
#
# A scan returns (status, log_count, where, index): status OK, one of the MALFORMED_* (where is
# the offset of the field that broke, index 0) or one of the MISSING_* (where is the index of
# the first incomplete log or tag, index that of the content inside the log). The compiled
# scan returns the same tuples; this module alone turns them into messages.

OK: Final = 0
MALFORMED_TRUNCATED: Final = 1
MALFORMED_VARINT: Final = 2
MALFORMED_TAG: Final = 3
MALFORMED_GROUP: Final = 4
MALFORMED_DEPTH: Final = 5
MISSING_LOG_TIME: Final = 6
MISSING_CONTENT_KEY: Final = 7
MISSING_CONTENT_VALUE: Final = 8
MISSING_TAG_KEY: Final = 9
MISSING_TAG_VALUE: Final = 10

Scan = tuple[int, int, int, int]
BytesLike = bytes | bytearray | memoryview

_MALFORMED = {
    MALFORMED_TRUNCATED: "a field runs past the end of its message",
    MALFORMED_VARINT: "a varint runs over 10 bytes",
    MALFORMED_TAG: "a field tag is invalid",
    MALFORMED_GROUP: "a group does not end where it must",
    MALFORMED_DEPTH: f"groups nest over {DEPTH_MAX} levels deep",
}


def _missing_field(status: int, where: int, index: int) -> str:
    return {
        MISSING_LOG_TIME: f"Logs[{where}].Time",
        MISSING_CONTENT_KEY: f"Logs[{where}].Contents[{index}].Key",
        MISSING_CONTENT_VALUE: f"Logs[{where}].Contents[{index}].Value",
        MISSING_TAG_KEY: f"LogTags[{where}].Key",
        MISSING_TAG_VALUE: f"LogTags[{where}].Value",
    }[status]


def count_logs(data: BytesLike) -> int:
    """The number of logs in the serialized LogGroup ``data`` (bytes, or any buffer: it is
    not copied), proving it complete; ``PostBodyInvalid`` when upb would refuse to parse it
    or a required field is missing."""
    status, log_count, where, index = _scan(data)
    if status == OK:
        return log_count
    if status in _MALFORMED:
        raise PostBodyInvalid(
            f"body is not a protobuf LogGroup ({_MALFORMED[status]}, at byte {where})"
        )
    raise PostBodyInvalid(
        f"protobuf LogGroup lacks required fields: {_missing_field(status, where, index)}"
    )


# -- the pure-Python walk --------------------------------------------------------------------
#
# Step for step like _logcheck.c, so that both report the same offsets. A known field is
# recognized by its whole tag (field number and wire type): a known number with another wire
# type is an unknown field, as upb has it.

_TAG_GROUP_TAGS: Final = _tag(FIELD_GROUP_TAGS, WIRE_LENGTH)  # 0x32


class _Malformed(Exception):
    def __init__(self, status: int, where: int) -> None:
        self.status = status
        self.where = where


def scan_python(data: BytesLike) -> Scan:
    """The pure-Python scan: (status, log count, where, index), see above."""
    view = data if isinstance(data, bytes) else memoryview(data).cast("B")
    walk = _Walk(view)
    try:
        walk.log_group(0, len(view))
    except _Malformed as exc:
        return exc.status, walk.log_count, exc.where, 0
    if walk.missing is not None:
        return walk.missing[0], walk.log_count, walk.missing[1], walk.missing[2]
    return OK, walk.log_count, 0, 0


class _Walk:
    """One scan: the bytes, the logs and tags seen, the first missing required field."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        self.log_count = 0
        self.tag_count = 0
        self.missing: tuple[int, int, int] | None = None

    def note_missing(self, status: int, where: int, index: int) -> None:
        if self.missing is None:
            self.missing = (status, where, index)

    def varint(self, pos: int, end: int, field_start: int) -> tuple[int, int]:
        """(value, position after): at most 10 bytes; bits past the 64th are dropped."""
        data = self.data
        if pos < end and data[pos] < 0x80:
            return data[pos], pos + 1
        result = shift = 0
        for _ in range(10):
            if pos >= end:
                raise _Malformed(MALFORMED_TRUNCATED, field_start)
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result & 0xFFFF_FFFF_FFFF_FFFF, pos
            shift += 7
        raise _Malformed(MALFORMED_VARINT, field_start)

    def tag(self, pos: int, end: int) -> tuple[int, int]:
        """(tag, position after): at most 5 bytes, fits 32 bits, field > 0, wire type < 6."""
        data = self.data
        start = pos
        tag = data[pos]
        pos += 1
        if tag >= 0x80:
            tag &= 0x7F
            shift = 7
            while True:
                if pos >= end:
                    raise _Malformed(MALFORMED_TRUNCATED, start)
                if pos - start == 5:
                    raise _Malformed(MALFORMED_TAG, start)
                byte = data[pos]
                pos += 1
                tag |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            if tag > 0xFFFF_FFFF:
                raise _Malformed(MALFORMED_TAG, start)
        if tag < 8 or tag & 7 > WIRE_FIXED32:
            raise _Malformed(MALFORMED_TAG, start)
        return tag, pos

    def delimited(self, pos: int, end: int, field_start: int) -> tuple[int, int]:
        """(start, end) of a length-delimited field's bytes, which must fit in end."""
        length, pos = self.varint(pos, end, field_start)
        if length > end - pos:
            raise _Malformed(MALFORMED_TRUNCATED, field_start)
        return pos, pos + length

    def skip(self, tag: int, pos: int, end: int, depth: int, field_start: int) -> int:
        """The position after an unknown field (or a known one read past)."""
        wire_type = tag & 7
        if wire_type == WIRE_LENGTH:
            return self.delimited(pos, end, field_start)[1]
        if wire_type == WIRE_VARINT:
            return self.varint(pos, end, field_start)[1]
        if wire_type in (WIRE_FIXED32, WIRE_FIXED64):
            pos += 4 if wire_type == WIRE_FIXED32 else 8
            if pos > end:
                raise _Malformed(MALFORMED_TRUNCATED, field_start)
            return pos
        if wire_type == WIRE_START_GROUP:
            if depth <= 0:
                raise _Malformed(MALFORMED_DEPTH, field_start)
            return self.unknown_group(tag >> 3, pos, end, depth - 1)
        raise _Malformed(MALFORMED_GROUP, field_start)  # an end-group tag outside its group

    def unknown_group(self, field: int, pos: int, end: int, depth: int) -> int:
        """The position after an unknown group's end-group tag."""
        while pos < end:
            field_start = pos
            tag, pos = self.tag(pos, end)
            if tag & 7 == WIRE_END_GROUP:
                if tag >> 3 != field:
                    raise _Malformed(MALFORMED_GROUP, field_start)
                return pos
            pos = self.skip(tag, pos, end, depth, field_start)
        raise _Malformed(MALFORMED_GROUP, end)  # the group never ended

    def log_group(self, pos: int, end: int) -> None:
        depth = DEPTH_MAX
        while pos < end:
            field_start = pos
            tag, pos = self.tag(pos, end)
            if tag == TAG_GROUP_LOG:
                start, pos = self.delimited(pos, end, field_start)
                self.log_count += 1
                self.log(start, pos, depth - 1)
            elif tag == _TAG_GROUP_TAGS:
                start, pos = self.delimited(pos, end, field_start)
                self.tag_count += 1
                key, value = self.pair(start, pos, depth - 1)
                if not key:
                    self.note_missing(MISSING_TAG_KEY, self.tag_count - 1, 0)
                elif not value:
                    self.note_missing(MISSING_TAG_VALUE, self.tag_count - 1, 0)
            else:
                pos = self.skip(tag, pos, end, depth, field_start)

    def log(self, pos: int, end: int, depth: int) -> None:
        data = self.data
        log_index = self.log_count - 1
        has_time = False
        content_count = 0
        while pos < end:
            if data[pos] == TAG_LOG_CONTENT and pos + 1 < end and data[pos + 1] < 0x80:
                # Inlined for speed: a Content of Key then Value with one-byte lengths and
                # nothing else, which is what every writer sends and the walk below accepts.
                stop = pos + 2 + data[pos + 1]
                if stop <= end and stop - pos >= 6 and data[pos + 2] == TAG_CONTENT_KEY:
                    value_at = pos + 4 + data[pos + 3]
                    if (
                        data[pos + 3] < 0x80
                        and value_at + 2 <= stop
                        and data[value_at] == TAG_CONTENT_VALUE
                        and data[value_at + 1] < 0x80
                        and value_at + 2 + data[value_at + 1] == stop
                    ):
                        pos = stop
                        content_count += 1
                        continue
            field_start = pos
            tag, pos = self.tag(pos, end)
            if tag == TAG_LOG_TIME:
                pos = self.varint(pos, end, field_start)[1]
                has_time = True
            elif tag == TAG_LOG_CONTENT:
                start, pos = self.delimited(pos, end, field_start)
                key, value = self.pair(start, pos, depth - 1)
                if not key:
                    self.note_missing(MISSING_CONTENT_KEY, log_index, content_count)
                elif not value:
                    self.note_missing(MISSING_CONTENT_VALUE, log_index, content_count)
                content_count += 1
            else:
                pos = self.skip(tag, pos, end, depth, field_start)
        if not has_time:
            self.note_missing(MISSING_LOG_TIME, log_index, 0)

    def pair(self, pos: int, end: int, depth: int) -> tuple[bool, bool]:
        """Walks a Content or a LogTag: whether it holds its Key and its Value."""
        has_key = has_value = False
        while pos < end:
            field_start = pos
            tag, pos = self.tag(pos, end)
            if tag == TAG_CONTENT_KEY:
                pos = self.delimited(pos, end, field_start)[1]
                has_key = True
            elif tag == TAG_CONTENT_VALUE:
                pos = self.delimited(pos, end, field_start)[1]
                has_value = True
            else:
                pos = self.skip(tag, pos, end, depth, field_start)
        return has_key, has_value


_scan: Callable[[BytesLike], Scan]
try:
    from loghub.wire._logcheck import scan as _scan_compiled  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # built without a C compiler: the same verdicts, slower
    _scan = scan_python
    IMPLEMENTATION = "python"
else:
    _scan = _scan_compiled
    IMPLEMENTATION = "compiled"
