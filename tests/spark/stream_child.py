"""A streaming query from a LogHub logstore into a Parquet sink, as a process of its own, for
the crash test: `python stream_child.py ENDPOINT LOGSTORE OUT CHECKPOINT`.

It runs a one-second-trigger query, six log groups a batch, until the process is killed.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402

import loghub.spark  # noqa: E402


def main() -> None:
    endpoint, logstore, out, checkpoint = sys.argv[1:5]
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("loghub-crash-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    loghub.spark.register(spark)
    source = (
        spark.readStream.format("loghub")
        .option("endpoint", endpoint)
        .option("project", "spark")
        .option("logstore", logstore)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "6")
        .load()
    )
    query = (
        source.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    query.awaitTermination()  # until killed


if __name__ == "__main__":
    main()
