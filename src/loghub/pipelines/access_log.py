"""The reference pipeline: per-minute metrics of web access logs, streamed out of LogHub.

    logstore (host, method, path, status, bytes, latency_ms, ...)
      -> readStream.format("loghub") with typed content columns
      -> watermark on the log's own time (late logs beyond the delay are dropped)
      -> per minute of event time, host and path: requests, requests by status class,
         bytes, and p50/p95/p99 latency (percentile_approx, exact below 10,000 values)
      -> foreachBatch: Parquet under <output>/metrics/batch_id=<n>, and back into a logstore

A minute is written once the watermark (the newest log time seen, minus the delay) passes its
end: output mode append, so every row is final. The Parquet output is exactly once: each
micro-batch overwrites its own ``batch_id=<n>`` directory, so a batch replayed after a crash
replaces what its first attempt wrote. The copy in the metrics logstore is at least once (a
replayed batch writes its rows again; ``(window_start, host, path)`` identifies a row).

Local mode (``local[*]``) by default; ``master`` names a cluster, whose executors need
``openloghub[spark]`` installed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from rich.console import Console
from rich.table import Table

import loghub.spark
from loghub.client import LogHubClient
from loghub.errors import AlreadyExistsError

__all__ = [
    "ACCESS_LOG_COLUMNS",
    "METRIC_COLUMNS",
    "PipelineConfig",
    "access_log_metrics",
    "ensure_logstore",
    "host_summary",
    "print_summary",
    "read_metrics",
    "run_demo_pipeline",
    "spark_session",
    "start_pipeline",
]

ACCESS_LOG_COLUMNS = (
    "host string, method string, path string, status int, bytes bigint, latency_ms double"
)
"""The content keys the pipeline reads, as the source's ``contentColumns`` option."""

METRIC_COLUMNS = (
    "window_start",
    "window_end",
    "host",
    "path",
    "requests",
    "status_1xx",
    "status_2xx",
    "status_3xx",
    "status_4xx",
    "status_5xx",
    "bytes",
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
)
PERCENTILE_ACCURACY = 10_000  # percentile_approx is exact for fewer values than this


@dataclass(frozen=True)
class PipelineConfig:
    endpoint: str
    project: str
    logstore: str
    output_dir: Path
    metrics_logstore: str | None = None  # None: Parquet only
    access_key_id: str = ""
    access_key_secret: str = ""
    starting_offsets: str = "earliest"
    watermark_delay: str = "1 minute"
    trigger_interval_s: float = 10.0
    available_now: bool = False  # read what is there, then stop
    max_offsets_per_trigger: int | None = None

    @property
    def metrics_dir(self) -> Path:
        return self.output_dir / "metrics"

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoint"

    def source_options(self) -> dict[str, str]:
        options = {
            "endpoint": self.endpoint,
            "project": self.project,
            "logstore": self.logstore,
            "startingOffsets": self.starting_offsets,
            "contentColumns": ACCESS_LOG_COLUMNS,
        }
        if self.access_key_id:
            options["accessKeyId"] = self.access_key_id
            options["accessKeySecret"] = self.access_key_secret
        if self.max_offsets_per_trigger is not None:
            options["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        return options


def spark_session(master: str = "local[*]", app_name: str = "loghub-access-log") -> SparkSession:
    """A session for the pipeline, with the `loghub` source registered. In local mode the
    workers run this interpreter and Spark stays on loopback."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # In local mode one state-store partition per core; the checkpoint keeps this number.
    partitions = str(os.cpu_count() or 2) if master.startswith("local") else "200"
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", partitions)
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    loghub.spark.register(spark)
    return spark


def _status_class(status: Column, digit: int) -> Column:
    return F.sum(F.when(F.floor(status / 100) == digit, 1).otherwise(0)).cast("long")


def access_log_metrics(access_logs: DataFrame, watermark_delay: str = "1 minute") -> DataFrame:
    """Per-minute metrics of a DataFrame from the `loghub` source read with
    ``contentColumns=ACCESS_LOG_COLUMNS`` (batch or streaming)."""
    percentiles = F.percentile_approx(
        "latency_ms", F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99)), PERCENTILE_ACCURACY
    )
    metrics = (
        access_logs.where(F.col("host").isNotNull() & F.col("path").isNotNull())
        .withWatermark("log_time", watermark_delay)
        .groupBy(F.window("log_time", "1 minute"), "host", "path")
        .agg(
            F.count(F.lit(1)).alias("requests"),
            *[_status_class(F.col("status"), d).alias(f"status_{d}xx") for d in range(1, 6)],
            F.coalesce(F.sum("bytes"), F.lit(0)).cast("long").alias("bytes"),
            percentiles.alias("latency"),
        )
    )
    return metrics.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "host",
        "path",
        "requests",
        *[f"status_{d}xx" for d in range(1, 6)],
        "bytes",
        *[F.col("latency")[i].alias(f"latency_p{p}_ms") for i, p in enumerate((50, 95, 99))],
    )


class _BatchWriter:
    """foreachBatch: Parquet per batch id (idempotent), then the metrics logstore."""

    def __init__(self, config: PipelineConfig) -> None:
        self._config = config

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        batch = batch.persist()  # computed once (count) for both writes
        try:
            if batch.count() == 0:
                return
            target = self._config.metrics_dir / f"batch_id={batch_id}"
            batch.write.mode("overwrite").parquet(str(target))
            if self._config.metrics_logstore:
                options = {
                    **self._config.source_options(),
                    "logstore": self._config.metrics_logstore,
                }
                (
                    batch.withColumn("log_time", F.col("window_start"))
                    .withColumn("topic", F.lit("access-log-metrics"))
                    .write.format("loghub")
                    .options(**_connection_options(options))
                    .mode("append")
                    .save()
                )
        finally:
            batch.unpersist()


def _connection_options(options: dict[str, str]) -> dict[str, str]:
    keys = ("endpoint", "project", "logstore", "accessKeyId", "accessKeySecret")
    return {key: value for key, value in options.items() if key in keys}


def start_pipeline(spark: SparkSession, config: PipelineConfig) -> StreamingQuery:
    """Starts the streaming query; with ``available_now`` it stops by itself when it has
    read what the logstore held at the start."""
    access_logs = spark.readStream.format("loghub").options(**config.source_options()).load()
    writer = (
        access_log_metrics(access_logs, config.watermark_delay)
        .writeStream.foreachBatch(_BatchWriter(config))
        .outputMode("append")
        .option("checkpointLocation", str(config.checkpoint_dir))
        .queryName(f"access-log-metrics-{config.logstore}")
    )
    if config.available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{config.trigger_interval_s} seconds").start()


def read_metrics(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    """Every metric row written so far (one per window, host and path)."""
    return spark.read.parquet(str(config.metrics_dir)).drop("batch_id")


def host_summary(metrics: DataFrame) -> list[dict[str, Any]]:
    """A short table: per host, minutes, requests, errors (4xx + 5xx), bytes, worst p99."""
    rows = (
        metrics.groupBy("host")
        .agg(
            F.countDistinct("window_start").alias("minutes"),
            F.sum("requests").alias("requests"),
            F.sum(F.col("status_4xx") + F.col("status_5xx")).alias("errors"),
            F.sum("bytes").alias("bytes"),
            F.max("latency_p99_ms").alias("worst_p99_ms"),
        )
        .orderBy("host")
        .collect()
    )
    return [row.asDict() for row in rows]


def ensure_logstore(config: PipelineConfig, name: str, shard_count: int = 1) -> None:
    """Creates the logstore ``name`` in the pipeline's project unless it exists."""
    client = LogHubClient(config.endpoint, config.access_key_id, config.access_key_secret)
    with client, contextlib.suppress(AlreadyExistsError):
        client.create_logstore(config.project, name, shard_count=shard_count)


def print_summary(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="access-log pipeline: per host, over the minutes written so far")
    for name in ("host", "minutes", "requests", "errors", "bytes", "worst p99 ms"):
        table.add_column(name, justify="left" if name == "host" else "right")
    for row in rows:
        table.add_row(
            str(row["host"]),
            str(row["minutes"]),
            f"{row['requests']:,}",
            f"{row['errors']:,}",
            f"{row['bytes']:,}",
            f"{row['worst_p99_ms']:.1f}",
        )
    console.print(table)


def run_demo_pipeline(
    endpoint: str,
    project: str,
    logstore: str,
    out_dir: Path,
    *,
    master: str = "local[*]",
    console: Console | None = None,
) -> list[dict[str, Any]]:
    """Runs the pipeline once over what the logstore holds (Trigger.AvailableNow), into
    Parquet under ``out_dir`` and the logstore ``<logstore>-metrics``; prints and returns the
    per-host summary of every minute written so far. The checkpoint under ``out_dir`` makes a
    second run continue where the first stopped."""
    console = console or Console()
    config = PipelineConfig(
        endpoint=endpoint,
        project=project,
        logstore=logstore,
        output_dir=out_dir,
        metrics_logstore=f"{logstore}-metrics",
        available_now=True,
    )
    ensure_logstore(config, f"{logstore}-metrics")
    console.print(f"[bold]Spark[/bold] pipeline access-log ({master}): reading {logstore}...")
    spark = spark_session(master)
    try:
        query = start_pipeline(spark, config)
        query.awaitTermination()
        batches = [p for p in query.recentProgress if p["numInputRows"]]
        read = sum(p["numInputRows"] for p in batches)
        console.print(
            f"read {read:,} logs in {len(batches)} micro-batches; metrics in "
            f"{config.metrics_dir.resolve()} and logstore {config.metrics_logstore}"
        )
        rows = host_summary(read_metrics(spark, config)) if config.metrics_dir.exists() else []
    finally:
        spark.stop()
    print_summary(rows, console)
    return rows
