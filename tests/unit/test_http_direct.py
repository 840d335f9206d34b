"""The direct way for shard requests in the HTTP protocol, over real loopback sockets.

A shard request (PutLogs, PullLogs, GetCursor) with a small declared body goes to the direct
handler with its body in one call and is answered in one write; everything the direct way
does not take (other paths, large or chunked bodies, Expect: 100-continue, HTTP/1.0, a request
pipelined behind an unanswered one) reaches the ASGI application as before. The connection's
phases hold on both ways: keep-alive, Connection: close, the body deadline, a client that
leaves mid-request. The ASGI application and the direct handler here are stand-ins that say
which way a request took; the server's own answers are tested in
tests/integration/test_direct_requests.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvicorn
from starlette.responses import Response
from uvicorn.server import ServerState

from loghub.server.config import Limits
from loghub.server.http_protocol import bounded_protocol, direct_body_bytes_max

Call = tuple[str, str, bytes, list[tuple[bytes, bytes]], bytes]
PUT_TARGET = "/logstores/ls/shards/lb"


class _Ways:
    """Records which way each request took; the direct handler may be made to wait."""

    def __init__(self) -> None:
        self.direct: list[Call] = []
        self.asgi: list[tuple[str, str, bytes]] = []
        self.direct_gate: asyncio.Event | None = None
        self.direct_done = 0
        self.writes = 0

    async def handler(
        self,
        method: str,
        path: str,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> Response:
        self.direct.append((method, path, query, headers, body))
        if self.direct_gate is not None:
            await self.direct_gate.wait()
        self.direct_done += 1
        if body.startswith(b"big:"):  # a large reply: b"big:<n>" asks for n bytes of its tag
            _, tag, size = body.split(b":")
            return Response(tag * int(size), headers={"x-log-requestid": "R1"})
        return Response(b"direct:" + body, headers={"x-log-requestid": "R1"})

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.asgi.append((scope["method"], scope["path"], body))
        reply = b"asgi:" + body[:16]
        headers = [(b"content-length", str(len(reply)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": reply})


Scenario = Callable[[_Ways, int], Awaitable[None]]


def _run(scenario: Scenario, limits: Limits | None = None, direct: bool = True) -> _Ways:
    ways = _Ways()

    async def main() -> None:
        config = uvicorn.Config(ways.app, lifespan="off", log_level="warning", interface="asgi3")
        config.load()
        state = ServerState()
        # what uvicorn's server loop keeps there (it is not running here)
        date = b"Wed, 25 Nov 2026 09:00:00 GMT"
        state.default_headers = [(b"date", date), (b"server", b"uvicorn")]
        protocol_class = bounded_protocol(limits or Limits(), ways.handler if direct else None)

        def make() -> asyncio.Protocol:
            protocol = protocol_class(config=config, server_state=state, app_state={})
            original = protocol.connection_made

            def connection_made(transport: asyncio.BaseTransport) -> None:
                write = transport.write  # type: ignore[attr-defined]

                def counted(data: bytes) -> None:
                    ways.writes += 1
                    write(data)

                transport.write = counted  # type: ignore[attr-defined]
                original(transport)  # type: ignore[arg-type]

            protocol.connection_made = connection_made  # type: ignore[method-assign]
            return protocol

        server = await asyncio.get_running_loop().create_server(make, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            await asyncio.wait_for(scenario(ways, port), 20)
        finally:
            server.close()
            for protocol in list(state.connections):
                protocol.transport.close()
            await server.wait_closed()
            await asyncio.sleep(0.01)  # the transports' close callbacks

    asyncio.run(main())
    return ways


def _request(
    method: str,
    target: str,
    body: bytes = b"",
    headers: tuple[str, ...] = (),
    version: str = "1.1",
) -> bytes:
    lines = [f"{method} {target} HTTP/{version}", "Host: p.127.0.0.1", *headers]
    if not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def _exchange(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return await _reply(reader)
    finally:
        await _close(writer)


def test_small_shard_requests_go_to_the_direct_handler_in_one_call_and_one_write() -> None:
    async def scenario(ways: _Ways, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request("POST", PUT_TARGET + "?key=7", b"x" * 100, ("X-Log-A: 1",)))
        status, headers, body = await _reply(reader)
        assert (status, body) == (200, b"direct:" + b"x" * 100)
        assert headers["x-log-requestid"] == "R1"
        assert headers["server"] == "uvicorn" and "date" in headers  # as on the ASGI way
        assert "connection" not in headers  # kept alive
        writes_before = ways.writes
        writer.write(_request("GET", "/logstores/ls/shards/0?type=cursor&from=begin"))
        assert (await _reply(reader))[2] == b"direct:"
        assert ways.writes == writes_before + 1  # head and body in one write
        await _close(writer)

    ways = _run(scenario)
    assert ways.asgi == []
    method, path, query, headers, body = ways.direct[0]
    assert (method, path, query, body) == ("POST", PUT_TARGET, b"key=7", b"x" * 100)
    assert (b"host", b"p.127.0.0.1") in headers and (b"x-log-a", b"1") in headers
    assert ways.direct[1][:3] == ("GET", "/logstores/ls/shards/0", b"type=cursor&from=begin")


@pytest.mark.parametrize(
    "request_bytes",
    [
        _request("GET", "/health"),
        _request("PUT", "/logstores/ls"),
        _request("POST", "/logstores/ls/shards"),
        _request("POST", "/logstores/ls/shards/lb/extra", b"x"),
        _request("POST", "/logstores/l%73/shards/lb", b"x"),  # quoted: the ASGI way unquotes
        _request("DELETE", PUT_TARGET),
        _request("POST", PUT_TARGET, b"x" * (direct_body_bytes_max + 1)),
        _request("POST", PUT_TARGET, b"", ("Transfer-Encoding: chunked",)) + b"1\r\nx\r\n0\r\n\r\n",
        _request("POST", PUT_TARGET, b"x", ("Expect: 100-continue",)),
        _request("POST", PUT_TARGET, b"x", version="1.0"),
        _request("POST", PUT_TARGET, b"x", ("Content-Length: 1", "Content-Length: 1")),
    ],
    ids=[
        "health",
        "other-path",
        "shards-list",
        "longer-path",
        "quoted-path",
        "other-method",
        "large-body",
        "chunked",
        "expect-continue",
        "http-1.0",
        "repeated-length",
    ],
)
def test_requests_the_direct_way_does_not_take_reach_the_asgi_application(
    request_bytes: bytes,
) -> None:
    statuses: list[int] = []

    async def scenario(ways: _Ways, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes)
        status, _, body = await _reply(reader)
        if status == 100:  # Expect: 100-continue, answered by uvicorn when the app reads
            status, _, body = await _reply(reader)
        statuses.append(status)
        await _close(writer)

    ways = _run(scenario)
    assert ways.direct == []
    if statuses != [400]:  # uvicorn refuses a repeated Content-Length itself
        assert statuses == [200] and len(ways.asgi) == 1


def test_a_body_over_the_configured_limit_takes_the_asgi_way() -> None:
    """The application answers 413 before reading such a body; only the ASGI way can."""

    async def scenario(ways: _Ways, port: int) -> None:
        assert (await _exchange(port, _request("POST", PUT_TARGET, b"x" * 101)))[0] == 200

    ways = _run(scenario, Limits(request_body_bytes_max=100))
    assert ways.direct == [] and len(ways.asgi) == 1


def test_without_a_handler_every_request_takes_the_asgi_way() -> None:
    async def scenario(ways: _Ways, port: int) -> None:
        assert (await _exchange(port, _request("POST", PUT_TARGET, b"x")))[2] == b"asgi:x"

    assert len(_run(scenario, direct=False).asgi) == 1


def test_both_ways_alternate_on_one_kept_alive_connection() -> None:
    async def scenario(ways: _Ways, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for index in range(6):
            target = PUT_TARGET if index % 2 == 0 else "/logstores/ls"
            writer.write(_request("POST", target, b"b%d" % index))
            expected = b"direct:" if index % 2 == 0 else b"asgi:"
            assert (await _reply(reader))[2] == expected + b"b%d" % index
        await _close(writer)

    ways = _run(scenario)
    assert len(ways.direct) == 3 and len(ways.asgi) == 3


def test_connection_close_is_answered_with_connection_close_and_the_socket_closed() -> None:
    async def scenario(ways: _Ways, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request("POST", PUT_TARGET, b"x", ("Connection: close",)))
        status, headers, _ = await _reply(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        await _close(writer)

    _run(scenario)


def test_a_request_pipelined_behind_a_direct_one_is_answered_after_it() -> None:
    async def scenario(ways: _Ways, port: int) -> None:
        ways.direct_gate = asyncio.Event()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request("POST", PUT_TARGET, b"first") + _request("POST", PUT_TARGET, b"2nd"))
        await asyncio.sleep(0.2)  # both are in; the first one's answer is held back
        ways.direct_gate.set()
        assert (await _reply(reader))[2] == b"direct:first"
        assert (await _reply(reader))[2] == b"asgi:2nd"  # queued by uvicorn, in order
        await _close(writer)

    ways = _run(scenario)
    assert len(ways.direct) == 1 and len(ways.asgi) == 1


def test_a_direct_body_that_stalls_is_cut_at_the_body_deadline() -> None:
    async def scenario(ways: _Ways, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = _request("POST", PUT_TARGET, b"x" * 100)
        writer.write(head[:-50])  # half the body, then nothing
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert asyncio.get_running_loop().time() - started >= 0.25
        await _close(writer)

    ways = _run(scenario, Limits(body_timeout_s=0.3))
    assert ways.direct == []  # headers complete, body never: nothing handled


def test_a_client_that_leaves_mid_request_does_not_stop_the_server() -> None:
    async def scenario(ways: _Ways, port: int) -> None:
        ways.direct_gate = asyncio.Event()
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request("POST", PUT_TARGET, b"gone"))
        await asyncio.sleep(0.1)
        await _close(writer)
        await asyncio.sleep(0.1)
        ways.direct_gate.set()  # the request completes; its answer has nowhere to go
        await asyncio.sleep(0.05)
        assert ways.direct_done == 1
        status, _, body = await _exchange(port, _request("POST", PUT_TARGET, b"next"))
        assert (status, body) == (200, b"direct:next")

    _run(scenario)


def test_large_replies_to_a_client_that_does_not_read_wait_and_arrive_whole_in_order() -> None:
    """A reply that finds the connection's write buffer full waits for the client to read
    (uvicorn's flow control) rather than piling up in memory; requests that arrive meanwhile
    queue behind it (the ASGI way's pipelining), and every reply arrives whole, in order."""

    async def scenario(ways: _Ways, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        tags = [b"a", b"b", b"c", b"d", b"e", b"f"]  # 24 MB: more than the kernel buffers
        for tag in tags:  # one after the other, nothing read yet
            asked = b"big:" + tag + b":4000000"
            writer.write(_request("GET", "/logstores/ls/shards/0", asked))
            await asyncio.sleep(0.1)
        for tag in tags:
            status, _, body = await _reply(reader)
            assert status == 200
            asked = b"big:" + tag + b":4000000"
            assert body in (tag * 4_000_000, b"asgi:" + asked[:16])
        await _close(writer)

    ways = _run(scenario)
    assert len(ways.direct) >= 2  # the second found the buffer full and waited
    assert len(ways.direct) + len(ways.asgi) == 6
