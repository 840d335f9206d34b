"""Pulled bytes to Arrow rows: the vectorized path gives what the protobuf path gives, for any
log group, and typed content columns parse the same way in every batch."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from loghub.spark import _decode
from loghub.spark.schema import parse_content_columns

# -- a hand-written protobuf encoder, so tests can write what the writers never do ---------


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


def _group(logs: list[bytes], topic: bytes, tags: list[tuple[bytes, bytes]]) -> bytes:
    out = b"".join(_field(1, log) for log in logs) + _field(3, topic)
    out += b"".join(_field(6, _field(1, k) + _field(2, v)) for k, v in tags)
    return _field(1, out)  # one entry of a LogGroupList


text = st.text(max_size=8).map(lambda s: s.encode())
# Keys as real logs have them at the edges: a few common ones, the empty key, keys that are not
# UTF-8, and a pool of hundreds (wide, heterogeneous JSON logs: many distinct keys a group).
wide_key = st.integers(0, 400).map(lambda n: f"field_{n}".encode())
keys = (
    st.sampled_from([b"a", b"b", b"status", b"n", b"\xc3\xa9", b"", b"\xff\xfe"]) | text | wide_key
)
values = (
    text
    | st.binary(max_size=6)  # sometimes not UTF-8
    | st.integers(0, 400).map(lambda n: b"v" * n)  # one- and two-byte lengths
    | st.sampled_from([b"42", b" -7 ", b"+3", b"1.5e2", b"true", b"FALSE", b"99999999999"])
)
logs = st.builds(
    _log,
    st.integers(0, 2**32 - 1),
    st.none() | st.integers(0, 999_999_999),
    st.lists(st.tuples(keys, values), max_size=6)  # a key may come twice in one log
    | st.lists(st.tuples(wide_key, values), min_size=20, max_size=90),
    st.booleans(),
)
groups = st.builds(
    _group, st.lists(logs, max_size=6), text, st.lists(st.tuples(keys, text), max_size=2)
)


def _unique(pairs: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode(), v.encode()) for k, v in dict(pairs).items()]


def _disjoint(first_key: int, count: int) -> list[tuple[str, str]]:
    return [(f"k{first_key + i}", str(i)) for i in range(count)]


well_formed_pairs = (
    st.lists(st.tuples(st.text(max_size=8), st.text(max_size=300)), max_size=8)
    # a log with keys no other log has, up to a few hundred distinct keys a group
    | st.builds(_disjoint, st.integers(0, 10_000), st.integers(0, 120))
)
well_formed_logs = st.builds(
    _log,
    st.integers(0, 2**32 - 1),
    st.none() | st.integers(0, 999_999_999),
    well_formed_pairs.map(_unique),
    st.just(False),
)
well_formed_groups = st.builds(
    _group,
    st.lists(well_formed_logs, max_size=6),
    text,
    st.lists(st.tuples(keys, text), max_size=2),
)


def _distinct_keys(logs_: int, keys_per_log: int) -> bytes:
    """One group whose logs have keys no other log has: ``logs_ * keys_per_log`` distinct."""
    return _group(
        [
            _log(
                1_700_000_000,
                None,
                [(f"k{i}_{j}".encode(), b"v") for j in range(keys_per_log)],
                False,
            )
            for i in range(logs_)
        ],
        b"",
        [],
    )


# The boundary of the old 64-bit duplicate-key check, hit on every run, not by luck.
BOUNDARY = [
    _distinct_keys(7, 9),  # 63
    _distinct_keys(8, 8),  # 64: the reported crash
    _distinct_keys(64, 1),  # 64, one key a log
    _distinct_keys(5, 13),  # 65
    _distinct_keys(1, 64),  # 64 in one log
    _distinct_keys(2, 0),  # none
    _distinct_keys(1, 1),  # one
]
REPEATED_AT_BOUNDARY = _group(
    [_log(1, None, [(f"k{j}".encode(), b"v") for j in range(64)] + [(b"k63", b"last")], False)],
    b"",
    [],
)
COLUMNS = parse_content_columns("status int, n bigint, a double, b boolean, `é` string, f float")


def _batch(logs_: _decode.DecodedLogs) -> Any:
    times = [None] * len(logs_.logs_per_group)
    return _decode.to_record_batch(logs_, 3, 100 + logs_.first_group, times, COLUMNS)


def _rows(data: bytes, chunk_bytes: int = _decode.CHUNK_BYTES) -> Any:
    """What the reader makes of ``data``: the batches of every chunk, as one table."""
    batches = [_batch(chunk) for chunk in _decode.decode(data, chunk_bytes)]
    return pa.Table.from_batches(batches, schema=_batch(_decode._decode_reference(b"")).schema)


def _reference(data: bytes) -> Any:
    return pa.Table.from_batches([_batch(_decode._decode_reference(data))])


def _fast(data: bytes) -> Any:
    """The fast path alone over all of ``data``; raises if it would fall back."""
    return pa.Table.from_batches([_batch(_decode._decode_fast(data))])


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(groups, min_size=1, max_size=4))
@example([REPEATED_AT_BOUNDARY])
@example(BOUNDARY)
def test_decode_gives_what_the_reference_path_gives(group_list: list[bytes]) -> None:
    data = b"".join(group_list)
    assert _rows(data).equals(_reference(data))
    assert _rows(data, chunk_bytes=1).equals(_reference(data))  # a chunk a group


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(well_formed_groups, min_size=1, max_size=4))
@example([BOUNDARY[0]])
@example([BOUNDARY[1]])
@example([BOUNDARY[2]])
@example([BOUNDARY[3]])
@example(BOUNDARY)
def test_well_formed_groups_take_the_fast_path_to_the_same_rows(group_list: list[bytes]) -> None:
    data = b"".join(group_list)
    assert _fast(data).equals(_reference(data))


def test_ordinary_groups_take_the_fast_path() -> None:
    data = _group(
        [_log(1_700_000_000, 5_000, [(b"status", b"200"), (b"path", b"/" * 300)], False)] * 3,
        b"topic",
        [(b"env", b"prod")],
    )
    assert _fast(data).equals(_reference(data))


def test_a_repeated_key_keeps_its_last_value() -> None:
    data = _group([_log(1, None, [(b"k", b"1"), (b"k", b"2")], False)], b"", [])
    assert _rows(data).column("contents").to_pylist() == [[("k", "2")]]


def test_typed_columns_parse_each_value_alone() -> None:
    values = ["200", " 42 ", "+7", "-0", "1.5", "abc", "", "99999999999", None]
    contents = [
        [(b"status", v.encode()), (b"n", v.encode()), (b"a", v.encode())] if v is not None else []
        for v in values
    ]
    data = _group([_log(1, None, pairs, False) for pairs in contents], b"", [])
    batch = _rows(data)
    assert batch.column("status").to_pylist() == [200, 42, 7, 0, None, None, None, None, None]
    assert batch.column("n").to_pylist() == [200, 42, 7, 0, None, None, None, 99999999999, None]
    assert batch.column("a").to_pylist() == [
        200.0,
        42.0,
        7.0,
        0.0,
        1.5,
        None,
        None,
        99999999999.0,
        None,
    ]


def test_booleans_accept_true_false_one_zero_in_any_case() -> None:
    values = [b"true", b"FALSE", b"1", b"0", b"yes"]
    data = _group([_log(1, None, [(b"b", v)], False) for v in values], b"", [])
    assert _rows(data).column("b").to_pylist() == [True, False, True, False, None]


def test_an_empty_pull_gives_no_rows() -> None:
    assert _rows(b"").num_rows == 0


def test_many_distinct_keys_and_many_pairs_a_log_still_decode_right() -> None:
    wide = [(f"k{i}".encode(), b"v") for i in range(100)]  # more keys than the 64-bit check
    logs_ = [_log(1, None, wide, False), _log(2, None, wide[:3] + wide[:1], False)]
    long_log = [_log(3, None, [(f"x{i}".encode(), b"1") for i in range(600)], False)]
    for data in (_group(logs_[:1], b"", []), _group(logs_, b"", []), _group(long_log, b"", [])):
        assert _rows(data).equals(_reference(data))
    _fast(_group(logs_[:1], b"", []))  # distinct keys: no fallback


def test_a_repeated_key_is_found_when_every_log_has_the_same_number_of_keys_overall() -> None:
    pairs = [
        [(b"a", b"1"), (b"b", b"2")],
        [],
        [(b"a", b"3"), (b"b", b"4"), (b"a", b"5"), (b"b", b"6")],
    ]
    data = _group([_log(1, None, p, False) for p in pairs], b"", [])
    assert _rows(data).equals(_reference(data))
    assert _rows(data).column("contents").to_pylist()[2] == [("a", "5"), ("b", "6")]


@pytest.mark.parametrize("distinct", [0, 1, 63, 64, 65, 3000])
def test_the_duplicate_key_check_is_right_at_any_number_of_distinct_keys(distinct: int) -> None:
    per_log = 8
    logs_ = -(-distinct // per_log)
    pairs = [
        [(f"k{i}".encode(), b"v") for i in range(n, min(n + per_log, distinct))]
        for n in range(0, distinct, per_log)
    ]
    unique = _group([_log(1, None, p, False) for p in pairs], b"", [])
    assert _fast(unique).equals(_reference(unique))
    assert _rows(unique).num_rows == logs_
    if distinct:
        repeated = _group([_log(1, None, p + p[:1], False) for p in pairs], b"", [])
        with pytest.raises(_decode._NotFast):
            _decode._decode_fast(repeated)
        assert _rows(repeated).equals(_reference(repeated))


def test_the_reported_chunk_of_64_distinct_keys_decodes_on_the_fast_path() -> None:
    data = _distinct_keys(8, 8)
    before = _decode.statistics()
    rows = _rows(data)
    after = _decode.statistics()
    assert rows.num_rows == 8
    assert sum(len(c) for c in rows.column("contents").to_pylist()) == 64
    assert rows.equals(_reference(data))
    assert after.fast == before.fast + 1
    assert after.unexpected == before.unexpected


def test_an_unexpected_failure_of_the_fast_path_falls_back_and_is_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(data_: bytes, start: int = 0, end: int | None = None, first: int = 0) -> Any:
        raise pa.ArrowInvalid("a bug in the fast path")

    data = _distinct_keys(3, 4)
    expected = _reference(data)
    monkeypatch.setattr(_decode, "_decode_fast", broken)
    before = _decode.statistics()
    with caplog.at_level("WARNING", logger="loghub.spark"):
        rows = _rows(data)
    assert rows.equals(expected)
    assert _decode.statistics().unexpected == before.unexpected + 1
    assert "fast decoder failed" in caplog.text


def test_invalid_bytes_are_still_refused() -> None:
    from loghub.errors import PostBodyInvalid

    with pytest.raises(PostBodyInvalid):
        list(_decode.decode(b"\x0a\xff\xff\xff"))
