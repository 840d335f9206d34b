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

Nothing is lost at the end of a run, but not everything is written yet: the minutes the
watermark has not passed (the newest minute or two of event time) stay in Spark's state until
a later run's logs move the watermark past them. ``RunCounts`` says, from each micro-batch's
observed metrics, how many logs were read, written, skipped, dropped as late, and how many
*wait for the watermark*; the waiting count is carried in ``<output>/watermark.json`` from run
to run. A batch run (``available_now``) with ``flush_at_end`` also writes those open minutes,
provisionally, to ``<output>/flushed/`` (replaced by each such run): the logs they hold are
read again from the logstore, from ``starting_offsets`` up to where the run stopped.
``read_metrics`` returns a flushed minute only until the stream writes that minute for good.

Local mode (``local[*]``) by default; ``master`` names a cluster, whose executors need
``openloghub[spark]`` installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loghub.client import LogHubClient
from loghub.errors import AlreadyExistsError
from loghub.pipelines import SPARK_EXTRA_MISSING, spark_is_missing

try:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.query import StreamingQuery

    import loghub.spark
except ImportError as exc:
    if not spark_is_missing(exc):
        raise
    # installed without the extra: say which one
    raise ModuleNotFoundError(SPARK_EXTRA_MISSING, name=exc.name) from exc

__all__ = [
    "ACCESS_LOG_COLUMNS",
    "METRIC_COLUMNS",
    "PipelineConfig",
    "RunCounts",
    "access_log_metrics",
    "ensure_logstore",
    "host_summary",
    "print_summary",
    "read_metrics",
    "run_counts",
    "run_demo_pipeline",
    "run_pipeline",
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
    flush_at_end: bool = False  # available_now only: write the open minutes to flushed/

    def __post_init__(self) -> None:
        if self.flush_at_end and not self.available_now:
            raise ValueError("flush_at_end applies to a batch run (available_now) only")

    @property
    def metrics_dir(self) -> Path:
        return self.output_dir / "metrics"

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoint"

    @property
    def has_metrics(self) -> bool:
        """Whether any minute was written, for good or flushed."""
        return self.metrics_dir.exists() or self.flushed_dir.exists()

    @property
    def flushed_dir(self) -> Path:
        return self.output_dir / "flushed"

    @property
    def watermark_file(self) -> Path:
        return self.output_dir / "watermark.json"

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
        # Python workers over Unix sockets: over loopback TCP each task waits about 40 ms
        .config("spark.python.unix.domain.socket.enabled", "true")  # (docs/spark.md)
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
    complete = F.col("host").isNotNull() & F.col("path").isNotNull()
    access_logs = access_logs.observe(
        _OBSERVED_INPUT,
        F.count(F.lit(1)).alias("read"),
        F.count(F.when(complete, 1)).alias("accepted"),
    )
    metrics = access_log_metrics(access_logs, config.watermark_delay).observe(
        _OBSERVED_OUTPUT, F.coalesce(F.sum("requests"), F.lit(0)).cast("long").alias("written")
    )
    writer = (
        metrics.writeStream.foreachBatch(_BatchWriter(config))
        .outputMode("append")
        .option("checkpointLocation", str(config.checkpoint_dir))
        .queryName(f"access-log-metrics-{config.logstore}")
    )
    if config.available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{config.trigger_interval_s} seconds").start()


def read_metrics(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    """Every metric row written so far (one per window, host and path), and the flushed rows
    of minutes the stream has not written yet."""
    flushed = spark.read.parquet(str(config.flushed_dir)) if config.flushed_dir.exists() else None
    if not config.metrics_dir.exists() and flushed is not None:
        return flushed  # every minute is still open
    final = spark.read.parquet(str(config.metrics_dir)).drop("batch_id")
    if flushed is None:
        return final
    provisional = flushed.join(final, ["window_start", "host", "path"], "left_anti")
    return final.unionByName(provisional)


_OBSERVED_INPUT = "access_log_input"
_OBSERVED_OUTPUT = "access_log_output"


@dataclass(frozen=True)
class RunCounts:
    """What one run of the pipeline did with the logs it read. ``waiting`` includes logs
    read by earlier runs whose minutes are still open; ``watermark`` is ISO 8601 UTC."""

    read: int  # logs read by this run
    skipped: int  # without a host or path
    written: int  # logs in the minutes written by this run (earlier runs' included)
    late: int  # later than the watermark when they came: dropped
    waiting: int  # in minutes the watermark has not passed yet
    watermark: str | None

    def describe(self) -> str:
        text = f"read {self.read:,} logs; {self.written:,} in minutes written"
        if self.waiting:
            text += (
                f"; {self.waiting:,} wait for the watermark (minutes ending after "
                f"{self.watermark or 'the first log'}), written when newer logs move it"
            )
        if self.late:
            text += f"; {self.late:,} dropped as later than the watermark"
        if self.skipped:
            text += f"; {self.skipped:,} skipped (no host or path)"
        return text


def run_counts(progress: Sequence[Mapping[str, Any]], waiting_before: int = 0) -> RunCounts:
    """The counts of a run from its progress reports (as JSON objects), given the logs
    that were waiting for the watermark when it started. A log that is read and has a host
    and path is written, dropped as late, or waits: so ``waiting`` is what is left."""
    read = accepted = written = late = 0
    watermark = None
    for report in progress:
        observed = report.get("observedMetrics") or {}
        read += int(observed.get(_OBSERVED_INPUT, {}).get("read", 0))
        accepted += int(observed.get(_OBSERVED_INPUT, {}).get("accepted", 0))
        written += int(observed.get(_OBSERVED_OUTPUT, {}).get("written", 0))
        late += sum(int(s.get("numRowsDroppedByWatermark", 0)) for s in report["stateOperators"])
        watermark = (report.get("eventTime") or {}).get("watermark", watermark)
    if watermark == "1970-01-01T00:00:00.000Z":
        watermark = None  # no event time seen yet
    # Never below 0: a run that crashed kept no count, and its replay counts its batches again.
    waiting = max(0, waiting_before + accepted - written - late)
    return RunCounts(read, read - accepted, written, late, waiting, watermark)


def _load_waiting(config: PipelineConfig) -> int:
    try:
        return int(json.loads(config.watermark_file.read_text())["waiting"])
    except FileNotFoundError:
        return 0


def _save_waiting(config: PipelineConfig, counts: RunCounts) -> None:
    """Written after a run ends cleanly; a run that crashed leaves the last count, and its
    replayed batches are counted by the run that replays them."""
    config.output_dir.mkdir(parents=True, exist_ok=True)
    temporary = config.watermark_file.with_suffix(".tmp")
    temporary.write_text(json.dumps({"waiting": counts.waiting, "watermark": counts.watermark}))
    temporary.replace(config.watermark_file)


def _flush(spark: SparkSession, config: PipelineConfig, progress: list[dict[str, Any]]) -> int:
    """Writes the minutes the watermark has not passed, computed from the logs read again
    (``starting_offsets`` up to where the run stopped), to ``flushed/``; returns the number
    of logs in them. Minutes start on whole minutes, so every minute from the watermark's
    is open."""
    ended = [p for p in progress if p.get("sources")]
    if not ended or ended[-1]["sources"][0].get("endOffset") is None:
        return 0
    end_offset = ended[-1]["sources"][0]["endOffset"]
    watermark = (ended[-1].get("eventTime") or {}).get("watermark")
    options = {**config.source_options(), "endingOffsets": json.dumps(end_offset)}
    logs = spark.read.format("loghub").options(**options).load()
    if watermark is not None:
        since_s = int(datetime.fromisoformat(watermark.replace("Z", "+00:00")).timestamp())
        since_s -= since_s % 60
        logs = logs.where(F.col("log_time") >= F.timestamp_seconds(F.lit(since_s)))
    pending = access_log_metrics(logs, config.watermark_delay).persist()
    try:
        pending.write.mode("overwrite").parquet(str(config.flushed_dir))
        total = pending.agg(F.coalesce(F.sum("requests"), F.lit(0))).first()
        return 0 if total is None else int(total[0])
    finally:
        pending.unpersist()


def run_pipeline(
    spark: SparkSession, config: PipelineConfig, console: Console
) -> tuple[RunCounts, int]:
    """Runs the pipeline until it stops (``available_now``) or is interrupted, prints what
    it did with the logs it read, and saves the waiting count; returns the counts and, with
    ``flush_at_end``, the logs in the minutes flushed."""
    waiting_before = _load_waiting(config)
    query = start_pipeline(spark, config)
    console.print(f"started {query.name}; metrics under {config.metrics_dir}")
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    progress = [json.loads(p.json) for p in query.recentProgress]
    counts = run_counts(progress, waiting_before)
    _save_waiting(config, counts)
    console.print(counts.describe())
    flushed = 0
    if config.flush_at_end and counts.waiting:
        flushed = _flush(spark, config, progress)
        console.print(
            f"flushed: {flushed:,} logs in open minutes written provisionally to "
            f"{config.flushed_dir} (the stream writes those minutes for good later)"
        )
    return counts, flushed


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
    flush_at_end: bool = False,
) -> list[dict[str, Any]]:
    """Runs the pipeline once over what the logstore holds (Trigger.AvailableNow), into
    Parquet under ``out_dir`` and the logstore ``<logstore>-metrics``; prints and returns the
    per-host summary of every minute written so far (flushed ones included with
    ``flush_at_end``). The checkpoint under ``out_dir`` makes a second run continue where
    the first stopped."""
    console = console or Console()
    config = PipelineConfig(
        endpoint=endpoint,
        project=project,
        logstore=logstore,
        output_dir=out_dir,
        metrics_logstore=f"{logstore}-metrics",
        available_now=True,
        flush_at_end=flush_at_end,
    )
    ensure_logstore(config, f"{logstore}-metrics")
    console.print(f"[bold]Spark[/bold] pipeline access-log ({master}): reading {logstore}...")
    spark = spark_session(master)
    try:
        run_pipeline(spark, config, console)
        console.print(
            f"metrics in {config.metrics_dir.resolve()} and logstore {config.metrics_logstore}"
        )
        rows = host_summary(read_metrics(spark, config)) if config.has_metrics else []
    finally:
        spark.stop()
    print_summary(rows, console)
    return rows
