"""The reference pipeline computes what a plain Python loop computes from the same logs."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from spark_helpers import PROJECT, LogStore

from loghub.demo import access_logs
from loghub.pipelines.access_log import PipelineConfig, read_metrics, start_pipeline
from loghub.wire.logs import make_log_group

START_S = 1_700_000_030  # mid-minute, so the first window is partial
DELAY_S = 60


def _percentile(values: list[float], fraction: float) -> float:
    """percentile_approx on fewer values than its accuracy: the smallest value with at least
    `fraction` of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def _expected(logs: list[tuple[int, dict[str, str]]]) -> dict[tuple[int, str, str], dict[str, Any]]:
    watermark_s = max(t for t, _ in logs) - DELAY_S
    groups: dict[tuple[int, str, str], list[dict[str, str]]] = defaultdict(list)
    for time_s, fields in logs:
        groups[(time_s // 60 * 60, fields["host"], fields["path"])].append(fields)
    expected = {}
    for (window_s, host, path), items in groups.items():
        if window_s + 60 > watermark_s:
            continue  # the watermark has not passed the window's end: not emitted yet
        latencies = [float(f["latency_ms"]) for f in items]
        classes = [int(f["status"]) // 100 for f in items]
        expected[(window_s, host, path)] = {
            "requests": len(items),
            **{f"status_{d}xx": classes.count(d) for d in range(1, 6)},
            "bytes": sum(int(f["bytes"]) for f in items),
            **{f"latency_p{p}_ms": _percentile(latencies, p / 100) for p in (50, 95, 99)},
        }
    return expected


def test_pipeline_output_equals_a_plain_python_computation(
    spark: SparkSession, logstore: LogStore, tmp_path: Path
) -> None:
    logs = list(access_logs(4000, seed=11, start_s=START_S))
    for i in range(0, len(logs), 100):
        group = make_log_group(logs[i : i + 100], topic="access")
        logstore.client.put_log_group(PROJECT, "app", group, shard_id=(i // 100) % 2)
    logstore.client.create_logstore(PROJECT, "app-metrics", shard_count=1)
    config = PipelineConfig(
        endpoint=logstore.endpoint,
        project=PROJECT,
        logstore="app",
        output_dir=tmp_path / "pipeline",
        metrics_logstore="app-metrics",
        available_now=True,
        max_offsets_per_trigger=10,  # four micro-batches: the state carries across them
    )
    query = start_pipeline(spark, config)
    try:
        assert query.awaitTermination(180)
        assert len([p for p in query.recentProgress if p["numInputRows"]]) == 4
    finally:
        query.stop()
    rows = read_metrics(spark, config).collect()
    got = {
        (int(r.window_start.timestamp()), r.host, r.path): {
            k: v
            for k, v in r.asDict().items()
            if k not in ("window_start", "window_end", "host", "path")
        }
        for r in rows
    }
    assert len(rows) == len(got)
    expected = _expected(logs)
    assert got == expected
    copied = (
        spark.read.format("loghub")
        .options(**logstore.options())
        .option("logstore", "app-metrics")
        .load()
    )
    assert copied.count() == len(expected)
