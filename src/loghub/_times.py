"""Times as people write them on a command line: epoch seconds (``1700000000``, fractions
allowed), ISO 8601 (``2026-11-25T10:00:00``, UTC when no offset is given; ``+08:00`` and
``Z`` taken), relative to now (``-30s``, ``-15m``, ``-2h``, ``-1d``), or ``now``. One parser
for every command that takes a time, so they all take the same spellings.

Pure functions; ``now_s`` is passed in.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

__all__ = ["parse_time_s", "start_position"]

_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_RELATIVE = re.compile(r"-(\d{1,9})([smhd])")
_EPOCH = re.compile(r"\d{1,12}(\.\d{1,9})?")


def parse_time_s(text: str, now_s: float) -> float:
    """Epoch seconds from any accepted spelling; ValueError naming all three otherwise."""
    text = text.strip()
    if text == "now":
        return now_s
    if _EPOCH.fullmatch(text):
        return float(text)
    relative = _RELATIVE.fullmatch(text)
    if relative:
        return now_s - int(relative.group(1)) * _UNIT_S[relative.group(2)]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: give epoch seconds, ISO 8601 or -15m/-2h/-1d"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def start_position(text: str, now_s: float) -> str:
    """A start for GetCursor: ``begin``, ``end``, or any accepted time spelling turned into
    the whole epoch seconds the protocol takes."""
    if text in ("begin", "end"):
        return text
    return str(int(parse_time_s(text, now_s)))
