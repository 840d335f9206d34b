"""Deciding when a shard writes too fast for too long and should be split.

Appends report their bytes (``record``); every check (``due``) turns the bytes since the
previous check into a rate per shard. A shard whose rate stays above the limit at every check
for ``sustain_ms`` is due; a single check below the limit starts its clock over, so a burst
does not split a shard. Pure bookkeeping with time passed in; the service does the split.

Thread-safety: ``record`` is called from storage threads and ``due`` from the event loop, so
both hold one lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["AutoSplitMonitor"]

ShardKey = tuple[str, str, int]  # project, logstore, shard id


@dataclass
class _Rate:
    bytes_since_check: int = 0
    above_since_ms: int | None = None


class AutoSplitMonitor:
    def __init__(self, bytes_per_s_max: int, sustain_ms: int) -> None:
        assert bytes_per_s_max > 0 and sustain_ms >= 0
        self.bytes_per_s_max = bytes_per_s_max
        self.sustain_ms = sustain_ms
        self._lock = threading.Lock()
        self._rates: dict[ShardKey, _Rate] = {}
        self._last_check_ms: int | None = None

    def record(self, project: str, logstore: str, shard_id: int, size_bytes: int) -> None:
        key = (project, logstore, shard_id)
        with self._lock:
            rate = self._rates.get(key)
            if rate is None:  # not setdefault: a _Rate made on every write costs the write
                rate = self._rates[key] = _Rate()
            rate.bytes_since_check += size_bytes

    def due(self, now_ms: int) -> list[ShardKey]:
        """Shards over the limit for the whole sustain time; they start over once returned."""
        with self._lock:
            last_ms, self._last_check_ms = self._last_check_ms, now_ms
            if last_ms is None or now_ms <= last_ms:
                for rate in self._rates.values():
                    rate.bytes_since_check = 0
                return []
            elapsed_s = (now_ms - last_ms) / 1000
            due: list[ShardKey] = []
            for key, rate in list(self._rates.items()):
                if rate.bytes_since_check / elapsed_s > self.bytes_per_s_max:
                    if rate.above_since_ms is None:
                        rate.above_since_ms = last_ms
                    if now_ms - rate.above_since_ms >= self.sustain_ms:
                        due.append(key)
                        del self._rates[key]
                        continue
                elif rate.bytes_since_check == 0:
                    del self._rates[key]  # idle: forget it, so the table stays small
                    continue
                else:
                    rate.above_since_ms = None
                rate.bytes_since_check = 0
            return sorted(due)
