"""parse_lines: the fast joined parse gives what a line-by-line parse gives, bad lines and all."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loghub.client import producer
from loghub.client.producer import BadLine, ParsedBatch, parse_lines

NOW_S = 1_750_000_000
_scalars = st.one_of(
    st.text(max_size=8), st.integers(-(10**6), 10**6), st.booleans(), st.none(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)  # fmt: skip
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=4)
_logs = st.dictionaries(st.text(min_size=1, max_size=6), _values, max_size=5)
_bad_lines = st.sampled_from(
    ["not json", "[1, 2]", '"text"', "{", '{"a": 1} {"b": 2}', '{"a": [1', "2]}", "\xff"]
)
_bad_times = st.sampled_from(['"yesterday"', "-1", "true", "null", "1e30", '{"s": 1}'])


def _logs_of(batch: ParsedBatch) -> list[dict[str, Any]]:
    return [
        {"Time": log.Time, "Contents": [{"Key": c.Key, "Value": c.Value} for c in log.Contents]}
        for log in batch.group.Logs
    ]


def _expected(contents: dict[str, Any]) -> list[dict[str, str]]:
    """What a log's contents must become: strings as they are, the rest as compact JSON."""
    return [
        {"Key": k, "Value": v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))}
        for k, v in contents.items()
    ]


_kinds = st.sampled_from(["good", "bad", "bad_time", "blank"])
_lines = st.tuples(_kinds, _logs, _bad_lines, _bad_times, st.integers(0, 2**32 - 1))


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.lists(_lines, max_size=12))
def test_each_line_is_a_log_or_a_bad_line_with_its_number(lines: list[Any]) -> None:
    raw: list[bytes] = []
    expected_logs: list[dict[str, Any]] = []
    expected_bad: list[int] = []
    for number, (kind, contents, bad, bad_time, time_s) in enumerate(lines, 10):
        contents = {k: v for k, v in contents.items() if k != "__time__"}
        if kind == "good":
            raw.append(json.dumps({**contents, "__time__": time_s}).encode())
            expected_logs.append({"Time": time_s, "Contents": _expected(contents)})
        elif kind == "bad":
            raw.append(bad.encode("latin-1"))
            expected_bad.append(number)
        elif kind == "bad_time":
            raw.append(f'{{"k": "v", "__time__": {bad_time}}}'.encode())
            expected_bad.append(number)
        else:
            raw.append(b"  ")
    batch = parse_lines(raw, 10, "__time__", NOW_S)
    assert [bad.number for bad in batch.bad] == expected_bad
    logs = _logs_of(batch)
    assert len(logs) == len(expected_logs)
    for log, expected in zip(logs, expected_logs, strict=True):
        assert log["Time"] == expected["Time"]
        got = [(c["Key"], c["Value"]) for c in log["Contents"]]
        want = [(c["Key"], c["Value"]) for c in expected["Contents"]]
        # numbers keep their written text: compare them as numbers
        assert [k for k, _ in got] == [k for k, _ in want]
        for (_, got_value), (_, want_value) in zip(got, want, strict=True):
            if got_value != want_value:
                assert json.loads(got_value) == json.loads(want_value)


def test_numbers_keep_their_text_and_missing_time_is_now() -> None:
    batch = parse_lines([b'{"price": 1.50, "n": 10, "__time__": 1700000000.9}', b'{"a": "b"}'],
                        1, "__time__", NOW_S)  # fmt: skip
    assert batch.bad == []
    logs = _logs_of(batch)
    assert logs[0]["Time"] == 1_700_000_000
    assert logs[0]["Contents"] == [
        {"Key": "price", "Value": "1.50"}, {"Key": "n", "Value": "10"}
    ]  # fmt: skip
    assert logs[1]["Time"] == NOW_S


def test_lines_that_only_parse_joined_are_still_bad() -> None:
    """Two halves of an object on two lines are two bad lines, not one log."""
    batch = parse_lines([b'{"a": [1', b"2]}", b'{"ok": "1"}'], 1, "__time__", NOW_S)
    assert [bad.number for bad in batch.bad] == [1, 2]
    assert isinstance(batch.bad[0], BadLine) and "not JSON" in batch.bad[0].reason
    assert batch.count == 1


def test_lines_that_regroup_when_joined_are_still_bad() -> None:
    """An unclosed line, its closing line, and a line holding two objects: joined they would
    make three objects out of three lines."""
    lines = [b'{"a": [{"x": 1}', b'{"y": 2}]}', b'{"p": 1}, {"q": 2}', b'{"ok": "1"}']
    batch = parse_lines(lines, 1, "__time__", NOW_S)
    assert [bad.number for bad in batch.bad] == [1, 2, 3]
    assert batch.count == 1


def test_hash_key_values_follow_their_logs() -> None:
    lines = [b'{"user": "u1"}', b"bad", b'{"x": "y"}', b'{"user": 7, "ok": true}']
    batch = parse_lines(lines, 1, "__time__", NOW_S, "user")
    assert batch.keys == ["u1", "", "7"]


_text_values = st.text(max_size=40) | st.text(min_size=120, max_size=400)  # 1- and 2-byte lengths
_string_logs = st.dictionaries(st.text(max_size=10), _text_values, max_size=12)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_string_logs | _logs, st.integers(0, 2**32 - 1)), max_size=10),
    st.sampled_from([None, "k", ""]),
)
def test_the_compiled_encoder_gives_the_pure_python_group(
    logs: list[tuple[dict[str, Any], int]], hash_key_field: str | None
) -> None:
    """The C encoder (built by setup.py) and the in-place build give the same group and keys,
    for any text (unicode, empty, long) and with non-string values in the batch (which send
    the whole batch down the general path)."""
    lines = [json.dumps({**c, "__time__": t}).encode() for c, t in logs]
    assert producer._native is not None, "the compiled encoder was not built"
    fast = parse_lines(lines, 1, "__time__", NOW_S, hash_key_field)
    producer._native_enabled = False
    try:
        plain = parse_lines(lines, 1, "__time__", NOW_S, hash_key_field)
    finally:
        producer._native_enabled = True
    assert fast.group.SerializeToString() == plain.group.SerializeToString()
    assert fast.keys == plain.keys
    assert fast.bad == plain.bad


def test_the_compiled_encoder_refuses_what_it_cannot_write() -> None:
    assert producer._native is not None
    with pytest.raises(TypeError):
        producer._native.encode_logs([{"k": 1}], [0])
    with pytest.raises(TypeError):
        producer._native.encode_logs(["not a dict"], [0])
    with pytest.raises(ValueError):
        producer._native.encode_logs([{"k": "v"}], [])
    with pytest.raises(OverflowError):
        producer._native.encode_logs([{"k": "v"}], [-1])
    lone = parse_lines([b'{"k": "\\ud800"}', b'{"k": "v"}'], 1, "__time__", NOW_S)
    assert [bad.number for bad in lone.bad] == [1]  # a lone surrogate: a bad line, not a crash
    assert lone.count == 1
    producer._native_enabled = False
    try:
        plain = parse_lines([b'{"k": "\\ud800"}', b'{"k": "v"}'], 1, "__time__", NOW_S)
        assert plain.bad == lone.bad
    finally:
        producer._native_enabled = True
