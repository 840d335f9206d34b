"""Reading a plain socket the way tests of the server's bounds need: exactly so many bytes,
or whether the server closed the connection within a time."""

from __future__ import annotations

import select
import socket
import time


def read_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes; ``ConnectionError`` when the server closes before them."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def closed_within(sock: socket.socket, timeout_s: float) -> bool:
    """True when the server closes the connection within timeout_s (any reply is drained)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
        if not readable:
            continue
        try:
            if not sock.recv(65536):
                return True
        except ConnectionResetError:
            return True
    return False
