"""The data source over https: a server with a certificate from a CA made by the test, read
and written with `caCert`; without it the query fails on the certificate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import Row, SparkSession
from spark_helpers import PROJECT, LogStore, numbered
from tls_certs import Certificates, make_certificates

from loghub.client import LogHubClient
from loghub.server.config import ServerConfig
from loghub.server.embedded import EmbeddedServer


@pytest.fixture
def certificates(tmp_path: Path) -> Certificates:
    folder = tmp_path / "tls"
    folder.mkdir()
    return make_certificates(folder)


@pytest.fixture
def tls_logstore(tmp_path: Path, certificates: Certificates) -> Iterator[LogStore]:
    config = ServerConfig(
        data_dir=tmp_path / "loghub",
        port=0,
        tls_cert_file=certificates.cert,
        tls_key_file=certificates.key,
    )
    with (
        EmbeddedServer(config) as server,
        LogHubClient(server.endpoint, ca_cert=certificates.ca) as client,
    ):
        client.create_project(PROJECT)
        client.create_logstore(PROJECT, "app", shard_count=2)
        yield LogStore(client, server.endpoint, "app")


def test_read_and_write_over_https_with_the_ca(
    spark: SparkSession, tls_logstore: LogStore, certificates: Certificates
) -> None:
    assert tls_logstore.endpoint.startswith("https://")
    tls_logstore.put(numbered(0, 5), shard_id=0)
    tls_logstore.put(numbered(5, 5), shard_id=1)
    options = tls_logstore.options(caCert=str(certificates.ca))
    rows = spark.read.format("loghub").options(**options).load().collect()
    assert sorted(int(r.contents["n"]) for r in rows) == list(range(10))

    tls_logstore.client.create_logstore(PROJECT, "out", shard_count=1)
    df = spark.createDataFrame([Row(contents={"n": "42"})])
    df.write.format("loghub").options(**options).option("logstore", "out").mode("append").save()
    copied = (
        spark.read.format("loghub").options(**options).option("logstore", "out").load().collect()
    )
    assert [r.contents["n"] for r in copied] == ["42"]


def test_a_query_without_the_ca_fails_on_the_certificate(
    spark: SparkSession, tls_logstore: LogStore
) -> None:
    reader = spark.read.format("loghub").options(**tls_logstore.options())
    with pytest.raises(PySparkException, match="CERTIFICATE_VERIFY_FAILED"):
        reader.load().collect()
