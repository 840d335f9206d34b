"""Shard requests on the direct way and on the ASGI way get the same answers from a real server.

A shard request with a small declared body (``Content-Length``) is handled without the ASGI
layer (``server/http_protocol.py``); the same request with a chunked body goes through uvicorn
and the ASGI application. Every request here is sent both ways to a signed `loghub serve`
and the answers compared: status, LogHub error code, the headers set, the body of a
success. Signature checks, error format and the stored data must not depend on the way.
These pin behaviour that must not change, so they pass on the server before the direct way
too; tests/unit/test_http_direct.py proves which way each request takes.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from raw_http import Headers, RawConnection, Reply, replace_header, signed, target
from server_process import ServerProcess

from loghub.wire.logs import make_log_group, parse_log_group_list

HOST = "direct.127.0.0.1"
PATH = "/logstores/store/shards/0"


def _group(marker: str) -> bytes:
    return make_log_group([(1_700_000_000, {"marker": marker})]).SerializeToString()


def _send(
    port: int, method: str, target_: str, headers: Headers, body: bytes, chunked: bool
) -> Reply:
    """One request on its own connection: with Content-Length, or with the same body as one
    chunk (which only the ASGI way takes)."""
    if chunked:
        framing = [("Transfer-Encoding", "chunked")]
        payload = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    else:
        framing = [("Content-Length", str(len(body)))]
        payload = body
    lines = [f"{method} {target_} HTTP/1.1", *(f"{n}: {v}" for n, v in [*headers, *framing])]
    data = ("\r\n".join(lines) + "\r\n\r\n").encode() + payload
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
        head, _, rest = received.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        reply_headers = {
            name.strip().lower(): value.strip()
            for name, value in (line.split(":", 1) for line in header_lines)
        }
        while len(rest) < int(reply_headers.get("content-length", "0")):
            chunk = sock.recv(65536)
            assert chunk
            rest += chunk
    return Reply(int(status_line.split()[1]), reply_headers, rest)


def _both_ways(
    port: int, method: str, path: str, query: list[tuple[str, str]], headers: Headers, body: bytes
) -> tuple[Reply, Reply]:
    direct = _send(port, method, target(path, query), headers, body, chunked=False)
    asgi = _send(port, method, target(path, query), headers, body, chunked=True)
    return direct, asgi


def _assert_same(direct: Reply, asgi: Reply) -> None:
    assert direct.status == asgi.status, (direct, asgi)
    assert direct.error_code() == asgi.error_code(), (direct.body, asgi.body)
    assert set(direct.headers) == set(asgi.headers), (direct.headers, asgi.headers)
    if direct.status >= 400:  # LogHub's error format, never a 5xx
        assert direct.status < 500
        reply = direct.json()
        assert set(reply) == {"errorCode", "errorMessage", "requestId"}
        assert reply["requestId"] == direct.headers["x-log-requestid"]
    else:
        assert direct.body == asgi.body


@pytest.fixture(scope="module")
def port(signed_server: ServerProcess) -> Iterator[int]:
    with RawConnection(signed_server.port) as http:
        for method, path, body in (
            ("POST", "/", json.dumps({"projectName": "direct"}).encode()),
            ("POST", "/logstores", b'{"logstoreName": "store", "shardCount": 1, "ttl": 7}'),
        ):
            reply = http.send(method, path, signed("v4", method, HOST, path, [], body), body)
            assert reply.status == 200, reply.body
    yield signed_server.port


def _put_headers(body: bytes, **kw: object) -> Headers:
    return signed("v4", "POST", HOST, PATH, [], body, **kw)  # type: ignore[arg-type]


def test_a_signed_put_is_stored_the_same_either_way(port: int) -> None:
    direct_body, asgi_body = _group("direct-way"), _group("asgi-way")
    direct = _send(port, "POST", PATH, _put_headers(direct_body), direct_body, chunked=False)
    asgi = _send(port, "POST", PATH, _put_headers(asgi_body), asgi_body, chunked=True)
    _assert_same(direct, asgi)
    assert direct.status == 200 and direct.body == b""
    query = [("type", "cursor"), ("from", "begin")]
    cursors = _both_ways(port, "GET", PATH, query, signed("v1", "GET", HOST, PATH, query), b"")
    _assert_same(*cursors)
    query = [("type", "log"), ("cursor", cursors[0].json()["cursor"]), ("count", "100")]
    pulls = _both_ways(port, "GET", PATH, query, signed("v4", "GET", HOST, PATH, query), b"")
    _assert_same(*pulls)
    markers = [
        log.Contents[0].Value
        for group in parse_log_group_list(pulls[0].body).LogGroups
        for log in group.Logs
    ]
    assert markers[-2:] == ["direct-way", "asgi-way"]


def _bad_puts() -> dict[str, tuple[str, Headers, bytes]]:
    body = _group("bad")
    return {
        "wrong-secret": (PATH, _put_headers(body, secret="wrong"), body),
        "unknown-key": (PATH, _put_headers(body, key_id="nobody"), body),
        "stale-date": (PATH, _put_headers(body, now_s=1_000_000_000), body),
        "tampered-body": (PATH, _put_headers(body), body[:-1] + b"X"),
        "unsigned": (PATH, replace_header(_put_headers(body), "authorization", None), body),
        "second-host": (PATH, [*_put_headers(body), ("Host", "other.127.0.0.1")], body),
        "not-a-log-group": (PATH, _put_headers(b"\xff\xff\xff"), b"\xff\xff\xff"),
        "bad-raw-size": (
            PATH,
            replace_header(_put_headers(body), "x-log-bodyrawsize", "-1"),
            body,
        ),
        "missing-logstore": (
            "/logstores/nothing/shards/0",
            signed("v4", "POST", HOST, "/logstores/nothing/shards/0", [], body),
            body,
        ),
        "bad-shard-id": (
            "/logstores/store/shards/x9",
            signed("v4", "POST", HOST, "/logstores/store/shards/x9", [], body),
            body,
        ),
    }


@pytest.mark.parametrize("case", sorted(_bad_puts()))
def test_a_bad_put_gets_the_same_4xx_either_way(port: int, case: str) -> None:
    path, headers, body = _bad_puts()[case]
    direct, asgi = _both_ways(port, "POST", path, [], headers, body)
    _assert_same(direct, asgi)
    assert 400 <= direct.status < 500


@pytest.mark.parametrize(
    "query",
    [
        [("type", "log"), ("cursor", "not-a-cursor"), ("count", "10")],
        [("type", "log"), ("cursor", "MA=="), ("count", "0")],
        [("type", "cursor"), ("from", "yesterday")],
        [("type", "query")],
    ],
    ids=["bad-cursor", "zero-count", "bad-from", "unknown-type"],
)
def test_a_bad_read_gets_the_same_4xx_either_way(port: int, query: list[tuple[str, str]]) -> None:
    direct, asgi = _both_ways(port, "GET", PATH, query, signed("v4", "GET", HOST, PATH, query), b"")
    _assert_same(direct, asgi)
    assert 400 <= direct.status < 500


def test_connection_close_is_honoured_on_the_direct_way(port: int) -> None:
    body = _group("close")
    headers = [*_put_headers(body), ("Connection", "close"), ("Content-Length", str(len(body)))]
    head = "".join(f"{n}: {v}\r\n" for n, v in headers)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"POST {PATH} HTTP/1.1\r\n{head}\r\n".encode() + body)
        received = b""
        while chunk := sock.recv(65536):  # read to the end: the server closes
            received += chunk
    assert received.startswith(b"HTTP/1.1 200 ")
    assert b"\r\nconnection: close\r\n" in received.lower()
