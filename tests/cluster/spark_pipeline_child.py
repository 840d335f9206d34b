"""Runs the reference pipeline (``loghub.pipelines.access_log``) once over a logstore, in a
process of its own, and writes what it computed to a JSON file.

    python spark_pipeline_child.py MASTER REQUEST.json RESULT.json

A process of its own because one JVM holds one SparkContext: the test process may hold the
shared local session, and a standalone master needs a context of its own. The request names
the endpoint, keys, project, logstore, metrics logstore and output directory; the result
holds the metric rows (sorted), the application id, and the executors that ran it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# before the JVM starts: executors and local workers run this interpreter, on loopback
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402

import loghub.spark  # noqa: E402
from loghub.pipelines.access_log import PipelineConfig, read_metrics, start_pipeline  # noqa: E402

RUN_TIMEOUT_S = 240


def session(master: str) -> SparkSession:
    """The same settings for local mode and the standalone cluster, but a cluster's
    application waits for both executors before it plans anything, so that every task runs
    on a worker. Four shuffle partitions: the result does not depend on the number, and the
    default 200 would cost more time than the pipeline itself."""
    builder = (
        SparkSession.builder.master(master)
        .appName("loghub-standalone-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
    )
    if master.startswith("spark://"):
        builder = (
            builder.config("spark.cores.max", "2")
            .config("spark.executor.cores", "1")
            .config("spark.executor.memory", "512m")
            .config("spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1")
            .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
            .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    loghub.spark.register(spark)
    return spark


def main(master: str, request_path: Path, result_path: Path) -> None:
    request = json.loads(request_path.read_text())
    config = PipelineConfig(
        endpoint=request["endpoint"],
        project=request["project"],
        logstore=request["logstore"],
        output_dir=Path(request["output_dir"]),
        metrics_logstore=request["metrics_logstore"],
        access_key_id=request["access_key_id"],
        access_key_secret=request["access_key_secret"],
        available_now=True,
        max_offsets_per_trigger=request["max_offsets_per_trigger"],
    )
    spark = session(master)
    try:
        query = start_pipeline(spark, config)
        try:
            if not query.awaitTermination(RUN_TIMEOUT_S):
                raise SystemExit(f"the pipeline did not finish in {RUN_TIMEOUT_S} s")
            batches = len([p for p in query.recentProgress if p.numInputRows])
        finally:
            query.stop()
        rows = [
            {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.asDict().items()}
            for r in read_metrics(spark, config).collect()
        ]
        context = spark.sparkContext
        executors = [
            e.host()
            for e in context._jsc.sc().statusTracker().getExecutorInfos()  # type: ignore[union-attr]
        ]
        result = {
            "rows": sorted(rows, key=lambda r: (r["window_start"], r["host"], r["path"])),
            "batches": batches,
            "application_id": context.applicationId,
            "executor_hosts": executors,  # the driver's own entry included
        }
    finally:
        spark.stop()
    result_path.write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
