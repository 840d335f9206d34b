"""Cursors: a shard position as LogHub writes it, base64 of a decimal sequence number.

A cursor names the sequence number of the next log group to read in one shard. The SDK treats
cursors as opaque except in ``get_previous_cursor_time``, which base64-decodes one, reads a
decimal integer, subtracts 1 and re-encodes it; the hosted service's cursors look the same
(``MTUyNDE1NTM3OTM3MzkwODQ5Ng==``). Consumers compare cursors as strings, so the encoding is
canonical: standard alphabet, padded, no newline; equal positions give equal strings.

Decoding is lenient only where the SDK needs it: surrounding whitespace is stripped (the SDK
sometimes re-encodes with MIME-style base64 and a trailing newline). Everything else that is
not the base64 of the ASCII decimal of an integer in [0, 2**63) raises ``InvalidCursor``.
Pure functions; thread-safe.
"""

from __future__ import annotations

import base64
import binascii

from loghub.errors import InvalidCursor

__all__ = ["SEQUENCE_MAX", "decode_cursor", "encode_cursor"]

SEQUENCE_MAX = 2**63 - 1
"""The largest sequence number a cursor may carry (it must fit a signed 64-bit column)."""

_CURSOR_CHARS_MAX = 64  # 19 digits encode to 28 characters; refuse to decode anything longer


def encode_cursor(sequence: int) -> str:
    """The canonical cursor for ``sequence``."""
    assert 0 <= sequence <= SEQUENCE_MAX, sequence
    return base64.b64encode(str(sequence).encode("ascii")).decode("ascii")


def decode_cursor(cursor: str) -> int:
    """The sequence number ``cursor`` names; ``InvalidCursor`` when it names none."""
    text = cursor.strip()
    if not text or len(text) > _CURSOR_CHARS_MAX or not text.isascii():
        raise InvalidCursor(f"invalid cursor {cursor!r}")
    try:
        digits = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidCursor(f"cursor {cursor!r} is not base64") from exc
    # isdigit() on bytes accepts ASCII digits only; int() alone would also take "+1", " 1", "1_0"
    if not digits.isdigit():
        raise InvalidCursor(f"cursor {cursor!r} does not encode a decimal sequence number")
    sequence = int(digits)
    if sequence > SEQUENCE_MAX:
        raise InvalidCursor(f"cursor {cursor!r} is out of range")
    return sequence
