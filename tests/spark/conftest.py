"""One local Spark session for the whole run (a session costs about 10 s), and LogHub servers
on loopback ports, stopped by the tests that start them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Before any JVM starts: workers must run this interpreter (it has pyarrow and loghub), and
# Spark must stay on loopback.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402
from spark_helpers import PROJECT, LogStore  # noqa: E402

import loghub.spark  # noqa: E402
from loghub.client import LogHubClient  # noqa: E402
from loghub.server.config import ServerConfig  # noqa: E402
from loghub.server.embedded import EmbeddedServer  # noqa: E402


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = (
        SparkSession.builder.master("local[2,2]")  # two threads; a failed task is tried twice
        .appName("loghub-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        .config("spark.python.unix.domain.socket.enabled", "true")  # as docs/spark.md advises
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    loghub.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(ServerConfig(data_dir=tmp_path / "loghub", port=0)) as running:
        yield running


@pytest.fixture
def logstore(server: EmbeddedServer) -> Iterator[LogStore]:
    """A project with a two-shard logstore `app`."""
    with LogHubClient(server.endpoint) as client:
        client.create_project(PROJECT)
        client.create_logstore(PROJECT, "app", shard_count=2)
        yield LogStore(client, server.endpoint, "app")
