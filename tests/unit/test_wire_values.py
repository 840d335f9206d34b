"""Numbers and JSON from requests: ASCII digits only, bounded, and every refusal the error
class the caller names (never ValueError, OverflowError or RecursionError)."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loghub.errors import LogStoreInfoInvalid, ParameterInvalid, PostBodyInvalid
from loghub.wire.values import JSON_DEPTH_MAX, json_bool, json_int, loads_json, parse_decimal


@pytest.mark.parametrize(("text", "number"), [("0", 0), ("12", 12), (" 7 ", 7), ("-3", -3)])
def test_ascii_decimals_are_read(text: str, number: int) -> None:
    assert parse_decimal(text, "n", ParameterInvalid, negative=True) == number


@pytest.mark.parametrize(
    "text",
    ["²", "①", "٣", "１", "--1", "+1", "1_0", "", " ", "0x1", "1e3", "1.0", "9" * 20, "- 1"],
)
def test_anything_else_is_the_callers_error(text: str) -> None:
    with pytest.raises(ParameterInvalid):
        parse_decimal(text, "n", ParameterInvalid, negative=True)


def test_a_minus_is_refused_where_negative_makes_no_sense() -> None:
    with pytest.raises(ParameterInvalid):
        parse_decimal("-1", "n", ParameterInvalid)


@settings(derandomize=True, max_examples=300)
@given(st.text(max_size=30))
def test_any_text_is_a_number_or_the_callers_error(text: str) -> None:
    try:
        number = parse_decimal(text, "n", ParameterInvalid, negative=True)
    except ParameterInvalid:
        return
    stripped = text.strip(" \t")
    assert stripped.isascii() and stripped.lstrip("-").isdigit() and number == int(stripped)


@pytest.mark.parametrize(("value", "number"), [(4, 4), (4.0, 4), ("4", 4), (" 5", 5)])
def test_json_integers_may_be_integral_floats_or_decimal_strings(
    value: object, number: int
) -> None:
    assert json_int(value, "timeout", ParameterInvalid, low=1, high=10) == number


def test_a_fractional_timeout_is_rounded_up() -> None:
    assert json_int(2.1, "timeout", ParameterInvalid, low=1, high=10, round_up=True) == 3


@pytest.mark.parametrize(
    "value", [True, None, 4.5, float("inf"), float("nan"), "²", "٣", [], {}, 11, 0, 2**70]
)
def test_other_json_values_are_refused(value: object) -> None:
    with pytest.raises(LogStoreInfoInvalid):
        json_int(value, "ttl", LogStoreInfoInvalid, low=1, high=10)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 10_000 + b"]" * 10_000,  # RecursionError in json.loads
        b"{" * (JSON_DEPTH_MAX + 1) + b"}" * (JSON_DEPTH_MAX + 1),
        b"9" * 5000,  # ValueError: past Python's int max str digits
        b'{"shard": ' + b"1" * 41 + b"}",
        b"[NaN]",
        b"[Infinity]",
        b"\xff\xfe",
        b"{",
    ],
)
def test_bodies_too_deep_too_long_or_not_json_are_post_body_invalid(body: bytes) -> None:
    with pytest.raises(PostBodyInvalid):
        loads_json(body)


@pytest.mark.parametrize(
    "body",
    [
        b"[" + b"1" * 41 + b"]",
        b"[-" + b"1" * 40 + b"]",
        b"[1." + b"0" * 39 + b"]",
        b"[1e" + b"0" * 39 + b"]",
        b'["' + b"1" * 100 + b'", ' + b"2" * 41 + b"]",  # a long run in a string besides
        ("[" + "1" * 41 + "]").encode("utf-16"),  # json.loads reads UTF-16 and UTF-32 too
        ("[" + "1" * 41 + "]").encode("utf-32-le"),
    ],
)
def test_a_number_literal_longer_than_40_characters_is_refused(body: bytes) -> None:
    with pytest.raises(PostBodyInvalid):
        loads_json(body)


@pytest.mark.parametrize(
    ("body", "value"),
    [
        (b"[" + b"1" * 40 + b"]", [int("1" * 40)]),
        (b'["' + b"1" * 100 + b'", 7, 2.5]', ["1" * 100, 7, 2.5]),  # long run inside a string
        (b'{"e": "' + b"e" * 50 + b'", "n": -0.5e-3}', {"e": "e" * 50, "n": -0.5e-3}),
        (json.dumps(list(range(1000))).encode(), list(range(1000))),
    ],
)
def test_numbers_up_to_the_bound_are_read_whatever_the_strings_hold(
    body: bytes, value: object
) -> None:
    assert loads_json(body) == value


@settings(derandomize=True, max_examples=300)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet="0123456789.eE-+x\"", max_size=60),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=5), children, max_size=5),
    max_leaves=20,
))  # fmt: skip
def test_any_json_reads_as_json_loads_or_is_refused_for_a_long_number(value: object) -> None:
    body = json.dumps(value).encode()
    literals_ok = all(len(text) <= 40 for text in json_number_literals(body.decode()))
    if literals_ok:
        assert loads_json(body) == json.loads(body)
    else:
        with pytest.raises(PostBodyInvalid):
            loads_json(body)


def json_number_literals(text: str) -> list[str]:
    """The number literals of a JSON text (outside strings)."""
    found: list[str] = []
    decoder = json.JSONDecoder(
        parse_int=lambda t: found.append(t) or 0, parse_float=lambda t: found.append(t) or 0.0
    )
    decoder.decode(text)
    return found


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    body = json.dumps({"key": "[" * 1000, "list": [[1]]}).encode()
    assert loads_json(body) == {"key": "[" * 1000, "list": [[1]]}


def test_depth_at_the_limit_is_read() -> None:
    body = b"[" * JSON_DEPTH_MAX + b"]" * JSON_DEPTH_MAX
    assert loads_json(body) is not None


@pytest.mark.parametrize(
    ("text", "number"), [("10.0", 10), ("10.", None), ("7.000", 7), ("-3.0", -3)]
)
def test_a_zero_fraction_is_read_where_fractions_are_allowed(text: str, number: int | None) -> None:
    if number is None:
        with pytest.raises(ParameterInvalid):
            parse_decimal(text, "n", ParameterInvalid, negative=True, fraction=True)
    else:
        assert parse_decimal(text, "n", ParameterInvalid, negative=True, fraction=True) == number


@pytest.mark.parametrize("text", ["10.5", ".5", "1.0.0", "1e3", "1.²"])
def test_a_fraction_that_is_not_zero_is_refused_unless_rounding_up(text: str) -> None:
    with pytest.raises(ParameterInvalid):
        parse_decimal(text, "n", ParameterInvalid, fraction=True)


@pytest.mark.parametrize(("text", "number"), [("2.5", 3), ("2.0001", 3), ("-2.5", -2), ("4.0", 4)])
def test_a_fraction_rounds_up_when_asked(text: str, number: int) -> None:
    assert (
        parse_decimal(text, "n", ParameterInvalid, negative=True, fraction=True, round_up=True)
        == number
    )


@settings(derandomize=True, max_examples=300)
@given(st.integers(-(10**12), 10**12), st.text("0123456789", min_size=1, max_size=6))
def test_a_fraction_rounded_up_is_the_ceiling(whole: int, digits: str) -> None:
    text = f"{'-' if whole < 0 else ''}{abs(whole)}.{digits}"
    expected = math.ceil(Fraction(text))
    assert (
        parse_decimal(text, "n", ParameterInvalid, negative=True, fraction=True, round_up=True)
        == expected
    )


@pytest.mark.parametrize(("value", "number"), [("4.0", 4), (" 6.00 ", 6)])
def test_a_json_string_may_write_an_integer_as_a_float(value: str, number: int) -> None:
    assert json_int(value, "timeout", ParameterInvalid, low=1, high=10) == number


def test_a_fractional_timeout_string_is_rounded_up() -> None:
    assert json_int("2.5", "timeout", ParameterInvalid, low=1, high=10, round_up=True) == 3
    with pytest.raises(ParameterInvalid):
        json_int("2.5", "shard", ParameterInvalid, low=0, high=10)


@pytest.mark.parametrize(
    ("value", "flag"), [(True, True), (False, False), ("true", True), ("False", False)]
)
def test_json_booleans_may_be_strings(value: object, flag: bool) -> None:
    assert json_bool(value, "order", ParameterInvalid) is flag


@pytest.mark.parametrize("value", [None, 0, 1, "yes", "", [], {}])
def test_other_values_are_not_booleans(value: object) -> None:
    with pytest.raises(ParameterInvalid):
        json_bool(value, "order", ParameterInvalid)
