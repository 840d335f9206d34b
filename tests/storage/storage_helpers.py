"""Helpers for the storage tests (imported by name: tests/storage is on sys.path)."""

from __future__ import annotations

from loghub.storage import StorageConfig


class FakeClock:
    """A clock that moves only when told to (loghub.testing has none yet)."""

    def __init__(self, wall_ms: int = 1_700_000_000_000) -> None:
        self._wall_ms = wall_ms
        self._monotonic_ms = 0

    def monotonic_ms(self) -> int:
        return self._monotonic_ms

    def wall_ms(self) -> int:
        return self._wall_ms

    def advance(self, ms: int) -> None:
        self._wall_ms += ms
        self._monotonic_ms += ms


# Small segments and a dense index so that a few records span several segments.
SMALL = StorageConfig(segment_bytes_max=256, index_interval_bytes=64, payload_bytes_max=4096)


def payload(index: int, size: int | None = None) -> bytes:
    """A recognisable payload: ``size`` bytes (default: 10 + index % 37) naming ``index``."""
    size = 10 + index % 37 if size is None else size
    stamp = f"<{index}>".encode()
    return (stamp * (size // len(stamp) + 1))[:size]
