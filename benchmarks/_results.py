"""One format for every benchmark's figures: ``benchmarks/results/<name>.json``.

Each benchmark script prints its figures for a reader and also saves them here, so that
``benchmarks/report.py`` can write ``BENCHMARKS.md`` (tables and charts) from the files of
one ``make bench`` run. A figure is never a single number: a benchmark repeats its case and
keeps every run, and a figure that has a reference (Redis, NATS JetStream, the official SDK,
``spark.read.parquet``, the disk) carries the reference's runs from the same process, so the
report can give the ratio of medians, which holds on a noisy machine where absolute times do
not.

    rows = [Row("ingest 200 B x 4096", "logs/s", [912_000, 955_000, 940_000],
                reference=Reference("Redis XADD, in memory", [480_000, 470_000, 492_000]))]
    save("ingest", "Durable ingest", rows, notes=["fsync always, 4 producers"])

``higher_is_better`` says which way a ratio is good (latencies and fds: lower).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# Where save() writes instead, when set: the smoke test of `make test` keeps the figures of a
# real run in place this way.
RESULTS_DIR_ENV = "LOGHUB_BENCH_RESULTS_DIR"


def results_dir() -> Path:
    return Path(os.environ.get(RESULTS_DIR_ENV) or RESULTS_DIR)


@dataclass(frozen=True)
class Reference:
    name: str
    values: list[float]


@dataclass(frozen=True)
class Row:
    case: str  # what was measured, e.g. "16 logs/request, 32 connections"
    metric: str  # e.g. "logs/s", "p99 ms", "ms CPU/heartbeat"
    values: list[float]  # one per run
    reference: Reference | None = None
    higher_is_better: bool = True
    goal: str = ""  # the target, as text: "≥ 2× Redis in memory", "≤ 20 ms"
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. server CPU per request

    def ratio(self) -> float | None:
        """Median of the runs over the reference's median (None without a reference)."""
        if self.reference is None or not self.reference.values or not self.values:
            return None
        reference = statistics.median(self.reference.values)
        return statistics.median(self.values) / reference if reference else None


def summary(values: list[float]) -> dict[str, float]:
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "runs": len(values),
    }


def save(name: str, title: str, rows: list[Row], notes: list[str] | None = None) -> Path:
    """Writes ``results/<name>.json`` (replacing the last run's) and returns its path."""
    from _common import machine_summary  # the scripts put benchmarks/ on sys.path

    directory = results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "title": title,
        "machine": machine_summary(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "notes": notes or [],
        "rows": [
            {
                **asdict(row),
                "summary": summary(row.values) if row.values else None,
                "reference_summary": (
                    summary(row.reference.values)
                    if row.reference is not None and row.reference.values
                    else None
                ),
                "ratio": row.ratio(),
            }
            for row in rows
        ],
    }
    path = directory / f"{name}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path
