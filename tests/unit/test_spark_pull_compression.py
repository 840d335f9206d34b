"""The Spark source's connections cost only what they must: pulls are lz4 wherever the
endpoint is (the server joins the blocks it keeps; an uncompressed reply would make it
decompress them), and a plain-http endpoint builds no TLS context (no Spark session: the
option parser is a pure function)."""

from __future__ import annotations

import ssl

import pytest

from loghub.errors import ParameterInvalid
from loghub.spark._client import RawPullClient
from loghub.spark.options import parse_read_options

BASE = {"project": "p", "logstore": "s"}


@pytest.mark.parametrize(
    "endpoint", ["127.0.0.1:7000", "http://localhost:7000", "http://[::1]:7000", "https://10.0.0.5"]
)
def test_pulls_are_lz4_by_default_loopback_or_not(endpoint: str) -> None:
    options = parse_read_options({**BASE, "endpoint": endpoint}, streaming=False)
    assert options.pull_compression == "lz4"
    auto = {**BASE, "endpoint": endpoint, "pullcompression": "auto"}
    assert parse_read_options(auto, streaming=False).pull_compression == "lz4"


def test_pull_compression_can_be_chosen() -> None:
    loopback = {**BASE, "endpoint": "127.0.0.1:7000"}
    remote = {**BASE, "endpoint": "logs.example"}
    assert parse_read_options({**loopback, "pullcompression": "lz4"}, streaming=True)
    assert (
        parse_read_options({**loopback, "pullcompression": "LZ4"}, streaming=True).pull_compression
        == "lz4"
    )
    assert (
        parse_read_options({**remote, "pullcompression": "none"}, streaming=True).pull_compression
        == ""
    )
    with pytest.raises(ParameterInvalid, match="pullCompression"):
        parse_read_options({**remote, "pullcompression": "gzip"}, streaming=True)


def test_a_plain_http_endpoint_gets_a_client_without_a_tls_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each Spark task opens a client; loading the system's CA bundle for an endpoint that
    speaks no TLS cost each one 50 to 350 ms."""

    def no_tls_context(*args: object, **kwargs: object) -> None:
        raise AssertionError("a TLS context was built for a plain-http endpoint")

    monkeypatch.setattr(ssl, "create_default_context", no_tls_context)
    for endpoint in ("127.0.0.1:7000", "http://logs.example:7000"):
        options = parse_read_options({**BASE, "endpoint": endpoint}, streaming=False)
        options.connection.client_of(RawPullClient).close()
    https = parse_read_options({**BASE, "endpoint": "https://logs.example"}, streaming=False)
    with pytest.raises(AssertionError, match="TLS context"):
        https.connection.client()
