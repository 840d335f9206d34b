"""Pulls over kept-alive ``http.client`` connections, beside the client's httpx pool.

Why a second HTTP stack for one request: a consumer pulls from many shards at once on
several threads while other threads parse what came, so each pull's cost is counted in GIL
hand-offs as much as in CPU. Every time a thread blocked in a socket call wants the GIL
back while another thread parses (upb holds the GIL for milliseconds), it waits; httpx's
pull went through about ten such hand-offs (the pool's lock twice, a ``select`` on the
connection before reusing it, the request, the headers, 64 KiB body reads) and its pool
lock is shared by every thread. Measured on the consumer benchmark (2 M logs, 4 shards):
a pull took 11 ms p50 through httpx and 7 ms here, and the worker read the backlog about
a third faster. ``http.client`` sends the request in one write and reads the body with as
few ``recv`` calls as the socket allows.

Only GETs whose reply is read whole go this way (``LogHubClient.pull_logs_body``); the rest
keep httpx. With a custom httpx transport (tests, the Spark source's plain-http option)
pulls use httpx too, so that the transport sees every request.

Connections: a free list, taken by one request at a time and given back after a complete
reply that keeps the connection open. A kept connection the server has meanwhile closed
(its idle timeout) fails the next request before any reply byte; such a request is sent
again on the next kept connection or a new one, which is safe because a pull is a read
(after a long pause every kept connection may be stale). A new connection that fails, and
every other failure, is raised. ``close`` closes the idle connections and makes busy ones
close when given back.

Thread-safety: any thread may call ``get``; the free list's lock is held for a list
operation only, never across I/O.
"""

from __future__ import annotations

import http.client
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from loghub.errors import TransportError

__all__ = ["PullConnections", "PullReply"]

# What a kept connection closed by the server while idle fails with, before any reply.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


@dataclass(frozen=True)
class PullReply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


class PullConnections:
    def __init__(
        self, scheme: str, host: str, port: int | None, timeout_s: float,
        ssl_context: ssl.SSLContext | None,
    ) -> None:  # fmt: skip
        self._scheme = scheme
        self._host = host
        self._port = port
        self._timeout_s = timeout_s
        self._ssl_context = ssl_context
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._closed = False

    def get(self, target: str, headers: Mapping[str, str]) -> PullReply:
        """``GET target`` (a path with its query); the reply read whole. Raises
        ``TransportError`` when no reply came."""
        while True:
            connection, reused = self._take()
            try:
                connection.request("GET", target, headers=headers)
                response = connection.getresponse()
                body = response.read()
            except _STALE as exc:
                connection.close()
                if reused:
                    # the server closed it while it was idle: the next kept one, or a new
                    # one (each turn drops a kept connection, so this ends)
                    continue
                raise TransportError(f"GET {target}: {exc!r}") from exc
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                raise TransportError(f"GET {target}: {exc!r}") from exc
            if response.will_close:
                connection.close()
            else:
                self._give_back(connection)
            return PullReply(response.status, response.headers, body)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._closed:
                raise TransportError("the client is closed")
            if self._idle:
                return self._idle.pop(), True
        if self._scheme == "https":
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout_s, context=self._ssl_context
            ), False
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s), False

    def _give_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(connection)
                return
        connection.close()
