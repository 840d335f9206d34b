"""Numbers and JSON as a request carries them: one strict reading for every front end.

Python's own readers are too generous for input from the network, and in ways that end in a
500 rather than a refusal: ``int()`` takes Unicode digits (``"٣"`` is 3, while ``"²"`` and
``"①"`` pass ``str.isdigit()`` and then make ``int()`` fail), signs and underscores
(``"+1"``, ``"1_0"``); ``json.loads`` recurses once per nesting level (``RecursionError`` on
a body nested 10,000 deep) and converts any integer literal (``ValueError`` past 4,300
digits). The functions here accept only ASCII decimal digits of bounded length, JSON of
bounded depth and number size, and raise the error class the caller names, so every bad
value becomes the 4xx code that fits where it was found.

Pure functions; thread-safe.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from loghub.errors import LogHubError, PostBodyInvalid

__all__ = [
    "JSON_DEPTH_MAX",
    "JSON_NUMBER_CHARS_MAX",
    "json_bool",
    "json_int",
    "loads_json",
    "parse_decimal",
]

# Deeper than any body of the protocol (a logstore body is 2 levels) by far; well below the
# interpreter's recursion limit.
JSON_DEPTH_MAX = 64
# Longer than any 64-bit number, short enough that converting it costs nothing.
JSON_NUMBER_CHARS_MAX = 40
# An int64 has 19 digits; more is never a count, an offset, a size or a shard id.
_DECIMAL_DIGITS_MAX = 19

_ASCII_DECIMAL = re.compile(r"-?[0-9]+")
_ASCII_DECIMAL_FRACTION = re.compile(r"(-?[0-9]+)\.([0-9]+)")
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKET = re.compile(rb"[\[\]{}]")


def parse_decimal(
    text: str,
    name: str,
    error: type[LogHubError],
    *,
    negative: bool = False,
    digits_max: int = _DECIMAL_DIGITS_MAX,
    fraction: bool = False,
    round_up: bool = False,
) -> int:
    """The integer ``text`` writes in ASCII decimal digits (one leading ``-`` only when
    ``negative``); ``error`` naming ``name`` otherwise. Surrounding blanks are allowed.

    With ``fraction``, a fractional part of ASCII digits is allowed too, as a client that
    formats a float writes it (``"10.0"``): zeros only, or any digits when ``round_up``
    (rounded up). Without it (headers, where no client writes one) ``"1.0"`` is refused.
    """
    if text.isdigit() and text.isascii() and len(text) <= digits_max:
        return int(text)  # the usual case, what the checks below would accept as is
    stripped = text.strip(" \t")
    digits_fraction = "0"
    if fraction and (split := _ASCII_DECIMAL_FRACTION.fullmatch(stripped)) is not None:
        stripped, digits_fraction = split.group(1), split.group(2)
    if (
        _ASCII_DECIMAL.fullmatch(stripped) is None
        or (stripped.startswith("-") and not negative)
        or len(stripped.lstrip("-")) > digits_max
        or len(digits_fraction) > digits_max
        or (digits_fraction.strip("0") and not round_up)
    ):
        raise error(f"{name} must be a decimal integer, not {text[:40]!r}")
    number = int(stripped)
    if digits_fraction.strip("0") and not stripped.startswith("-"):
        number += 1  # round up; a negative's whole part (-2 of -2.5) is already up
    return number


def json_int(
    value: Any,
    name: str,
    error: type[LogHubError],
    *,
    low: int,
    high: int,
    round_up: bool = False,
) -> int:
    """An integer field of a JSON body, within ``low..high``.

    Takes a JSON integer, an integral float (``4.0``: the official SDK computes a consumer
    group's timeout as ``heartbeat_interval * 2``) and a decimal string, ``"4"`` or
    ``"4.0"`` (some SDK versions send numbers as strings). A fractional value is refused, or
    rounded up when ``round_up`` (for a timeout, where more is the safe side). ``true`` is
    not a number.
    """
    number: int
    if isinstance(value, bool):
        raise error(f"{name} must be an integer, not {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and math.isfinite(value):
        if not (value.is_integer() or round_up):
            raise error(f"{name} must be an integer, not {value!r}")
        number = math.ceil(value)
    elif isinstance(value, str):
        number = parse_decimal(
            value, name, error, negative=low < 0, fraction=True, round_up=round_up
        )
    else:
        raise error(f"{name} must be an integer, not {str(value)[:40]!r}")
    if not low <= number <= high:
        raise error(f"{name} must be from {low} to {high}, not {number}")
    return number


def json_bool(value: Any, name: str, error: type[LogHubError]) -> bool:
    """A boolean field of a JSON body: ``true``/``false``, or the strings ``"true"`` and
    ``"false"`` in any case (SDKs that send every value as a string)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise error(f"{name} must be true or false, not {str(value)[:40]!r}")


def loads_json(body: bytes, error: type[LogHubError] = PostBodyInvalid) -> Any:
    """A JSON body, or ``error``: invalid UTF-8 or JSON, nesting deeper than
    ``JSON_DEPTH_MAX``, a number literal longer than ``JSON_NUMBER_CHARS_MAX``, NaN or
    Infinity."""
    _check_depth(body, error)
    try:
        if b"\x00" not in body and _NUMBER_CHARS_RUN.search(body) is None:
            # No run of number characters is longer than the bound, so no number literal
            # is: the parser's own int and float, without a Python call per number (a
            # heartbeat of 1,000 shard ids made 1,000 of them). Not for UTF-16 or UTF-32
            # (json.loads reads them too), whose digits are not adjacent bytes.
            return json.loads(body, parse_constant=_json_constant)
        return json.loads(
            body,
            parse_int=_json_int_literal,
            parse_float=_json_float_literal,
            parse_constant=_json_constant,
        )
    except (ValueError, RecursionError) as exc:
        raise error(f"the body is not valid JSON: {str(exc)[:200]}") from None


def _check_depth(body: bytes, error: type[LogHubError]) -> None:
    # Most bodies have fewer brackets than the limit: nothing to count.
    if body.count(b"[") + body.count(b"{") <= JSON_DEPTH_MAX:
        return
    depth = 0
    for match in _JSON_BRACKET.finditer(_JSON_STRING.sub(b'""', body)):
        depth += 1 if match.group() in (b"[", b"{") else -1
        if depth > JSON_DEPTH_MAX:
            raise error(f"the body is nested deeper than {JSON_DEPTH_MAX} levels")


# A run of the characters a JSON number is made of, longer than a number literal may be (it
# may also be inside a string: then the literal's lengths are checked one by one).
_NUMBER_CHARS_RUN = re.compile(rb"[-+.eE0-9]{%d}" % (JSON_NUMBER_CHARS_MAX + 1))


def _json_int_literal(text: str) -> int:
    if len(text) > JSON_NUMBER_CHARS_MAX:
        raise ValueError(f"a number longer than {JSON_NUMBER_CHARS_MAX} characters")
    return int(text)


def _json_float_literal(text: str) -> float:
    if len(text) > JSON_NUMBER_CHARS_MAX:
        raise ValueError(f"a number longer than {JSON_NUMBER_CHARS_MAX} characters")
    return float(text)


def _json_constant(text: str) -> float:
    raise ValueError(f"{text} is not a JSON number")
