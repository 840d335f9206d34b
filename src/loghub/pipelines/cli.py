"""`loghub pipeline ...`: the shipped Spark pipelines from the command line.

A typer sub-app; the main `loghub` command mounts it as `pipeline`. Spark is imported only
when a pipeline runs, so `loghub --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from loghub.pipelines import SPARK_EXTRA_MISSING, spark_is_missing

__all__ = ["pipeline_app"]

pipeline_app = typer.Typer(
    no_args_is_help=True, help="Spark pipelines over LogHub (needs openloghub[spark])."
)

Endpoint = Annotated[str, typer.Option(envvar="LOGHUB_ENDPOINT", help="host:port of the server")]
KeyId = Annotated[str, typer.Option(envvar="LOGHUB_ACCESS_KEY_ID", help="access key id")]
KeySecret = Annotated[
    str, typer.Option(envvar="LOGHUB_ACCESS_KEY_SECRET", help="access key secret")
]
Project = Annotated[str, typer.Option("--project", "-p", envvar="LOGHUB_PROJECT")]


@pipeline_app.command("access-log")
def access_log(
    logstore: Annotated[str, typer.Argument(help="the logstore of web access logs")],
    project: Project,
    output_dir: Annotated[
        Path, typer.Option(help="Parquet metrics (metrics/) and the checkpoint (checkpoint/)")
    ] = Path("access-log-pipeline"),
    metrics_logstore: Annotated[
        str | None,
        typer.Option(
            help="logstore for the metrics (created if missing); default <logstore>-metrics"
        ),
    ] = None,
    parquet_only: Annotated[bool, typer.Option(help="write no metrics logstore")] = False,
    master: Annotated[
        str, typer.Option(help="Spark master: local[*] or a cluster URL")
    ] = "local[*]",
    starting_offsets: Annotated[
        str, typer.Option(help="earliest, latest, unix seconds, ISO time or per-shard JSON")
    ] = "earliest",
    watermark: Annotated[str, typer.Option(help="how late a log may arrive")] = "1 minute",
    trigger_seconds: Annotated[float, typer.Option(help="micro-batch interval")] = 10.0,
    available_now: Annotated[
        bool, typer.Option(help="process what the logstore holds now, then stop")
    ] = False,
    max_offsets_per_trigger: Annotated[
        int | None, typer.Option(help="log groups per micro-batch at most")
    ] = None,
    flush: Annotated[
        bool,
        typer.Option(
            help="with --available-now: at the end, also write the minutes the watermark has"
            " not passed (provisionally, to <output-dir>/flushed/)"
        ),
    ] = False,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Per-minute request counts by status class, bytes, and p50/p95/p99 latency per host
    and path, from a logstore of web access logs; to Parquet and back into a logstore."""
    console = Console(stderr=True)
    try:
        from loghub.pipelines.access_log import (
            PipelineConfig,
            ensure_logstore,
            host_summary,
            print_summary,
            read_metrics,
            run_pipeline,
            spark_session,
        )
    except ImportError as exc:
        if not spark_is_missing(exc):
            raise
        console.print(f"error: {SPARK_EXTRA_MISSING}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    if flush and not available_now:
        raise typer.BadParameter("--flush needs --available-now (a run that ends by itself)")
    config = PipelineConfig(
        endpoint=endpoint,
        project=project,
        logstore=logstore,
        output_dir=output_dir,
        metrics_logstore=None if parquet_only else (metrics_logstore or f"{logstore}-metrics"),
        access_key_id=access_key_id,
        access_key_secret=access_key_secret,
        starting_offsets=starting_offsets,
        watermark_delay=watermark,
        trigger_interval_s=trigger_seconds,
        available_now=available_now,
        max_offsets_per_trigger=max_offsets_per_trigger,
        flush_at_end=flush,
    )
    if config.metrics_logstore:
        ensure_logstore(config, config.metrics_logstore)
    spark = spark_session(master)
    try:
        console.print(f"Spark master {master}")
        run_pipeline(spark, config, console)
        if config.has_metrics:
            print_summary(host_summary(read_metrics(spark, config)), Console())
    finally:
        spark.stop()
