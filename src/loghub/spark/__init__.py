"""The `loghub` PySpark data source: batch and streaming reads of a logstore, and sinks.

    import loghub.spark
    loghub.spark.register(spark)
    df = (spark.readStream.format("loghub")
          .option("endpoint", "127.0.0.1:8080").option("project", "web")
          .option("logstore", "access").load())

Registration is per SparkSession, and the executors import this package by name, so it must
be installed where they run (``pip install openloghub[spark]``). Options, schema, offsets and
guarantees: docs/spark.md. Needs pyspark 4.2 or later (read limits and AvailableNow for
Python sources).
"""

from __future__ import annotations

try:
    from pyspark.sql import SparkSession
except ModuleNotFoundError as exc:  # installed without the extra: say which one
    raise ModuleNotFoundError(
        "loghub.spark needs PySpark and PyArrow, which come with the spark extra:"
        " pip install 'openloghub[spark]'",
        name=exc.name,
    ) from exc

from loghub.spark.source import LogHubDataSource

__all__ = ["LogHubDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Makes ``format("loghub")`` available in ``spark`` (and only there: registration does
    not carry over to ``spark.newSession()``)."""
    spark.dataSource.register(LogHubDataSource)
