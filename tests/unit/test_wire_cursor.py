"""Cursors: canonical base64 of a decimal sequence number, strict but SDK-tolerant decoding."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loghub.errors import InvalidCursor
from loghub.wire.cursor import SEQUENCE_MAX, decode_cursor, encode_cursor


def test_cursor_is_base64_of_the_decimal_sequence_number() -> None:
    assert encode_cursor(0) == "MA=="
    assert encode_cursor(2) == "Mg=="
    assert encode_cursor(1524155379373908496) == "MTUyNDE1NTM3OTM3MzkwODQ5Ng=="
    assert decode_cursor("MTUyNDE1NTM3OTM3MzkwODQ5Ng==") == 1524155379373908496


def test_trailing_newline_from_the_sdks_mime_base64_is_accepted() -> None:
    assert decode_cursor("MA==\n") == 0
    assert decode_cursor(base64.encodebytes(b"41").decode()) == 41


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "   ",
        "MA",  # unpadded
        "M A==",  # inner whitespace
        "!!!!",
        base64.b64encode(b"-1").decode(),
        base64.b64encode(b"+1").decode(),
        base64.b64encode(b" 1").decode(),
        base64.b64encode(b"1_0").decode(),
        base64.b64encode(b"\xd9\xa1").decode(),  # an Arabic-Indic digit, which int() takes
        base64.b64encode(str(2**63).encode()).decode(),
        base64.b64encode(b"1" * 200).decode(),
        "MA==é",
    ],
)
def test_malformed_cursor_is_invalid_cursor(cursor: str) -> None:
    with pytest.raises(InvalidCursor):
        decode_cursor(cursor)


def test_largest_sequence_number_round_trips() -> None:
    assert decode_cursor(encode_cursor(SEQUENCE_MAX)) == SEQUENCE_MAX


@given(st.integers(min_value=0, max_value=SEQUENCE_MAX))
def test_round_trip_and_canonical(sequence: int) -> None:
    cursor = encode_cursor(sequence)
    assert decode_cursor(cursor) == sequence
    assert cursor == base64.b64encode(str(sequence).encode()).decode()
    assert "\n" not in cursor


@given(st.integers(min_value=0, max_value=SEQUENCE_MAX - 1))
def test_cursor_order_follows_sequence_via_decoding(sequence: int) -> None:
    # What the SDK's get_previous_cursor_time does: decode, subtract 1, encode.
    following = encode_cursor(sequence + 1)
    assert encode_cursor(decode_cursor(following) - 1) == encode_cursor(sequence)


@given(st.text())
def test_arbitrary_text_decodes_or_raises_invalid_cursor(text: str) -> None:
    try:
        sequence = decode_cursor(text)
    except InvalidCursor:
        return
    assert 0 <= sequence <= SEQUENCE_MAX


@given(st.binary(max_size=40))
def test_base64_of_arbitrary_bytes_decodes_or_raises_invalid_cursor(raw: bytes) -> None:
    try:
        sequence = decode_cursor(base64.b64encode(raw).decode())
    except InvalidCursor:
        return
    assert str(sequence).encode() == raw.lstrip(b"0") or raw.strip(b"0") == b""
