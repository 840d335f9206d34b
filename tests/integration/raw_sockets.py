"""Plain sockets as tests of the server need them: exactly so many bytes, whether the server
closed the connection within a time, and one Kafka request and its answer."""

from __future__ import annotations

import select
import socket
import struct
import time
from typing import Any

from loghub.wire.kafka.codec import decode_response, encode_request


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


def kafka_call(
    sock: socket.socket, api_key: int, version: int, body: dict[str, Any]
) -> dict[str, Any]:
    """Sends one Kafka request (client id "test", correlation id 7) and reads its answer."""
    header = struct.pack(">hhih", api_key, version, 7, 4) + b"test"
    flexible = (api_key, version) in {(0, 9), (2, 7)}
    payload = header + (b"\x00" if flexible else b"") + encode_request(api_key, version, body)
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    size = struct.unpack(">i", read_exactly(sock, 4))[0]
    frame = read_exactly(sock, size)
    return decode_response(api_key, version, frame[4 + (1 if flexible else 0) :])
