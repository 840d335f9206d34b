"""`loghub serve --tls-cert --tls-key`: our client, the CLI and the official SDK over https.

The test makes its own certificate authority and server certificate with the `openssl`
command (tests/tls_certs.py; SAN 127.0.0.1, localhost, and the SDK's `<project>.localhost`),
starts a real server process with them, and checks that clients that trust the CA work,
that clients that do not are refused, and that plain http to the TLS port gets no HTTP
answer.

The SDK addresses `https://<project>.localhost:PORT`; a plain `files dns` resolver does not
know that name, so the SDK tests resolve `*.localhost` to 127.0.0.1 (the reference's way D):
the TLS handshake, including the check of the name against the certificate, is the real one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aliyun.log import LogClient, LogException, LogItem, PutLogsRequest
from server_process import ServerProcess
from tls_certs import make_certificates

from loghub.client import LogHubClient
from loghub.errors import SignatureNotMatch, TransportError
from loghub.server.config import ServerConfig
from loghub.server.embedded import EmbeddedServer
from loghub.wire.logs import make_log_group

KEYS = {"ak": "sk"}
SDK_PROJECT = "tlsproj"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate it signed, and a second CA that signed nothing here."""
    made = make_certificates(
        tmp_path_factory.mktemp("tls"), ("localhost", f"{SDK_PROJECT}.localhost")
    )
    return {"ca": made.ca, "other": made.other_ca, "cert": made.cert, "key": made.key}


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, ca: dict[str, Path]
) -> Iterator[ServerProcess]:
    tls_args = ("--tls-cert", str(ca["cert"]), "--tls-key", str(ca["key"]))
    process = ServerProcess(
        tmp_path_factory.mktemp("tls-server") / "data",
        keys=KEYS,
        extra_args=tls_args,
        ca_cert=ca["ca"],
    ).start()
    try:
        yield process
    finally:
        process.stop()


def _client(server: ServerProcess, ca_cert: Path | None, host: str = "127.0.0.1") -> LogHubClient:
    return LogHubClient(f"https://{host}:{server.port}", "ak", "sk", ca_cert=ca_cert)


def _records(prefix: str, count: int) -> list[tuple[int, dict[str, str]]]:
    return [(1_700_000_000 + i, {"msg": f"{prefix} {i}"}) for i in range(count)]


def test_our_client_writes_and_reads_over_https(server: ServerProcess, ca: dict[str, Path]) -> None:
    for host in ("127.0.0.1", "localhost"):  # an IP and a name in the certificate
        with _client(server, ca["ca"], host) as client:
            project = f"client{host.replace('.', '')}"
            client.create_project(project)
            client.create_logstore(project, "web", shard_count=1)
            client.put_log_group(project, "web", make_log_group(_records(host, 3)))
            pulled = client.pull_logs(
                project, "web", 0, client.get_cursor(project, "web", 0, "begin")
            )
            messages = [c.Value for g in pulled.log_groups for log in g.Logs for c in log.Contents]
            assert messages == [f"{host} {i}" for i in range(3)]


def test_loghub_ca_cert_in_the_environment_is_trusted_when_no_ca_is_given(
    server: ServerProcess, ca: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGHUB_CA_CERT", str(ca["ca"]))
    with _client(server, None) as client:
        assert isinstance(client.list_projects(), list)
    with _client(server, ca["other"]) as client, pytest.raises(TransportError):
        client.list_projects()  # an explicit bundle wins over the environment


def test_a_client_that_does_not_trust_the_ca_is_refused(
    server: ServerProcess, ca: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOGHUB_CA_CERT", raising=False)
    for ca_cert in (None, ca["other"]):  # the system's authorities; a CA that did not sign it
        with _client(server, ca_cert) as client, pytest.raises(TransportError) as caught:
            client.list_projects()
        assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
        # pulls take connections of their own (loghub.client._pulls): checked the same way
        with _client(server, ca_cert) as client, pytest.raises(TransportError) as caught:
            client.pull_logs_body("anyproject", "web", 0, "MA==")
        assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)


def test_a_pull_signed_with_a_wrong_secret_is_refused_over_https(
    server: ServerProcess, ca: dict[str, Path]
) -> None:
    with _client(server, ca["ca"]) as client:
        client.create_project("signedpull")
        client.create_logstore("signedpull", "web", shard_count=1)
        cursor = client.get_cursor("signedpull", "web", 0, "begin")
        assert client.pull_logs_body("signedpull", "web", 0, cursor).count == 0
    wrong = LogHubClient(f"https://127.0.0.1:{server.port}", "ak", "not-sk", ca_cert=ca["ca"])
    with wrong, pytest.raises(SignatureNotMatch):
        wrong.pull_logs_body("signedpull", "web", 0, cursor)


def test_plain_http_to_the_tls_port_gets_no_http_answer(
    server: ServerProcess, ca: dict[str, Path]
) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        reply = b""
        try:
            while chunk := sock.recv(4096):
                reply += chunk
        except ConnectionResetError:
            pass
    assert not reply.startswith(b"HTTP/")  # the handshake failed; the connection was closed
    with (
        LogHubClient(f"http://127.0.0.1:{server.port}", "ak", "sk") as plain,
        pytest.raises(TransportError),
    ):
        plain.list_projects()
    with _client(server, ca["ca"]) as client:  # and the server is none the worse
        assert client.health()


def _cli(
    server: ServerProcess, *args: str, env: dict[str, str] | None = None, stdin: str = ""
) -> Any:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
    return subprocess.run(
        [sys.executable, "-m", "loghub", *args, "--endpoint", f"https://localhost:{server.port}"],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, "LOGHUB_ACCESS_KEY_ID": "ak", "LOGHUB_ACCESS_KEY_SECRET": "sk", **(env or {})},
    )


def test_the_cli_produces_and_tails_over_https(server: ServerProcess, ca: dict[str, Path]) -> None:
    ca_flag = ("--ca-cert", str(ca["ca"]))
    assert _cli(server, *ca_flag, "project", "create", "cliproj").returncode == 0
    created = _cli(server, *ca_flag, "logstore", "create", "web", "-p", "cliproj", "--shards", "2")
    assert created.returncode == 0, created.stderr
    lines = "".join(json.dumps({"n": i}) + "\n" for i in range(20))
    produced = _cli(server, *ca_flag, "produce", "web", "-p", "cliproj", stdin=lines)
    assert produced.returncode == 0, produced.stderr
    tail = _cli(  # the CA from the environment this time
        server,
        "tail", "web", "-p", "cliproj", "--from", "begin", "--no-follow",
        env={"LOGHUB_CA_CERT": str(ca["ca"])},
    )  # fmt: skip
    assert tail.returncode == 0, tail.stderr
    numbers = sorted(int(json.loads(line)["contents"]["n"]) for line in tail.stdout.splitlines())
    assert numbers == list(range(20))
    refused = _cli(server, "project", "list")  # no CA given: the system's do not know ours
    assert refused.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.fixture
def sdk_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxies; `*.localhost` resolves to 127.0.0.1, as on systems with nss-myhostname."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("all_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    resolve = socket.getaddrinfo

    def loopback_for_localhost(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".localhost"):
            host = "127.0.0.1"
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", loopback_for_localhost)


def _sdk(server: ServerProcess) -> LogClient:
    return LogClient(f"https://localhost:{server.port}", "ak", "sk", source="127.0.0.1")


@pytest.mark.usefixtures("sdk_env")
def test_the_official_sdk_works_over_https(
    server: ServerProcess, ca: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca["ca"]))  # requests' own setting
    sdk = _sdk(server)
    sdk.create_project(SDK_PROJECT, "over https")
    sdk.create_logstore(SDK_PROJECT, "sdkstore", ttl=7, shard_count=2)
    assert [s["shardID"] for s in sdk.list_shards(SDK_PROJECT, "sdkstore").get_shards_info()] == [
        0,
        1,
    ]
    items = []
    for i in range(5):
        item = LogItem(timestamp=1_700_000_000 + i)
        item.set_contents([("msg", f"sdk {i}")])
        items.append(item)
    sdk.put_logs(PutLogsRequest(SDK_PROJECT, "sdkstore", "", "10.0.0.9", items, hashKey="00"))
    cursor = sdk.get_cursor(SDK_PROJECT, "sdkstore", 0, "begin").get_cursor()
    pulled = sdk.pull_logs(SDK_PROJECT, "sdkstore", 0, cursor, count=100)
    assert [log["msg"] for log in pulled.get_flatten_logs_json()] == [f"sdk {i}" for i in range(5)]


@pytest.mark.usefixtures("sdk_env")
def test_the_official_sdk_without_the_ca_is_refused(server: ServerProcess) -> None:
    with pytest.raises(LogException) as caught:
        _sdk(server).list_shards(SDK_PROJECT, "sdkstore")
    assert "CERTIFICATE_VERIFY_FAILED" in caught.value.get_error_message()


def test_serve_checks_its_tls_files_and_still_refuses_open_hosts_without_keys(
    tmp_path: Path, ca: dict[str, Path]
) -> None:
    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "loghub", "serve", "--data-dir", str(tmp_path), *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)

    tls = ("--tls-cert", str(ca["cert"]), "--tls-key", str(ca["key"]))
    open_host = serve("--host", "0.0.0.0", "--port", "1", *tls)
    assert open_host.returncode == 1 and "refusing to listen on 0.0.0.0" in open_host.stderr
    half = serve("--port", "1", "--tls-cert", str(ca["cert"]))
    assert half.returncode == 1 and "needs both --tls-cert and --tls-key" in half.stderr
    missing = serve("--port", "1", "--tls-cert", str(ca["cert"]), "--tls-key", str(tmp_path / "x"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_the_ca_bundle_must_be_readable() -> None:
    with pytest.raises(TransportError, match="cannot load the CA bundle"):
        LogHubClient("https://127.0.0.1:1", ca_cert="/nonexistent/ca.pem")


def test_the_embedded_server_speaks_tls_too(tmp_path: Path, ca: dict[str, Path]) -> None:
    config = ServerConfig(
        data_dir=tmp_path / "data", port=0, tls_cert_file=ca["cert"], tls_key_file=ca["key"]
    )
    with EmbeddedServer(config) as server:
        assert server.endpoint.startswith("https://127.0.0.1:")
        with LogHubClient(server.endpoint, ca_cert=ca["ca"]) as client:
            client.create_project("embedded")
            assert [p["projectName"] for p in client.list_projects()] == ["embedded"]
