"""Time as an argument.

Storage and coordination never read the time themselves: they are handed a ``Clock``, so a
simulation can drive them with ``loghub.testing.FakeClock`` and replay a run exactly.
``monotonic_ms`` is for durations and timeouts (never goes back); ``wall_ms`` is for what is
stored or shown (receive times, checkpoints' update times).
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    def monotonic_ms(self) -> int: ...

    def wall_ms(self) -> int: ...


class SystemClock:
    """The real clock. Thread-safe (stateless)."""

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000
