"""The access-log pipeline says what it did with every log it read, from its progress
reports: written, dropped as late, skipped, or waiting for the watermark (pure: no Spark
session is started)."""

from __future__ import annotations

from typing import Any

import pytest

from loghub.pipelines.access_log import PipelineConfig, RunCounts, run_counts


def _report(
    read: int, accepted: int, written: int, late: int = 0, watermark: str | None = None
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "observedMetrics": {
            "access_log_input": {"read": read, "accepted": accepted},
            "access_log_output": {"written": written},
        },
        "stateOperators": [{"numRowsTotal": 3, "numRowsDroppedByWatermark": late}],
        "eventTime": {} if watermark is None else {"watermark": watermark},
    }
    return report


def test_logs_in_open_minutes_are_reported_as_waiting_for_the_watermark() -> None:
    """The demo's case: 20,000 logs read, the newest minutes not yet written."""
    progress = [
        _report(12_000, 12_000, 10_000, watermark="2026-11-25T03:10:30.000Z"),
        _report(8_000, 8_000, 8_540, watermark="2026-11-25T03:14:12.000Z"),
        _report(0, 0, 0, watermark="2026-11-25T03:14:12.000Z"),  # the no-data batch
    ]
    counts = run_counts(progress)
    assert counts == RunCounts(
        read=20_000,
        skipped=0,
        written=18_540,
        late=0,
        waiting=1_460,
        watermark="2026-11-25T03:14:12.000Z",
    )
    assert "1,460 wait for the watermark" in counts.describe()
    assert "18,540 in minutes written" in counts.describe()


def test_waiting_logs_carry_over_to_the_run_that_writes_their_minutes() -> None:
    first = run_counts([_report(100, 100, 70)])
    second = run_counts([_report(10, 10, 40)], waiting_before=first.waiting)
    assert (first.waiting, second.waiting) == (30, 0)
    assert "wait for the watermark" not in second.describe()


def test_late_and_skipped_logs_are_not_waiting() -> None:
    counts = run_counts([_report(100, 90, 60, late=5)])
    assert (counts.skipped, counts.late, counts.waiting) == (10, 5, 25)
    assert "5 dropped as later than the watermark" in counts.describe()
    assert "10 skipped (no host or path)" in counts.describe()


def test_a_batch_with_no_observed_metrics_counts_nothing() -> None:
    empty = {"stateOperators": [], "eventTime": {"watermark": "1970-01-01T00:00:00.000Z"}}
    assert run_counts([empty], waiting_before=7) == RunCounts(0, 0, 0, 0, 7, None)


def test_flush_applies_to_a_run_that_ends_by_itself(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="available_now"):
        PipelineConfig("127.0.0.1:1", "p", "ls", tmp_path, flush_at_end=True)
    config = PipelineConfig(
        "127.0.0.1:1", "p", "ls", tmp_path, available_now=True, flush_at_end=True
    )
    assert config.flushed_dir == tmp_path / "flushed"
