"""Hash-key math: the 128-bit key space that shards divide between them.

A logstore's shards cover ``[0, 2**128)`` with half-open ranges, the MD5 space LogHub uses.
Keys travel as 32 lowercase hex digits. The one exception is the end of the space: ``2**128``
needs 33 hex digits, so, as the hosted service does, the last shard's ``exclusiveEndKey`` is
written as 32 ``f``. A routed key equal to ``ffff...ff`` is still inside the last shard, because
internally the end is ``2**128`` and every key is below it.

Pure functions; thread-safe.
"""

from __future__ import annotations

import hashlib
import re

from loghub.errors import ParameterInvalid

__all__ = [
    "KEY_HEX_DIGITS",
    "KEY_SPACE_END",
    "even_ranges",
    "format_hash_key",
    "md5_hash_key",
    "parse_hash_key",
]

KEY_HEX_DIGITS = 32
KEY_SPACE_END = 2**128

_HEX_KEY = re.compile(r"[0-9a-fA-F]{1,32}")
_KEY_SPACE_END_TEXT = "f" * KEY_HEX_DIGITS


def parse_hash_key(text: str) -> int:
    """A key from its hex form. Producers may send fewer than 32 digits; like the hosted
    service, the key is right-padded with zeros (``"8"`` is the middle of the space)."""
    if _HEX_KEY.fullmatch(text) is None:
        raise ParameterInvalid(f"hash key must be 1 to 32 hex digits, got {text!r}")
    return int(text.ljust(KEY_HEX_DIGITS, "0"), 16)


def format_hash_key(value: int) -> str:
    """The 32-digit lowercase hex form; ``KEY_SPACE_END`` is written as 32 ``f``."""
    assert 0 <= value <= KEY_SPACE_END, value
    if value == KEY_SPACE_END:
        return _KEY_SPACE_END_TEXT
    return f"{value:032x}"


def even_ranges(shard_count: int) -> list[tuple[int, int]]:
    """``shard_count`` half-open ranges of (almost) equal width that cover the key space
    exactly: each range starts where the previous one ends, so no key is lost to rounding."""
    assert shard_count >= 1, shard_count
    bounds = [i * KEY_SPACE_END // shard_count for i in range(shard_count + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def md5_hash_key(text: str) -> int:
    """The MD5 of a string (UTF-8) as a key: how producers turn a field into a hash key."""
    return int.from_bytes(hashlib.md5(text.encode("utf-8")).digest(), "big")
