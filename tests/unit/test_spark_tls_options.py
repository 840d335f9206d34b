"""The Spark data source's TLS options: parsed up front and handed to every client it opens
(no Spark session: the option parser is a pure function)."""

from __future__ import annotations

import pytest

from loghub.errors import ParameterInvalid, TransportError
from loghub.spark._client import RawPullClient
from loghub.spark.options import parse_read_options, parse_write_options

BASE = {"project": "p", "logstore": "s"}


def test_an_https_endpoint_with_a_ca_bundle_reaches_the_connection() -> None:
    options = {**BASE, "endpoint": "https://logs.example:8443", "cacert": "/etc/ca.pem"}
    for parsed in (
        parse_read_options(options, streaming=False).connection,
        parse_write_options(options).connection,
    ):
        assert parsed.endpoint == "https://logs.example:8443"
        assert parsed.ca_cert == "/etc/ca.pem"
        assert parsed.tls_verify


def test_tls_verification_can_be_turned_off_for_https_only() -> None:
    options = {**BASE, "endpoint": "https://127.0.0.1:1", "tlsverify": "false"}
    assert not parse_read_options(options, streaming=True).connection.tls_verify
    with pytest.raises(ParameterInvalid, match="only to an https:// endpoint"):
        parse_read_options({**options, "endpoint": "127.0.0.1:1"}, streaming=True)
    with pytest.raises(ParameterInvalid, match="tlsVerify must be true or false"):
        parse_read_options({**options, "tlsverify": "maybe"}, streaming=True)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"endpoint": "ftp://127.0.0.1:1"}, "host:port or http"),
        ({"endpoint": "127.0.0.1:1", "cacert": "/etc/ca.pem"}, "only to an https:// endpoint"),
    ],
)
def test_bad_tls_options_are_named(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ParameterInvalid, match=message):
        parse_write_options({**BASE, **extra})


def test_the_clients_the_source_and_sink_open_carry_the_ca() -> None:
    options = {**BASE, "endpoint": "https://127.0.0.1:1", "cacert": "/nonexistent/ca.pem"}
    connection = parse_read_options(options, streaming=False).connection
    # the bundle is loaded when the client is made: a missing one fails there, by name
    for make in (connection.client, lambda: connection.client_of(RawPullClient)):
        with pytest.raises(TransportError, match="cannot load the CA bundle /nonexistent/ca.pem"):
            make()
