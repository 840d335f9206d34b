"""FakeClock: time that moves only when a test says so.

Storage and coordination take a ``Clock``; a simulation hands them a ``FakeClock`` and calls
``advance(ms)``, so a run is exactly reproducible and takes no real time.
"""

from __future__ import annotations

import threading

__all__ = ["FakeClock"]


class FakeClock:
    """Thread-safe. Monotonic time starts at 0; wall time starts at ``wall_start_ms``."""

    def __init__(self, wall_start_ms: int = 1_700_000_000_000) -> None:
        self._lock = threading.Lock()
        self._elapsed_ms = 0
        self._wall_start_ms = wall_start_ms

    def monotonic_ms(self) -> int:
        with self._lock:
            return self._elapsed_ms

    def wall_ms(self) -> int:
        with self._lock:
            return self._wall_start_ms + self._elapsed_ms

    def advance(self, ms: int) -> None:
        assert ms >= 0, "time never goes back"
        with self._lock:
            self._elapsed_ms += ms
