"""Pulled log groups to Arrow record batches, without a Python step per key/value pair.

Why this module is unusual: building rows through the protobuf objects (``log.Contents``,
``content.Key``) cost about 9 us a log of seven keys on one core, which held the source to
about a sixth of the speed of ``spark.read.parquet`` over the same rows; this path costs about
2.2 us. The only Python loop is over log groups. A second message description of the same
bytes (``_RawLogGroupList``: a group's logs as opaque ``bytes``) hands each group's logs over as
byte strings in one C call, and everything below the group is parsed with Arrow compute
kernels over one buffer:

    group     upb, one step per group: topic, source, tags, the logs as byte strings
    log       08 <varint Time>  (12 <varint length> <Content>)*  [25 <fixed32 Time_ns>]
    Content   0A <varint key length> <key>  12 <varint value length> <value>

The contents of a log are parsed in rounds (round r reads every log's r-th pair at once), then
put back in log order with one inverse permutation. Keys and values become string arrays by
viewing the one buffer through offsets that alternate between the start and the end of each
key (or value), and taking every other element. A pull is decoded in chunks of whole groups of
about ``CHUNK_BYTES`` serialized bytes (``_group_bounds`` finds where the groups start), so
that the Arrow memory of one chunk is reused by the next.

That is the path where no C compiler was found. Where one was, the compiled scan
(``_scan.c``) does all of it instead, in place in the pulled bytes, with no protobuf parse at
all: it walks each chunk's LogGroup entries, so no group or log is copied out first, hands
over each group's topic, source and tags, and copies keys and values into buffers that Arrow
takes as they are, telling whether they are all ASCII, in which case Arrow's UTF-8 check is
skipped. It also repeats each group's values once for each of its logs (``_PerLog``), which
Arrow's take did at about the cost of the scan itself.

The fast path assumes what every protobuf serializer writes: fields in field-number order,
``Key`` before ``Value``, nothing unknown, keys and values under 2 MiB, valid UTF-8, and no
key twice in one log. A chunk that breaks any of that takes the plain protobuf path
(``_decode_reference``), which handles everything (invalid UTF-8 becomes U+FFFD, a repeated
key keeps its last value) and defines the result both paths must give.

Pure functions; thread-safe (the module-level state is the ``_arange`` cache, only ever
replaced by a longer array of the same values, and the path counters behind a lock).
"""

from __future__ import annotations

import array
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type information
import pyarrow.compute as pc  # type: ignore[import-untyped]
from google.protobuf import (  # type: ignore[import-untyped]  # no stubs
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)

from loghub.spark.schema import STRING_MAP, ContentColumn, arrow_schema
from loghub.wire.cursor import encode_cursor
from loghub.wire.logcheck import (
    TAG_CONTENT_KEY,
    TAG_CONTENT_VALUE,
    TAG_LOG_CONTENT,
    TAG_LOG_TIME,
    TAG_LOG_TIME_NS,
)
from loghub.wire.logs import parse_log_group_list

try:  # the compiled log scan (setup.py); without a C compiler, the Arrow kernels do the same
    from loghub.spark import _scan as _native  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the install
    _native = None

__all__ = [
    "CHUNK_BYTES",
    "DecodeStatistics",
    "DecodedLogs",
    "decode",
    "statistics",
    "to_record_batch",
]

log = logging.getLogger("loghub.spark")

# the one-byte tags, from the module that writes the wire format down once
_TAG_TIME = TAG_LOG_TIME  # Log.Time: field 1, varint
_TAG_CONTENT = TAG_LOG_CONTENT  # Log.Contents: field 2, length-delimited
_TAG_TIME_NS = TAG_LOG_TIME_NS  # Log.Time_ns: field 4, fixed32
_TAG_KEY = TAG_CONTENT_KEY  # Content.Key: field 1, length-delimited
_TAG_VALUE = TAG_CONTENT_VALUE  # Content.Value: field 2, length-delimited
_PADDING = b"\0" * 8  # after the last log, so that reads a few bytes past a log stay in bounds
_LENGTH_VARINT_BYTES_MAX = 3  # lengths up to 2 MiB - 1 on the fast path
_TIME_VARINT_BYTES_MAX = 5  # a uint32
_ROUNDS_MAX = 512  # logs with more pairs than this take the reference path
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_TAG_GROUP = 1 << 3 | 2  # LogGroupList.LogGroups: field 1, length-delimited
_GROUP_VARINT_BYTES_MAX = 5  # as the compiled walk reads a group's length
CHUNK_BYTES = 4 * 1024 * 1024  # about 16,000 access logs a record batch


class _NotFast(Exception):
    """The batch is outside what the fast path handles; the reference path takes it."""


def _raw_message_class() -> Any:
    """LogGroupList as the fast path reads it: logs as bytes, text fields as bytes."""
    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="loghub/spark/raw_log_group.proto", package="loghub.spark.raw", syntax="proto2"
    )

    def message(name: str, fields: Sequence[tuple[str, int, int, int, str]]) -> None:
        proto = file.message_type.add(name=name)
        for field_name, number, field_type, label, type_name in fields:
            entry = proto.field.add(name=field_name, number=number, type=field_type, label=label)
            if type_name:
                entry.type_name = type_name

    optional, repeated = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    message(
        "RawLogTag",
        [("Key", 1, field.TYPE_BYTES, optional, ""), ("Value", 2, field.TYPE_BYTES, optional, "")],
    )
    message(
        "RawLogGroup",
        [
            ("Logs", 1, field.TYPE_BYTES, repeated, ""),
            ("Topic", 3, field.TYPE_BYTES, optional, ""),
            ("Source", 4, field.TYPE_BYTES, optional, ""),
            ("LogTags", 6, field.TYPE_MESSAGE, repeated, ".loghub.spark.raw.RawLogTag"),
        ],
    )
    message(
        "RawLogGroupList",
        [("LogGroups", 1, field.TYPE_MESSAGE, repeated, ".loghub.spark.raw.RawLogGroup")],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("loghub.spark.raw.RawLogGroupList")
    )


_RawLogGroupList = _raw_message_class()


@dataclass(frozen=True)
class DecodedLogs:
    """The logs of consecutive groups of a LogGroupList, columnar, the first being the list's
    group ``first_group``. Group-level fields are per group; the rest are per log
    (``content_offsets`` has one entry more: log i owns pairs
    ``[content_offsets[i], content_offsets[i + 1])`` of ``keys`` and ``values``)."""

    first_group: int
    logs_per_group: list[int]
    topics: list[str]
    sources: list[str]
    tags: list[dict[str, str]]
    time_us: Any  # pa.Int64Array
    content_offsets: Any  # pa.Int32Array
    keys: Any  # pa.StringArray
    values: Any  # pa.StringArray

    @property
    def log_count(self) -> int:
        return len(self.time_us)


def decode(data: bytes, chunk_bytes: int = CHUNK_BYTES) -> Iterator[DecodedLogs]:
    """The logs of the serialized LogGroupList ``data`` (``PostBodyInvalid`` when it is not
    one), in chunks of whole groups of about ``chunk_bytes`` serialized bytes: small enough
    that the Arrow buffers of one chunk are reused for the next instead of fresh memory each
    time. Each chunk takes the fast path, or the reference path when it must."""
    bounds = _group_bounds(data)
    if bounds is None:  # not a plain list of groups: the reference path decides
        yield _decode_reference(data, 0)
        return
    first, start = 0, 0
    for index in range(1, len(bounds)):
        end = bounds[index]
        if end - start >= chunk_bytes or index == len(bounds) - 1:
            yield _decode_chunk(data, start, end, first)
            first, start = index, end


def _group_bounds(data: bytes) -> Sequence[int] | None:
    """Where each LogGroup entry of the list ``data`` starts, and its end (one more entry than
    groups); None when the list holds anything else. Serialized LogGroupLists concatenate, so
    the entries from any bound to a later one are a list of their own."""
    if _native is not None:
        bounds = _native.group_bounds(data)
        return None if bounds is None else memoryview(bounds).cast("q")
    return _group_bounds_python(data)


def _group_bounds_python(data: bytes) -> list[int] | None:
    """``_group_bounds`` without the compiled scan: one step a group."""
    bounds, at, size = [0], 0, len(data)
    while at < size:
        if data[at] != _TAG_GROUP:
            return None
        length = _short_varint(data, at + 1)
        if length is None or length[0] > size - length[1]:
            return None
        at = length[1] + length[0]
        bounds.append(at)
    return bounds


def _short_varint(data: bytes, at: int) -> tuple[int, int] | None:
    """(value, position after) of the varint at ``at``, if it ends within
    ``_GROUP_VARINT_BYTES_MAX`` bytes and inside ``data``."""
    for stop in range(at, min(at + _GROUP_VARINT_BYTES_MAX, len(data))):
        if data[stop] < 0x80:
            value = sum((data[i] & 0x7F) << (7 * (i - at)) for i in range(at, stop + 1))
            return value, stop + 1
    return None


def _decode_chunk(data: bytes, start: int, end: int, first_group: int) -> DecodedLogs:
    """The groups serialized in ``data[start:end]``, on the fast path, or the reference path
    when the fast one declines (``_NotFast``) or fails in a way it should not: the reference
    path defines the result, so a bug in the fast path costs speed, never a failed read.
    Unexpected failures are logged and counted."""
    try:
        decoded = _decode_fast(data, start, end, first_group)
    except _NotFast:
        _count("not_fast")
    except Exception:
        _count("unexpected")
        log.warning(
            "the fast decoder failed on a chunk of %d bytes; decoding it the slow way",
            end - start,
            exc_info=True,
        )
    else:
        _count("fast")
        return decoded
    return _decode_reference(data[start:end], first_group)


@dataclass(frozen=True)
class DecodeStatistics:
    """Chunks decoded in this process since it started, by the path they took:
    ``unexpected`` counts fast-path failures other than a declined chunk (a bug to report)."""

    fast: int
    not_fast: int
    unexpected: int


_counts = {"fast": 0, "not_fast": 0, "unexpected": 0}
_counts_lock = threading.Lock()


def _count(path: str) -> None:
    with _counts_lock:
        _counts[path] += 1


def statistics() -> DecodeStatistics:
    with _counts_lock:
        return DecodeStatistics(**_counts)


# -- the reference path --------------------------------------------------------------------


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def _decode_reference(data: bytes, first_group: int = 0) -> DecodedLogs:
    """Through the protobuf objects; slow, but takes any valid LogGroupList."""
    group_list = parse_log_group_list(data)
    logs_per_group, topics, sources, tags = [], [], [], []
    time_us: list[int] = []
    offsets = [0]
    keys: list[str] = []
    values: list[str] = []
    for group in group_list.LogGroups:
        logs_per_group.append(len(group.Logs))
        topics.append(_text(group.Topic))
        sources.append(_text(group.Source))
        tags.append({_text(t.Key): _text(t.Value) for t in group.LogTags})
        for log in group.Logs:
            time_us.append(log.Time * 1_000_000 + log.Time_ns // 1000)
            contents = {_text(c.Key): _text(c.Value) for c in log.Contents}  # last one wins
            keys.extend(contents)
            values.extend(contents.values())
            offsets.append(len(keys))
    return DecodedLogs(
        first_group,
        logs_per_group,
        topics,
        sources,
        tags,
        pa.array(time_us, pa.int64()),
        pa.array(offsets, pa.int32()),
        pa.array(keys, pa.string()),
        pa.array(values, pa.string()),
    )


# -- the fast path -------------------------------------------------------------------------

_arange_cache: Any = pa.array([0], pa.int32())


def _arange(length: int) -> Any:
    """[0, 1, ..., length - 1] as int32, sliced from a cache grown by doubling."""
    global _arange_cache
    while len(_arange_cache) < length:
        size = len(_arange_cache)
        _arange_cache = pa.concat_arrays(
            [_arange_cache, pc.add(_arange_cache, pa.scalar(size, pa.int32()))]
        )
    return _arange_cache.slice(0, length)


def _constant(value: int, length: int) -> Any:
    return pa.repeat(pa.scalar(value, pa.int32()), length)


def _expect(condition: Any) -> None:
    """Leaves the fast path unless ``condition`` (a boolean array) holds everywhere."""
    if len(condition) and not pc.all(condition).as_py():
        raise _NotFast


def _byte_at(buffer_bytes: Any, positions: Any) -> Any:
    return pc.cast(pc.take(buffer_bytes, positions), pa.int64())


def _tag_at(buffer_bytes: Any, positions: Any) -> Any:
    """The byte at each position, as uint8 (for comparisons: no widening needed)."""
    return pc.take(buffer_bytes, positions)


def _varint(buffer_bytes: Any, positions: Any, bytes_max: int, mask: Any = None) -> tuple[Any, Any]:
    """(value, length in bytes) of the varint at each position (where ``mask`` is true, when
    given: elsewhere the results are meaningless). Values are int64; the length is the int 1
    when every varint is one byte long, the common case, else an int64 array."""
    first = pc.take(buffer_bytes, positions)
    more = pc.greater_equal(first, 128)
    if mask is not None:
        more = pc.and_(more, mask)
    value = pc.cast(first, pa.int64())
    if not pc.any(more).as_py():
        return value, 1
    value = pc.bit_wise_and(value, 127)
    length = pa.repeat(pa.scalar(1, pa.int64()), len(positions))
    for index in range(1, bytes_max):
        byte = _byte_at(buffer_bytes, pc.add(positions, index))
        part = pc.shift_left(pc.bit_wise_and(byte, 127), 7 * index)
        value = pc.if_else(more, pc.add(value, part), value)
        length = pc.if_else(more, pc.add(length, 1), length)
        more = pc.and_(more, pc.greater_equal(byte, 128))
        if not pc.any(more).as_py():
            return value, length
    raise _NotFast


def _interleave(first: Any, second: Any) -> Any:
    """[first[0], second[0], first[1], second[1], ...] as int32, for two arrays of values in
    [0, 2**31): each pair packed into one little-endian int64, whose buffer is read back as
    int32."""
    packed = pc.add(pc.cast(first, pa.int64()), pc.shift_left(pc.cast(second, pa.int64()), 32))
    return pa.Array.from_buffers(pa.int32(), 2 * len(first), [None, packed.buffers()[1]])


def _slices(buffer: Any, starts: Any, ends: Any) -> Any:
    """The byte ranges [starts[i], ends[i]) of ``buffer`` as a string array. The ranges
    ascend and do not overlap, so offsets alternating between starts and ends describe a
    binary array whose even elements are the ranges; take those."""
    count = len(starts)
    if count == 0:
        return pa.array([], pa.string())
    offsets = pa.concat_arrays([_interleave(starts, ends), pa.array([buffer.size], pa.int32())])
    alternating = pa.Array.from_buffers(
        pa.binary(), 2 * count, [None, offsets.buffers()[1], buffer]
    )
    ranges = pc.take(alternating, pc.multiply(_arange(count), pa.scalar(2, pa.int32())))
    try:
        return ranges.cast(pa.string())  # checks UTF-8
    except pa.ArrowInvalid as exc:
        raise _NotFast from exc


def _decode_fast(
    data: bytes, start: int = 0, end: int | None = None, first_group: int = 0
) -> DecodedLogs:
    """The logs of the groups serialized in ``data[start:end]``: with the compiled scan when
    it is built, else with Arrow kernels; ``_NotFast`` when the fast path cannot take them."""
    end = len(data) if end is None else end
    if _native is not None:
        return _decode_compiled(data, start, end, first_group)
    try:
        groups = _RawLogGroupList.FromString(data[start:end]).LogGroups
    except Exception as exc:  # DecodeError: the reference path raises the proper error
        raise _NotFast from exc
    logs_per_group, topics, sources, tags = [], [], [], []
    for group in groups:
        logs_per_group.append(len(group.Logs))
        topics.append(_text(group.Topic))
        sources.append(_text(group.Source))
        if not all(t.HasField("Key") and t.HasField("Value") for t in group.LogTags):
            raise _NotFast  # both are required: the reference path refuses the list
        tags.append({_text(t.Key): _text(t.Value) for t in group.LogTags})
    time_us, content_offsets, keys, values = _scan_with_kernels(groups, sum(logs_per_group))
    _expect_unique_keys(keys, content_offsets)
    return DecodedLogs(
        first_group, logs_per_group, topics, sources, tags, time_us, content_offsets, keys, values
    )


def _decode_compiled(data: bytes, start: int, end: int, first_group: int) -> DecodedLogs:
    """``_decode_fast`` in one pass of C over the groups' bytes (``_scan.c``): no Python
    object per log, and keys and values copied into buffers of their own, so no Arrow kernel
    has to walk the logs round by round, and no protobuf parse even of the groups (the scan
    hands over their topic, source and tags too). The same answers as the kernel path, at
    about a tenth of its time."""
    scanned = _native.scan_list(data, start, end)
    if scanned is None:
        raise _NotFast
    times, content_offsets, key_offsets, key_data, value_offsets, value_data = scanned[:6]
    uniform, ascii_only, per_group, group_fields = scanned[6:]
    count = len(times) // 8
    pairs = len(key_offsets) // 4 - 1
    keys = _strings(pairs, key_offsets, key_data, ascii_only)
    offsets = pa.Array.from_buffers(pa.int32(), count + 1, [None, pa.py_buffer(content_offsets)])
    if uniform:  # every log has the first log's keys: only those need to be distinct
        width = offsets[1].as_py() if count else 0
        if len(set(keys.slice(0, width).to_pylist())) != width:
            raise _NotFast
    else:
        _expect_unique_keys(keys, offsets)
    tags = []
    for _, _, pairs_ in group_fields:
        tags.append({_text(pairs_[i]): _text(pairs_[i + 1]) for i in range(0, len(pairs_), 2)})
    return DecodedLogs(
        first_group,
        list(memoryview(per_group).cast("i")),
        [_text(topic) for topic, _, _ in group_fields],
        [_text(source) for _, source, _ in group_fields],
        tags,
        pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(times)]),
        offsets,
        keys,
        _strings(pairs, value_offsets, value_data, ascii_only),
    )


def _strings(count: int, offsets: bytes, data: bytes, ascii_only: bool = False) -> Any:
    """A string array over the given offsets and bytes; ``_NotFast`` unless valid UTF-8,
    which ASCII is (the scan saw every byte), and Arrow checks otherwise."""
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    if ascii_only:
        return pa.Array.from_buffers(pa.string(), count, buffers)
    binary = pa.Array.from_buffers(pa.binary(), count, buffers)
    try:
        return binary.cast(pa.string())  # checks UTF-8
    except pa.ArrowInvalid as exc:
        raise _NotFast from exc


def _scan_with_kernels(groups: Sequence[Any], count: int) -> tuple[Any, Any, Any, Any]:
    """(time_us, content_offsets, keys, values) of the ``count`` logs of ``groups``, with
    Arrow kernels only: the path where the compiled scan is not built."""
    logs: list[bytes] = []
    for group in groups:
        logs.extend(group.Logs)
    logs.append(_PADDING)
    array = pa.array(logs, pa.binary())
    buffer = array.buffers()[2]
    offsets = pa.Array.from_buffers(pa.int32(), count + 2, [None, array.buffers()[1]])
    buffer_bytes = pa.Array.from_buffers(pa.uint8(), buffer.size, [None, buffer])
    # positions are int64 throughout: adding a Python int to an int32 array gives int64
    starts = pc.cast(offsets.slice(0, count), pa.int64())
    ends = pc.cast(offsets.slice(1, count), pa.int64())

    _expect(pc.equal(_tag_at(buffer_bytes, starts), _TAG_TIME))
    time_s, time_bytes = _varint(buffer_bytes, pc.add(starts, 1), _TIME_VARINT_BYTES_MAX)
    after_time = pc.add(pc.add(starts, 1), time_bytes)
    content_offsets, content_starts, content_ends, after_contents = _contents(
        buffer_bytes, after_time, ends
    )
    has_ns = pc.and_(
        pc.equal(_tag_at(buffer_bytes, after_contents), _TAG_TIME_NS),
        pc.less_equal(pc.add(after_contents, 5), ends),
    )
    nanos = _fixed32(buffer_bytes, pc.add(after_contents, 1))
    _expect(pc.equal(pc.if_else(has_ns, pc.add(after_contents, 5), after_contents), ends))
    time_us = pc.add(
        pc.multiply(time_s, 1_000_000),
        pc.if_else(has_ns, pc.divide(nanos, 1000), 0),
    )
    keys, values = _pairs(buffer, buffer_bytes, content_starts, content_ends)
    return time_us, content_offsets, keys, values


def _fixed32(buffer_bytes: Any, positions: Any) -> Any:
    value = pc.cast(pc.take(buffer_bytes, positions), pa.int64())
    for index in range(1, 4):
        byte = pc.cast(pc.take(buffer_bytes, pc.add(positions, index)), pa.int64())
        value = pc.add(value, pc.shift_left(byte, 8 * index))
    return value


def _contents(buffer_bytes: Any, positions: Any, ends: Any) -> tuple[Any, Any, Any, Any]:
    """Finds every log's Content fields, in rounds: round r reads the r-th Content of every
    log that has one (a log without one keeps its position, so it has none in later rounds
    either). Returns (content offsets per log, content starts and ends in log order, the
    position after each log's last content)."""
    position = positions
    presents, starts, stops = [], [], []
    counts = pa.repeat(pa.scalar(0, pa.int32()), len(positions))
    for _round in range(_ROUNDS_MAX + 1):
        present = pc.and_(
            pc.less(position, ends), pc.equal(_tag_at(buffer_bytes, position), _TAG_CONTENT)
        )
        if not pc.any(present).as_py():
            break
        length, length_bytes = _varint(buffer_bytes, pc.add(position, 1), 3, present)
        start = pc.add(pc.add(position, 1), length_bytes)
        stop = pc.add(start, length)
        position = pc.if_else(present, stop, position)
        _expect(pc.less_equal(position, ends))
        presents.append(present)
        starts.append(start)
        stops.append(stop)
        counts = pc.add(counts, pc.cast(present, pa.int32()))
    else:
        raise _NotFast
    content_offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(counts)])
    if not presents:
        empty = pa.array([], pa.int64())
        return content_offsets, empty, empty, position
    # Round-major to log order: the r-th content of log i goes to content_offsets[i] + r.
    present = pa.concat_arrays(presents)
    head = _head(content_offsets)
    targets = pa.concat_arrays([pc.add(head, r) for r in range(len(presents))])
    order = pc.inverse_permutation(pc.filter(targets, present))
    return (
        content_offsets,
        pc.take(pc.filter(pa.concat_arrays(starts), present), order),
        pc.take(pc.filter(pa.concat_arrays(stops), present), order),
        position,
    )


def _pairs(buffer: Any, buffer_bytes: Any, starts: Any, ends: Any) -> tuple[Any, Any]:
    """(keys, values) of the Content messages at [starts, ends)."""
    _expect(pc.equal(_tag_at(buffer_bytes, starts), _TAG_KEY))
    key_length, key_length_bytes = _varint(
        buffer_bytes, pc.add(starts, 1), _LENGTH_VARINT_BYTES_MAX
    )
    key_starts = pc.add(pc.add(starts, 1), key_length_bytes)
    key_ends = pc.add(key_starts, key_length)
    _expect(pc.less(key_ends, ends))
    _expect(pc.equal(_tag_at(buffer_bytes, key_ends), _TAG_VALUE))
    value_length, value_length_bytes = _varint(
        buffer_bytes, pc.add(key_ends, 1), _LENGTH_VARINT_BYTES_MAX
    )
    value_starts = pc.add(pc.add(key_ends, 1), value_length_bytes)
    _expect(pc.equal(pc.add(value_starts, value_length), ends))
    return _slices(buffer, key_starts, key_ends), _slices(buffer, value_starts, ends)


def _expect_unique_keys(keys: Any, content_offsets: Any) -> None:
    """Leaves the fast path when a log holds a key twice (the reference path keeps the last).

    With the distinct keys of the chunk numbered 0..d-1, each pair becomes the number
    ``log index * d + key number``; a log holds a key twice exactly when two pairs share a
    number. One hash count over int64 values, the same for any number of distinct keys (an
    earlier version summed ``2**key number`` in uint64 and broke at exactly 64 keys).
    """
    if len(keys) == 0 or _same_distinct_keys_in_every_log(keys, content_offsets):
        return
    encoded = pc.dictionary_encode(keys)
    distinct = len(encoded.dictionary)
    assert distinct <= len(keys) < 2**31, distinct  # so log index * distinct fits in int64
    combined = pc.add(
        pc.multiply(pc.cast(_content_log_index(content_offsets), pa.int64()), distinct),
        pc.cast(encoded.indices, pa.int64()),
    )
    if pc.count_distinct(combined).as_py() != len(keys):
        raise _NotFast


def _same_distinct_keys_in_every_log(keys: Any, content_offsets: Any) -> bool:
    """The common case of structured logs, checked cheaply: every log has the keys of the
    first log, in the same order, and those are distinct."""
    width = content_offsets[1].as_py()
    logs = len(content_offsets) - 1
    if width == 0 or len(keys) != width * logs:
        return False
    uniform = pc.equal(content_offsets, pc.multiply(_arange(logs + 1), width))
    if not pc.all(uniform).as_py():
        return False
    first = keys.slice(0, width).to_pylist()
    if len(set(first)) != width:
        return False
    if logs == 1:
        return True
    index = _arange(width * logs)
    position = pc.subtract(index, pc.multiply(pc.divide(index, width), width))  # index % width
    return bool(pc.all(pc.equal(keys, pc.take(keys.slice(0, width), position))).as_py())


def _head(offsets: Any) -> Any:
    """All but the last entry of an offsets array: where each list starts."""
    return offsets.slice(0, len(offsets) - 1)


def _content_log_index(content_offsets: Any) -> Any:
    """For each key/value pair, the index of the log it belongs to."""
    return pc.list_parent_indices(
        pa.ListArray.from_arrays(content_offsets, pa.nulls(content_offsets[-1].as_py()))
    )


# -- rows ----------------------------------------------------------------------------------


def to_record_batch(
    logs: DecodedLogs,
    shard_id: int,
    first_seq: int,
    receive_times_s: Sequence[int | None],
    content_columns: tuple[ContentColumn, ...],
) -> Any:
    """One row per log, in the order of ``schema.arrow_schema(content_columns)``; group i of
    ``logs`` is the group at sequence number ``first_seq + i`` (``first_seq`` includes
    ``logs.first_group``)."""
    group_count = len(logs.logs_per_group)
    assert len(receive_times_s) == group_count, (len(receive_times_s), group_count)
    count = logs.log_count
    group_offsets = pa.array([0, *_running_total(logs.logs_per_group)], pa.int32())
    group_of_log = pc.list_parent_indices(pa.ListArray.from_arrays(group_offsets, pa.nulls(count)))
    log_index = pc.subtract(_arange(count), pc.take(group_offsets, group_of_log))
    receive = pa.array(
        [None if t is None else t * 1_000_000 for t in receive_times_s], pa.int64()
    ).cast(_TIMESTAMP)
    per_log = _PerLog(logs.logs_per_group, group_of_log)
    columns = [
        _constant(shard_id, count),
        per_log.strings([encode_cursor(first_seq + i) for i in range(group_count)]),
        log_index,
        receive.take(group_of_log),
        logs.time_us.cast(_TIMESTAMP),
        per_log.strings(logs.topics),
        per_log.strings(logs.sources),
        per_log.maps(logs.tags),
        pa.MapArray.from_arrays(logs.content_offsets, logs.keys, logs.values, type=STRING_MAP),
    ]
    for column in content_columns:
        columns.append(_typed(_content_values(logs, column.key), column))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(content_columns))


class _PerLog:
    """Columns of values that are the same for every log of a group (its topic, source, tags
    and cursor), one row a log. With the compiled scan built, ``_scan.repeat`` copies each
    group's value out as many times as the group has logs; without it, Arrow's take does,
    which for the tags map cost about as much as the scan of the logs themselves."""

    def __init__(self, logs_per_group: Sequence[int], group_of_log: Any) -> None:
        self._counts = array.array("i", logs_per_group)
        self._group_of_log = group_of_log

    def _repeat(self, items: Sequence[Sequence[str]]) -> tuple[Any, Any] | None:
        """(list offsets, string array) of ``items`` repeated, or None without the scan."""
        repeated = None if _native is None else _native.repeat(items, self._counts)
        if repeated is None:
            return None
        list_offsets, offsets, data = repeated
        strings = pa.Array.from_buffers(
            pa.string(), len(offsets) // 4 - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )
        logs = len(list_offsets) // 4 - 1
        return pa.Array.from_buffers(
            pa.int32(), logs + 1, [None, pa.py_buffer(list_offsets)]
        ), strings

    def strings(self, values: Sequence[str]) -> Any:
        repeated = self._repeat([(value,) for value in values])
        if repeated is None:
            return pa.array(values, pa.string()).take(self._group_of_log)
        return repeated[1]

    def maps(self, maps: Sequence[dict[str, str]]) -> Any:
        keys = self._repeat([tuple(m) for m in maps])
        values = self._repeat([tuple(m.values()) for m in maps])
        if keys is None or values is None:
            per_group = pa.MapArray.from_arrays(
                pa.array([0, *_running_total([len(m) for m in maps])], pa.int32()),
                pa.array([key for m in maps for key in m], pa.string()),
                pa.array([value for m in maps for value in m.values()], pa.string()),
                type=STRING_MAP,
            )
            return per_group.take(self._group_of_log)
        return pa.MapArray.from_arrays(keys[0], keys[1], values[1], type=STRING_MAP)


def _running_total(values: Sequence[int]) -> list[int]:
    total, out = 0, []
    for value in values:
        total += value
        out.append(total)
    return out


def _content_values(logs: DecodedLogs, key: str) -> Any:
    """Each log's value of ``key`` (null where absent). Keys are unique within a log."""
    matches = pc.equal(logs.keys, key)
    seen = pa.concat_arrays(
        [pa.array([0], pa.int64()), pc.cumulative_sum(pc.cast(matches, pa.int64()))]
    )
    offsets = logs.content_offsets
    before, through = pc.take(seen, _head(offsets)), pc.take(seen, offsets.slice(1))
    found = pc.greater(through, before)
    picked = pc.if_else(found, pc.subtract(through, 1), pa.scalar(None, pa.int64()))
    return pc.take(pc.filter(logs.values, matches), picked)


_INTEGER = r"^\s*[+-]?[0-9]+\s*$"
_DECIMAL = r"^\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*$"
_TRUE = pa.array(["true", "1"])
_FALSE = pa.array(["false", "0"])
_INT_RANGE = {"int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}


def _typed(values: Any, column: ContentColumn) -> Any:
    """String values as ``column``'s type; a value that does not parse becomes null. The
    syntax is fixed by regular expressions (decimal integers; decimal or scientific
    numbers; true/false/1/0 in any case), so the result never depends on the batch."""
    kind = column.ddl_type
    if kind == "string":
        return values
    if kind == "boolean":
        lowered = pc.utf8_lower(pc.utf8_trim_whitespace(values))
        return pc.if_else(
            pc.is_in(lowered, _TRUE),
            True,
            pc.if_else(pc.is_in(lowered, _FALSE), False, pa.scalar(None, pa.bool_())),
        )
    pattern = _INTEGER if kind in _INT_RANGE else _DECIMAL
    valid = pc.match_substring_regex(values, pattern)
    cleaned = pc.utf8_trim_whitespace(pc.if_else(valid, values, pa.scalar(None, pa.string())))
    if kind in _INT_RANGE:
        return _to_integer(cleaned, column)
    as_double = pc.cast(cleaned, pa.float64())
    return as_double if kind == "double" else pc.cast(as_double, pa.float32(), safe=False)


def _to_integer(cleaned: Any, column: ContentColumn) -> Any:
    low, high = _INT_RANGE[column.ddl_type]
    digits_max = 9 if column.ddl_type == "int" else 18  # always in range, so cast is exact
    short = pc.less_equal(pc.utf8_length(pc.utf8_ltrim(cleaned, characters="+-")), digits_max)
    if pc.all(pc.or_(short, pc.is_null(cleaned))).as_py():
        unsigned = pc.replace_substring_regex(cleaned, pattern=r"^\+", replacement="")
        return pc.cast(unsigned, column.arrow_type)
    parsed = []
    for text in cleaned.to_pylist():
        number = None if text is None else int(text)
        parsed.append(number if number is not None and low <= number <= high else None)
    return pa.array(parsed, column.arrow_type)
