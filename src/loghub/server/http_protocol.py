"""uvicorn's httptools protocol with the timeouts and the connection cap it lacks.

uvicorn cuts a keep-alive connection only after a response, and any byte that arrives
cancels even that: a client that opens a connection and sends nothing, or one header byte a
second, or half a body, holds its socket (and a file descriptor) forever. Each connection
here is always in one phase, and each phase but one has a deadline:

    connect ──> HEAD ──(headers complete)──> BODY ──(body complete)──> APP
                 ^  header_timeout_s          body_timeout_s,          no deadline: the
                 │  from the first byte       restarted by every       server is working
                 │  (or the connect)          chunk received                  │
                 │                                                            │
                 └────(first byte)──── IDLE <──────(response sent)────────────┘
                                       idle_timeout_s

A deadline that passes closes the connection; the request being read is then abandoned (the
application sees a disconnect). The body deadline does not count time in which the server
itself stopped reading (it waits for room for the body, see ``admission.py``): it is re-armed
instead. A connection opened while ``connections_max`` are open is answered 503 ServerBusy
and closed before it is read.

Shard requests (``GET`` and ``POST /logstores/{logstore}/shards/{target}``: PutLogs, PullLogs,
GetCursor) with a declared body of at most ``direct_body_bytes_max`` take a direct way: the
body is collected here, and ``LogHubApp.handle_direct`` gets it in one call and returns the
response, which goes out in one ``transport.write``. That skips uvicorn's request cycle and
the ASGI messages, whose fixed cost was most of what a PutLogs of a few logs cost the server.
The application applies the same checks either way (headers, admission, signature, routing,
errors, metrics). Such a body is read before it takes room in the in-flight budget, as
uvicorn reads that much of any body before the application asks for it. Everything else
(other paths, larger or chunked bodies, ``Expect: 100-continue``, HTTP/1.0, upgrades, a
request pipelined behind an unanswered one, cluster mode) goes through uvicorn and the ASGI
application as before. The phases and deadlines are the same on both ways.

Thread-safety: runs on the event loop only, like the protocol it extends.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
from collections.abc import Awaitable, Callable

from starlette.responses import Response
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from loghub.server.config import Limits
from loghub.wire.errors import error_body

__all__ = ["DirectHandler", "bounded_protocol", "direct_body_bytes_max"]

log = logging.getLogger("loghub.server")

# (method, path, query string, headers as received, body) -> the response to write
DirectHandler = Callable[[str, str, bytes, list[tuple[bytes, bytes]], bytes], Awaitable[Response]]
# The largest body that takes the direct way: what uvicorn reads of any body before the
# application asks for it (its read buffer's high-water mark), so reading it before admission
# holds no more memory than the ASGI way does.
direct_body_bytes_max = HIGH_WATER_LIMIT
# The shard requests' path, each name printable ASCII without '%' (nothing to unquote), '#'
# (a fragment) or '/'.
_DIRECT_PATH = re.compile(rb"/logstores/[!\x22$&-.0-~]+/shards/[!\x22$&-.0-~]+")
_DIRECT_METHODS = frozenset((b"GET", b"POST"))
# uvicorn's default headers, rendered: id of the list -> (the list, its bytes)
_rendered_defaults: dict[int, tuple[list[tuple[bytes, bytes]], bytes]] = {}
# A response body of up to this many bytes is joined to its head (one write); a larger one
# is written after it rather than copied.
_JOINED_BODY_BYTES_MAX = 16 * 1024


class _Phase(enum.Enum):
    HEAD = "head"
    BODY = "body"
    APP = "app"
    IDLE = "idle"


def _busy_response(connections_max: int) -> bytes:
    body = error_body("ServerBusy", f"the server has {connections_max} open connections; try again")
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "retry-after: 1\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class _NoEvent:
    """Stands for a request cycle's ``message_event``, which uvicorn sets on a disconnect:
    a direct request has nobody waiting for messages."""

    def set(self) -> None:
        pass


class _DirectCycle:
    """A request on the direct way, where uvicorn keeps its ``RequestResponseCycle``: the
    attributes uvicorn's protocol reads of a cycle (on a disconnect, a shutdown, the next
    request), and what the request needs to be handled."""

    __slots__ = (
        "body_chunks",
        "disconnected",
        "handled",
        "headers",
        "keep_alive",
        "method",
        "path",
        "query_string",
        "response_complete",
    )
    message_event = _NoEvent()

    def __init__(
        self,
        method: str,
        path: str,
        query_string: bytes,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
    ) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.keep_alive = keep_alive  # cleared by uvicorn's shutdown(): close after answering
        self.body_chunks: list[bytes] = []
        self.handled = False
        self.disconnected = False
        self.response_complete = False


class _BoundedProtocol(HttpToolsProtocol):
    limits: Limits  # set on the subclass bounded_protocol() makes
    direct: DirectHandler | None  # likewise

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._phase = _Phase.HEAD
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_fires_at = 0.0  # loop time at which _deadline fires
        self._due_at: float | None = None  # loop time at which the phase ends; None: no end
        super().connection_made(transport)
        if len(self.connections) > self.limits.connections_max:
            log.warning("refused a connection: %d are open", len(self.connections) - 1)
            transport.write(_busy_response(self.limits.connections_max))
            transport.close()
            return
        self._arm(_Phase.HEAD)

    def connection_lost(self, exc: Exception | None) -> None:
        self._due_at = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase is _Phase.IDLE:
            self._arm(_Phase.HEAD)
        super().data_received(data)

    def on_message_begin(self) -> None:
        if self._phase is not _Phase.HEAD:
            self._arm(_Phase.HEAD)
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._arm(_Phase.BODY)
        if self.direct is not None and self._begin_direct():
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._arm(_Phase.BODY)
        cycle: object = self.cycle
        if type(cycle) is _DirectCycle:
            cycle.body_chunks.append(body)  # at most direct_body_bytes_max in all
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        cycle: object = self.cycle
        if type(cycle) is _DirectCycle and not cycle.handled:
            cycle.handled = True
            self._cancel()
            self._phase = _Phase.APP
            task = self.loop.create_task(self._serve_direct(cycle))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)  # uvicorn's shutdown waits for these
            return
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete:
            self._arm(_Phase.IDLE)  # answered early (413, 503): nothing more to wait for
        else:
            self._cancel()
            self._phase = _Phase.APP

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._phase is _Phase.APP:
            self._arm(_Phase.IDLE)

    def _default_headers(self) -> bytes:
        """uvicorn's headers for every response (date, server) as bytes, rendered again
        only when uvicorn replaces them (once a second, for the date)."""
        headers = self.server_state.default_headers
        rendered = _rendered_defaults.get(id(headers))
        if rendered is None or rendered[0] is not headers:
            _rendered_defaults.clear()
            text = b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers)
            rendered = _rendered_defaults[id(headers)] = (headers, text)
        return rendered[1]

    def _direct_response_complete(self) -> None:
        """After a direct response on a kept-alive connection: what uvicorn's
        ``on_response_complete`` does, less its own keep-alive timer (the idle phase
        below is that timer) and the read resumption (the direct way never pauses)."""
        if self.pipeline:
            self.on_response_complete()  # start the request queued behind this one
            return
        self.server_state.total_requests += 1
        if self._phase is _Phase.APP:
            self._arm(_Phase.IDLE)

    def _begin_direct(self) -> bool:
        """Starts a direct request when this one may take that way (see the module's
        docstring); False leaves it to uvicorn."""
        previous = self.cycle
        if previous is not None and not previous.response_complete:
            return False  # pipelined behind an unanswered request: uvicorn queues it
        parser = self.parser
        method = parser.get_method()
        if (
            method not in _DIRECT_METHODS
            or self.expect_100_continue
            or parser.get_http_version() != "1.1"
            or parser.should_upgrade()
        ):
            return False
        # origin-form only (the regular expression refuses anything else); a fragment, which
        # parse_url would cut, sends the request the ASGI way
        path, _, query = self.url.partition(b"?")
        if _DIRECT_PATH.fullmatch(path) is None or b"#" in query:
            return False
        length = -1
        for name, value in self.headers:
            if name == b"content-length":
                if length >= 0 or not value.isdigit() or len(value) > 9:
                    return False  # repeated or odd: the ASGI way refuses it as before
                length = int(value)
            elif name == b"transfer-encoding":
                return False
        if length > min(direct_body_bytes_max, self.limits.request_body_bytes_max):
            return False
        self.cycle = _DirectCycle(  # type: ignore[assignment]
            method.decode("ascii"),
            path.decode("ascii"),
            query,
            self.headers,
            parser.should_keep_alive(),
        )
        return True

    async def _serve_direct(self, cycle: _DirectCycle) -> None:
        """Hands a complete direct request to the application and writes its response:
        head and a small body in one write. A connection lost meanwhile gets nothing (the
        request still completes, as on the ASGI way)."""
        assert self.direct is not None
        chunks = cycle.body_chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        transport = self.transport
        try:
            response = await self.direct(
                cycle.method, cycle.path, cycle.query_string, cycle.headers, body
            )
        except BaseException:  # cancelled at shutdown (the handler answers its own errors)
            cycle.response_complete = True
            transport.close()
            raise
        if self.flow.write_paused and not transport.is_closing():
            await self.flow.drain()  # the client has not read earlier responses yet
        if transport.is_closing():
            cycle.response_complete = True
            return
        head = [STATUS_LINE[response.status_code], self._default_headers()]
        for name, value in response.raw_headers:
            head += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        reply_body = response.body
        if len(reply_body) <= _JOINED_BODY_BYTES_MAX:
            head.append(bytes(reply_body))  # the same object when it is bytes
            transport.write(b"".join(head))
        else:
            transport.write(b"".join(head))
            transport.write(reply_body)
        cycle.response_complete = True
        if not cycle.keep_alive:
            transport.close()
            self.on_response_complete()
            return
        self._direct_response_complete()

    def _arm(self, phase: _Phase) -> None:
        """Enters a phase with a deadline. The connection's one timer is moved only when
        the new deadline comes before it fires; a later deadline is just written down, and
        the timer, when it fires early, sets itself for it. A request passes through three
        phases with deadlines, so this saves a timer made and cancelled in each of them."""
        self._phase = phase
        if phase is _Phase.HEAD:
            delay_s = self.limits.header_timeout_s
        elif phase is _Phase.BODY:
            delay_s = self.limits.body_timeout_s
        else:
            delay_s = self.limits.idle_timeout_s
        due_at = self.loop.time() + delay_s
        self._due_at = due_at
        deadline = self._deadline
        if deadline is None or due_at < self._deadline_fires_at:
            if deadline is not None:
                deadline.cancel()
            self._deadline = self.loop.call_at(due_at, self._deadline_passed)
            self._deadline_fires_at = due_at

    def _cancel(self) -> None:
        """Ends the phase's deadline (the timer, if set, fires and finds none)."""
        self._due_at = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        due_at = self._due_at
        if due_at is None:
            return  # the server is working on a request: no deadline until it answers
        if self.loop.time() < due_at:  # the phase changed since the timer was set
            self._deadline = self.loop.call_at(due_at, self._deadline_passed)
            self._deadline_fires_at = due_at
            return
        if self._phase is _Phase.BODY and self.flow.read_paused:
            self._arm(_Phase.BODY)  # the server stopped reading, not the client sending
            return
        if self._phase is not _Phase.IDLE:
            log.info("closed a connection from %s: %s timeout", self.client, self._phase.value)
        if not self.transport.is_closing():
            self.transport.close()


def bounded_protocol(
    limits: Limits, direct: DirectHandler | None = None
) -> type[HttpToolsProtocol]:
    """The protocol class to give uvicorn (``http=``) for these limits; with ``direct``,
    shard requests with a small body go to it rather than through the ASGI application."""
    return type("LogHubHttpProtocol", (_BoundedProtocol,), {"limits": limits, "direct": direct})
