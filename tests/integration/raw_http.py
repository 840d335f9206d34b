"""HTTP/1.1 over a plain socket, for requests no HTTP client library will send.

Client libraries fold repeated headers, set `Host` themselves and fix up bodies; attacks on
the server's parsing need exactly those bytes. `RawConnection` sends a request as given
(headers as a list of pairs, repeats and all) on a kept-alive loopback connection and reads
the reply by its Content-Length. `signed` builds the headers of a request signed as the
official SDK signs it (v1 or v4), which tests then tamper with.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from loghub.wire.signing import Credentials, sign_v1, sign_v4

Headers = list[tuple[str, str]]


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def error_code(self) -> str | None:
        try:
            parsed = self.json()
        except ValueError:
            return None
        return parsed.get("errorCode") if isinstance(parsed, dict) else None


class RawConnection:
    """One kept-alive connection; reconnects when the server closed it."""

    def __init__(self, port: int, timeout_s: float = 30.0) -> None:
        self.port = port
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._buffer = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer = b""

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, method: str, target: str, headers: Headers, body: bytes = b"") -> Reply:
        """Sends the request; adds Content-Length (once) unless the headers carry one."""
        if not any(name.lower() == "content-length" for name, _ in headers):
            headers = [*headers, ("Content-Length", str(len(body)))]
        head = f"{method} {target} HTTP/1.1\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in headers
        )
        # UTF-8: a header value outside latin-1 goes out as the bytes a client would send
        data = head.encode("utf-8") + b"\r\n" + body
        for attempt in range(2):
            try:
                return self._exchange(data, method)
            except (ConnectionError, _Closed):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _exchange(self, data: bytes, method: str) -> Reply:
        if self._sock is None:
            self._sock = socket.create_connection(("127.0.0.1", self.port), self.timeout_s)
        self._sock.sendall(data)
        head = self._read_until(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = 0 if method == "HEAD" else int(headers.get("content-length", "0"))
        body = self._read_exactly(length)
        if headers.get("connection", "").lower() == "close":
            self.close()
        return Reply(status, headers, body)

    def _fill(self) -> None:
        assert self._sock is not None
        chunk = self._sock.recv(65536)
        if not chunk:
            raise _Closed
        self._buffer += chunk

    def _read_until(self, marker: bytes) -> bytes:
        while marker not in self._buffer:
            self._fill()
        head, _, self._buffer = self._buffer.partition(marker)
        return head

    def _read_exactly(self, length: int) -> bytes:
        while len(self._buffer) < length:
            self._fill()
        data, self._buffer = self._buffer[:length], self._buffer[length:]
        return data


class _Closed(Exception):
    pass


def target(path: str, query: list[tuple[str, str]]) -> str:
    """The request target as the SDK writes it: the path, then the query percent-encoded."""
    if not query:
        return path
    return path + "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query)


def signed(
    version: Literal["v1", "v4"],
    method: str,
    host: str,
    path: str,
    query: list[tuple[str, str]],
    body: bytes = b"",
    *,
    key_id: str = "ak",
    secret: str = "sk",
    now_s: float | None = None,
    content_type: str = "application/json",
    extra: dict[str, str] | None = None,
) -> Headers:
    """Headers of a request signed as the SDK signs it (Host included, as it is sent)."""
    headers: dict[str, str] = {
        "host": host,
        "content-type": content_type,
        "x-log-apiversion": "0.6.0",
        "x-log-bodyrawsize": str(len(body)),
        **(extra or {}),
    }
    credentials = Credentials(key_id, secret)
    when = time.time() if now_s is None else now_s
    if version == "v1":
        sign_v1(method, path, query, headers, body, credentials, when)
    else:
        sign_v4(method, path, query, headers, body, credentials, "cn-hangzhou", when)
    return list(headers.items())


def replace_header(headers: Headers, name: str, value: str | None) -> Headers:
    """The headers with every copy of `name` replaced by one `value` (or removed if None)."""
    kept = [(n, v) for n, v in headers if n.lower() != name.lower()]
    return kept if value is None else [*kept, (name, value)]
