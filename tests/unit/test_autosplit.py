"""When a shard is due for an auto-split: over the limit at every check for the whole time."""

from __future__ import annotations

from loghub.server.autosplit import AutoSplitMonitor


def _drive(
    monitor: AutoSplitMonitor, rates_per_check: list[int], interval_ms: int = 1000
) -> list[list[tuple[str, str, int]]]:
    now_ms = 0
    monitor.due(now_ms)
    results = []
    for rate in rates_per_check:
        monitor.record("p", "ls", 0, rate * interval_ms // 1000)
        now_ms += interval_ms
        results.append(monitor.due(now_ms))
    return results


def test_a_shard_over_the_limit_for_the_sustain_time_is_due_once() -> None:
    monitor = AutoSplitMonitor(bytes_per_s_max=1000, sustain_ms=3000)
    results = _drive(monitor, [5000, 5000, 5000, 5000])
    assert results == [[], [], [("p", "ls", 0)], []]


def test_one_check_under_the_limit_starts_the_clock_over() -> None:
    monitor = AutoSplitMonitor(bytes_per_s_max=1000, sustain_ms=2000)
    results = _drive(monitor, [5000, 500, 5000, 5000, 5000])
    assert results == [[], [], [], [("p", "ls", 0)], []]


def test_a_burst_shorter_than_the_sustain_time_is_not_due() -> None:
    monitor = AutoSplitMonitor(bytes_per_s_max=1000, sustain_ms=5000)
    assert _drive(monitor, [50_000, 50_000, 0, 0]) == [[], [], [], []]


def test_shards_are_measured_apart() -> None:
    monitor = AutoSplitMonitor(bytes_per_s_max=1000, sustain_ms=1000)
    monitor.due(0)
    monitor.record("p", "ls", 0, 5000)
    monitor.record("p", "ls", 1, 10)
    assert monitor.due(1000) == [("p", "ls", 0)]
