"""The Spark decoder's compiled log scan (``spark/_scan.c``) gives the rows its pure-Python
twin (Arrow kernels) gives, and both give what the protobuf reference path gives, for any
log group list; a key repeated in a log is still found when every log looks alike.

No Spark session: the decoder is pyarrow and protobuf only."""

from __future__ import annotations

import array
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from loghub.errors import PostBodyInvalid
from loghub.spark import _decode


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _log(time_s: int, time_ns: int | None, pairs: list[tuple[bytes, bytes]], swap: bool) -> bytes:
    out = _varint(1 << 3) + _varint(time_s)
    for key, value in pairs:
        fields = [_field(1, key), _field(2, value)]
        out += _field(2, b"".join(reversed(fields) if swap else fields))
    if time_ns is not None:
        out += bytes([4 << 3 | 5]) + time_ns.to_bytes(4, "little")
    return out


def _group(logs: list[bytes], topic: bytes = b"t") -> bytes:
    return _field(1, b"".join(_field(1, log) for log in logs) + _field(3, topic))


_text = st.text(max_size=8).map(lambda s: s.encode())
_keys = st.sampled_from([b"a", b"b", b"status", b"", b"\xc3\xa9", b"\xff\xfe"]) | _text
_values = (
    _text
    | st.binary(max_size=6)  # sometimes not UTF-8
    | st.integers(0, 300).map(lambda n: b"v" * n)  # one- and two-byte lengths
)
_logs = st.builds(
    _log,
    st.integers(0, 2**32 - 1),
    st.none() | st.integers(0, 999_999_999),
    st.lists(st.tuples(_keys, _values), max_size=5),  # a key may come twice in one log
    st.booleans(),
)
# Logs that share their keys (the common case the compiled scan reports as uniform), with
# values drawn per log.
_alike = st.builds(
    lambda keys, values: [
        _log(1_700_000_000, None, list(zip(keys, row, strict=False)), False) for row in values
    ],
    st.lists(_keys, max_size=4),
    st.lists(st.lists(_values, min_size=4, max_size=4), min_size=1, max_size=5),
)


def _rows(data: bytes) -> list[Any]:
    return [
        _decode.to_record_batch(logs, 0, logs.first_group, [None] * len(logs.logs_per_group), ())
        for logs in _decode.decode(data)
    ]


def _without_compiled_scan(data: bytes) -> list[Any]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_decode, "_native", None)
        return _rows(data)


def _reference(data: bytes) -> Any:
    logs = _decode._decode_reference(data)
    return _decode.to_record_batch(logs, 0, 0, [None] * len(logs.logs_per_group), ())


def _same(batches: list[Any], reference: Any) -> bool:
    joined = pa.Table.from_batches(batches, schema=reference.schema) if batches else None
    return joined is not None and joined.equals(pa.Table.from_batches([reference]))


def test_the_compiled_scan_is_built_and_takes_ordinary_logs() -> None:
    assert _decode._native is not None, "build it: python setup.py build_ext --inplace"
    data = _group([_log(1_700_000_000, 5000, [(b"a", b"1"), (b"b", b"2")], False)] * 3)
    assert _decode._native.scan_list(b"", 0, 0)[6:8] == (True, True)  # no logs: uniform
    cut_short = _field(1, b"\x0a\x02\x08")  # a group whose one log is cut short
    assert _decode._native.scan_list(cut_short, 0, len(cut_short)) is None
    before = _decode.statistics().fast
    (batch,) = _rows(data)
    assert _decode.statistics().fast == before + 1
    assert batch.column("contents").to_pylist() == [[("a", "1"), ("b", "2")]] * 3


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.lists(_logs, max_size=5).map(_group), min_size=1, max_size=3))
@example([_group([_log(1, None, [(b"k", b"1"), (b"k", b"2")], False)] * 2)])
@example([_group([_log(1, None, [(b"a", b"1"), (b"b", b"2")], False)] * 2)])
@example([_group([_log(1, None, [(b"a", b"1")], False), _log(1, None, [(b"b", b"1")], False)])])
def test_compiled_and_kernel_scans_give_the_reference_rows(group_list: list[bytes]) -> None:
    data = b"".join(group_list)
    reference = _reference(data)
    assert _same(_rows(data), reference)
    assert _same(_without_compiled_scan(data), reference)


@settings(max_examples=examples(100), deadline=None)
@given(_alike)
def test_logs_with_the_same_keys_decode_like_the_reference(logs: list[bytes]) -> None:
    data = _group(logs)
    assert _same(_rows(data), _reference(data))


def test_a_key_repeated_in_every_log_keeps_its_last_value() -> None:
    data = _group([_log(1, None, [(b"k", b"1"), (b"k", b"2")], False)] * 4)
    (batch,) = _rows(data)
    assert batch.column("contents").to_pylist() == [[("k", "2")]] * 4


def test_a_key_repeated_in_a_later_log_of_the_same_width_is_found() -> None:
    data = _group(
        [
            _log(1, None, [(b"a", b"1"), (b"b", b"2")], False),
            _log(1, None, [(b"k", b"1"), (b"k", b"2")], False),
        ]
    )
    assert _same(_rows(data), _reference(data))
    assert _rows(data)[0].column("contents").to_pylist()[1] == [("k", "2")]


def test_keys_and_values_of_every_short_length_are_copied_whole() -> None:
    """The scan copies strings of up to 16 bytes with overlapping word moves: every length
    from 0 to 40, ASCII or not, must come out byte for byte."""
    for length in range(41):
        text = ("abcdefghij" * 5)[:length].encode()
        wide = ("é" * length).encode()[:length].decode("utf-8", "ignore").encode()
        data = _group(
            [
                _log(1, None, [(b"k" + text, text), (b"w", wide)], False),
                _log(2, None, [(b"k" + text, text[::-1]), (b"w", wide)], False),
            ]
        )
        (batch,) = _rows(data)
        assert _same([batch], _reference(data)), length
        assert batch.column("contents").to_pylist()[1][0] == (
            "k" + text.decode(),
            text[::-1].decode(),
        )


def test_the_scan_reports_ascii_only_when_every_byte_is() -> None:
    native = _decode._native
    assert native is not None
    ascii_only = _group([_log(1, None, [(b"a", b"x" * 30)], False)])
    accented = _group([_log(1, None, [(b"a", b"x" * 29 + "é".encode())], False)])
    assert native.scan_list(ascii_only, 0, len(ascii_only))[7] is True
    assert native.scan_list(accented, 0, len(accented))[7] is False
    assert _rows(accented)[0].column("contents").to_pylist() == [[("a", "x" * 29 + "é")]]


def test_a_list_with_more_than_groups_in_it_is_read_the_protobuf_way() -> None:
    """An unknown top-level field (skipped by protobuf) stops the walk over the groups, which
    then leaves the list to the protobuf path: the same rows either way."""
    data = _group([_log(1, None, [(b"a", b"1")], False)]) + _field(9, b"extra")
    assert _decode._native is not None
    assert _decode._native.group_bounds(data) is None
    assert _decode._native.group_bounds(_group([])) is not None
    assert _same(_rows(data), _reference(data))


# Group-level fields in the shapes serializers may write: Topic and Source absent or twice
# (the last one wins), fields the reader does not use (Reserved, 2; an unknown varint),
# tags with a Key or a Value missing, and tags the compiled walk leaves to protobuf (Value
# before Key, an extra field).
_tag_messages = st.lists(
    st.tuples(_keys, _keys).map(lambda kv: _field(1, kv[0]) + _field(2, kv[1]))
    | _keys.map(lambda k: _field(1, k))
    | _keys.map(lambda v: _field(2, v))
    | st.tuples(_keys, _keys).map(lambda kv: _field(2, kv[1]) + _field(1, kv[0]))
    | _keys.map(lambda k: _field(1, k) + _field(2, b"v") + _field(3, b"x")),
    max_size=3,
)
_group_extras = st.lists(
    _keys.map(lambda t: _field(3, t))  # Topic
    | _keys.map(lambda t: _field(4, t))  # Source
    | _keys.map(lambda t: _field(2, t))  # Reserved
    | st.integers(0, 2**40).map(lambda n: _varint(5 << 3) + _varint(n)),
    max_size=4,
)


def _odd_group(logs: list[bytes], extras: list[bytes], tags: list[bytes]) -> bytes:
    fields = [_field(1, log) for log in logs] + extras + [_field(6, tag) for tag in tags]
    return _field(1, b"".join(fields))


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(
        st.builds(_odd_group, st.lists(_logs, max_size=3), _group_extras, _tag_messages),
        min_size=1,
        max_size=3,
    )
)
@example([_odd_group([_log(1, None, [], False)], [_field(3, b"a"), _field(3, b"b")], [])])
@example([_odd_group([], [], [_field(1, b"k"), _field(2, b"v"), _field(1, b"k")])])
def test_group_fields_come_out_of_the_compiled_walk_as_protobuf_reads_them(
    group_list: list[bytes],
) -> None:
    data = b"".join(group_list)
    try:
        reference = _reference(data)
    except PostBodyInvalid:  # a tag without its Key or Value: refused on every path
        with pytest.raises(PostBodyInvalid):
            _rows(data)
        with pytest.raises(PostBodyInvalid):
            _without_compiled_scan(data)
        return
    assert _same(_rows(data), reference)
    assert _same(_without_compiled_scan(data), reference)


def test_the_walk_hands_over_topic_source_and_tags() -> None:
    native = _decode._native
    assert native is not None
    data = _odd_group(
        [_log(1, None, [(b"a", b"1")], False)] * 2,
        [_field(3, b"first"), _field(4, b"src"), _field(3, b"last"), _field(2, b"reserved")],
        [_field(1, b"k") + _field(2, b"v"), _field(1, b"") + _field(2, "é".encode())],
    ) + _odd_group([], [], [])
    scanned = native.scan_list(data, 0, len(data))
    assert list(memoryview(scanned[8]).cast("i")) == [2, 0]
    assert scanned[9] == (
        (b"last", b"src", (b"k", b"v", b"", "é".encode())),
        (b"", b"", ()),
    )
    for tag in (_field(2, b"v") + _field(1, b"k"), _field(1, b"k"), _field(2, b"v")):
        odd = _odd_group([], [], [tag])
        assert native.scan_list(odd, 0, len(odd)) is None, tag  # protobuf decides


def test_repeat_copies_each_groups_strings_once_a_log() -> None:
    native = _decode._native
    assert native is not None
    counts = array.array("i", [2, 0, 3])
    list_offsets, offsets, data = native.repeat([("ab", ""), ("x",), ("é",)], counts)
    assert list(memoryview(list_offsets).cast("i")) == [0, 2, 4, 5, 6, 7]
    assert list(memoryview(offsets).cast("i")) == [0, 2, 2, 4, 4, 6, 8, 10]
    assert data == b"abab" + "ééé".encode()
    with pytest.raises(ValueError):
        native.repeat([("a",)], array.array("i", [1, 1]))
    with pytest.raises(ValueError):
        native.repeat([("a",)], array.array("i", [-1]))
    with pytest.raises(TypeError):
        native.repeat(["a"], array.array("i", [1]))


_lists = st.lists(
    st.sampled_from([_group([]), _group([_log(1, None, [(b"a", b"1")], False)])])
    | st.binary(max_size=6),
    max_size=4,
).map(b"".join)


@settings(max_examples=examples(200), deadline=None)
@given(_lists)
def test_the_python_walk_over_the_groups_finds_what_the_compiled_one_finds(data: bytes) -> None:
    assert _decode._native is not None
    compiled = _decode._native.group_bounds(data)
    python = _decode._group_bounds_python(data)
    if compiled is None:
        assert python is None
    else:
        assert python == list(memoryview(compiled).cast("q"))
