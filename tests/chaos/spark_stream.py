"""The chaos run's Spark stream, in a process of its own so the fault driver can SIGKILL it
and start it again from its checkpoint:

    python spark_stream.py ENDPOINT PROJECT LOGSTORE OUT CHECKPOINT

A Structured Streaming query (pyspark local mode, the `loghub` source registered with
`loghub.spark.register`) from the logstore into Parquet files, a trigger a second, until
killed. The file sink commits each batch once, so the checker expects no duplicates there.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402

import loghub.spark  # noqa: E402


def main() -> None:
    endpoint, project, logstore, out, checkpoint = sys.argv[1:6]
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("loghub-chaos")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.driver.memory", "512m")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    loghub.spark.register(spark)
    source = (
        spark.readStream.format("loghub")
        .option("endpoint", endpoint)
        .option("project", project)
        .option("logstore", logstore)
        .option("accessKeyId", "ak")
        .option("accessKeySecret", "sk")
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        source.select("contents")
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    query.awaitTermination()  # until killed, or until the query fails (then the driver restarts it)


if __name__ == "__main__":
    main()
