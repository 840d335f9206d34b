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

Thread-safety: runs on the event loop only, like the protocol it extends.
"""

from __future__ import annotations

import asyncio
import enum
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from loghub.server.config import Limits
from loghub.wire.errors import error_body

__all__ = ["bounded_protocol"]

log = logging.getLogger("loghub.server")


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


class _BoundedProtocol(HttpToolsProtocol):
    limits: Limits  # set on the subclass bounded_protocol() makes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._phase = _Phase.HEAD
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.limits.connections_max:
            log.warning("refused a connection: %d are open", len(self.connections) - 1)
            transport.write(_busy_response(self.limits.connections_max))
            transport.close()
            return
        self._arm(_Phase.HEAD)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
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
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._arm(_Phase.BODY)
        super().on_body(body)

    def on_message_complete(self) -> None:
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

    def _arm(self, phase: _Phase) -> None:
        self._cancel()
        self._phase = phase
        delay_s = {
            _Phase.HEAD: self.limits.header_timeout_s,
            _Phase.BODY: self.limits.body_timeout_s,
            _Phase.IDLE: self.limits.idle_timeout_s,
        }[phase]
        self._deadline = self.loop.call_later(delay_s, self._deadline_passed)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if self._phase is _Phase.BODY and self.flow.read_paused:
            self._arm(_Phase.BODY)  # the server stopped reading, not the client sending
            return
        if self._phase is not _Phase.IDLE:
            log.info("closed a connection from %s: %s timeout", self.client, self._phase.value)
        if not self.transport.is_closing():
            self.transport.close()


def bounded_protocol(limits: Limits) -> type[HttpToolsProtocol]:
    """The protocol class to give uvicorn (``http=``) for these limits."""
    return type("LogHubHttpProtocol", (_BoundedProtocol,), {"limits": limits})
