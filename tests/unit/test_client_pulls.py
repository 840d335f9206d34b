"""Pulls over the client's own kept-alive connections (``loghub.client._pulls``), against a
scripted HTTP peer on a loopback port: a connection the server closed while it was idle is
replaced once, a peer that never answers is an error, error replies raise their class,
connections are reused until the client closes."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from loghub.client import LogHubClient
from loghub.errors import LogStoreNotExist, TransportError

_REPLY_HEADERS = (
    b"x-log-cursor: MTA=\r\nx-log-count: 2\r\nx-log-bodyrawsize: 5\r\n"
    b"x-log-compresstype: \r\ncontent-type: application/x-protobuf\r\n"
)


def _ok(body: bytes = b"hello") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\n" + _REPLY_HEADERS
        + b"content-length: %d\r\n\r\n" % len(body) + body
    )  # fmt: skip


class Peer:
    """Accepts connections and hands each to ``serve(connection, index)`` on a thread."""

    def __init__(self, serve: Callable[[socket.socket, int], None]) -> None:
        self._serve = serve
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            index = self.connections
            self.connections += 1
            threading.Thread(target=self._run, args=(connection, index), daemon=True).start()

    def _run(self, connection: socket.socket, index: int) -> None:
        with connection:
            self._serve(connection, index)

    def read_request(self, connection: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = connection.recv(65536)
            if not chunk:
                return False
            data += chunk
        self.requests.append(data)
        return True

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def peer_factory() -> Iterator[Callable[[Callable[[socket.socket, int], None]], Peer]]:
    peers: list[Peer] = []

    def make(serve: Callable[[socket.socket, int], None]) -> Peer:
        peers.append(Peer(serve))
        return peers[-1]

    yield make
    for peer in peers:
        peer.close()


def _pull(client: LogHubClient) -> bytes:
    return client.pull_logs_body("p", "store", 0, "MA==", compress_type="").body


def test_a_kept_connection_closed_while_idle_is_replaced_once(
    peer_factory: Callable[[Callable[[socket.socket, int], None]], Peer],
) -> None:
    def serve(connection: socket.socket, index: int) -> None:
        # one reply kept alive, then the connection is closed as an idle timeout would
        if peer.read_request(connection):
            connection.sendall(_ok(b"reply%d" % index))

    peer = peer_factory(serve)
    with LogHubClient(f"127.0.0.1:{peer.port}", timeout_s=5) as client:
        assert _pull(client) == b"reply0"
        assert _pull(client) == b"reply1"  # the first connection had been closed
        assert peer.connections == 2
        pulled = client.pull_logs_body("p", "store", 0, "MA==", compress_type="")
        assert (pulled.count, pulled.raw_size, pulled.next_cursor) == (2, 5, "MTA=")
    request = peer.requests[0].decode()
    assert request.startswith("GET /logstores/store/shards/0?type=log&cursor=MA%3D%3D&count=1000 ")
    assert "host: p.127.0.0.1\r\n" in request.lower()


def test_every_kept_connection_closed_while_idle_is_passed_over(
    peer_factory: Callable[[Callable[[socket.socket, int], None]], Peer],
) -> None:
    """After a long pause all kept connections may be stale: a pull goes on to the next
    one, then to a new one, rather than failing on the second."""
    both_connected = threading.Barrier(2, timeout=10)

    def serve(connection: socket.socket, index: int) -> None:
        if peer.read_request(connection):
            if index < 2:
                both_connected.wait()  # two pulls in flight at once: two kept connections
            connection.sendall(_ok(b"reply%d" % index))
        # then closed, as an idle timeout would

    peer = peer_factory(serve)
    with LogHubClient(f"127.0.0.1:{peer.port}", timeout_s=5) as client:
        results: list[bytes] = []
        pulls = [threading.Thread(target=lambda: results.append(_pull(client))) for _ in range(2)]
        for pull in pulls:
            pull.start()
        for pull in pulls:
            pull.join(10)
        assert sorted(results) == [b"reply0", b"reply1"]
        assert _pull(client) == b"reply2"  # both kept ones were stale
    assert peer.connections == 3


def test_replies_on_one_kept_connection_reuse_it_until_the_client_closes(
    peer_factory: Callable[[Callable[[socket.socket, int], None]], Peer],
) -> None:
    def serve(connection: socket.socket, index: int) -> None:
        while peer.read_request(connection):
            connection.sendall(_ok())

    peer = peer_factory(serve)
    client = LogHubClient(f"127.0.0.1:{peer.port}", timeout_s=5)
    for _ in range(5):
        assert _pull(client) == b"hello"
    assert peer.connections == 1 and len(peer.requests) == 5
    client.close()
    with pytest.raises(TransportError, match="closed"):
        _pull(client)


def test_a_new_connection_closed_without_a_reply_is_an_error_not_a_loop(
    peer_factory: Callable[[Callable[[socket.socket, int], None]], Peer],
) -> None:
    def serve(connection: socket.socket, index: int) -> None:
        peer.read_request(connection)  # and close without answering

    peer = peer_factory(serve)
    client = LogHubClient(f"127.0.0.1:{peer.port}", timeout_s=5)
    with client, pytest.raises(TransportError, match="GET /logstores/store/shards/0"):
        _pull(client)
    assert peer.connections == 1


def test_a_peer_that_never_answers_times_out(
    peer_factory: Callable[[Callable[[socket.socket, int], None]], Peer],
) -> None:
    release = threading.Event()

    def serve(connection: socket.socket, index: int) -> None:
        peer.read_request(connection)
        release.wait(10)

    peer = peer_factory(serve)
    try:
        client = LogHubClient(f"127.0.0.1:{peer.port}", timeout_s=0.5)
        with client, pytest.raises(TransportError, match="timed out"):
            _pull(client)
    finally:
        release.set()
    assert peer.connections == 1  # a timeout is not retried


def test_a_short_body_is_an_error(
    peer_factory: Callable[[Callable[[socket.socket, int], None]], Peer],
) -> None:
    def serve(connection: socket.socket, index: int) -> None:
        if peer.read_request(connection):
            connection.sendall(_ok(b"0123456789")[:-4])  # then closed mid-body

    peer = peer_factory(serve)
    client = LogHubClient(f"127.0.0.1:{peer.port}", timeout_s=5)
    with client, pytest.raises(TransportError, match="IncompleteRead"):
        _pull(client)


def test_an_error_reply_raises_its_class_and_keeps_the_connection(
    peer_factory: Callable[[Callable[[socket.socket, int], None]], Peer],
) -> None:
    body = b'{"errorCode": "LogStoreNotExist", "errorMessage": "logstore store does not exist"}'

    def serve(connection: socket.socket, index: int) -> None:
        while peer.read_request(connection):
            connection.sendall(
                b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
                b"x-log-requestid: R1\r\ncontent-length: %d\r\n\r\n" % len(body) + body
            )

    peer = peer_factory(serve)
    with LogHubClient(f"127.0.0.1:{peer.port}", timeout_s=5) as client:
        for _ in range(2):
            with pytest.raises(LogStoreNotExist, match="does not exist"):
                _pull(client)
    assert peer.connections == 1
