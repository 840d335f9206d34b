"""The server's own bounds, against a real `loghub serve` process over raw sockets.

Slow or silent clients are cut by the header, body and idle timeouts; connections over the
cap are answered 503 ServerBusy while the open ones carry on; request bodies wait for room in
the in-flight budget and get 503 with Retry-After when none comes; and six concurrent bodies
at the size limit grow the server by less than 256 MiB. Through
all of it the server keeps answering other clients. The timeouts are short here so that the
tests are quick; the defaults are in docs/configuration.md.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from raw_sockets import closed_within
from server_process import ServerProcess

from loghub.wire.logs import make_log_group, parse_log_group_list

HEADER_TIMEOUT_S = 1.5
BODY_TIMEOUT_S = 1.5
IDLE_TIMEOUT_S = 1.5
SLACK_S = 1.5
BUDGET_BYTES = 100_000
WAIT_S = 3.0  # longer than the body timeout: waiting for room must not count as a stall
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = (
        f"--header-timeout-s={HEADER_TIMEOUT_S}",
        f"--body-timeout-s={BODY_TIMEOUT_S}",
        f"--idle-timeout-s={IDLE_TIMEOUT_S}",
        f"--inflight-body-bytes-max={BUDGET_BYTES}",
        f"--inflight-wait-s={WAIT_S}",
    )
    process = ServerProcess(tmp_path_factory.mktemp("bounds") / "data", extra_args=args).start()
    try:
        yield process
    finally:
        process.stop()


def _healthy(server: ServerProcess) -> bool:
    with httpx.Client(trust_env=False, timeout=5) as http:
        return http.get(f"http://{server.endpoint}/health").status_code == 200


def _connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _head(path: str, length: int | None = None, host: str = "127.0.0.1") -> bytes:
    lines = [f"POST {path} HTTP/1.1" if length is not None else f"GET {path} HTTP/1.1"]
    lines.append(f"Host: {host}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_reply(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a reply: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
    while len(body) < int(headers.get("content-length", "0")):
        body += sock.recv(65536)
    return int(status_line.split()[1]), headers, body


def test_slow_header_client_is_cut_within_the_header_timeout(server: ServerProcess) -> None:
    request = _head("/health")
    with _connect(server) as sock:
        started = time.monotonic()
        cut = False
        for byte in request:  # one byte a second, as a slowloris client does
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            if closed_within(sock, 1.0):
                cut = True
                break
            assert _healthy(server)
        elapsed_s = time.monotonic() - started
    assert cut, "the slow client was never disconnected"
    assert elapsed_s < HEADER_TIMEOUT_S + SLACK_S, elapsed_s
    assert _healthy(server)


def test_connection_that_sends_nothing_is_cut(server: ServerProcess) -> None:
    with _connect(server) as sock:
        assert closed_within(sock, HEADER_TIMEOUT_S + SLACK_S)
    assert _healthy(server)


def test_idle_keep_alive_connection_is_closed(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(_head("/health"))
        status, headers, _ = _read_reply(sock)
        assert status == 200
        assert headers.get("connection") != "close"
        started = time.monotonic()
        assert closed_within(sock, IDLE_TIMEOUT_S + SLACK_S)
        assert time.monotonic() - started > IDLE_TIMEOUT_S - 0.5  # not cut right away
    assert _healthy(server)


def test_keep_alive_connection_in_use_is_kept(server: ServerProcess) -> None:
    with _connect(server) as sock:
        for _ in range(4):  # requests a little apart, together longer than one timeout
            sock.sendall(_head("/health"))
            assert _read_reply(sock)[0] == 200
            time.sleep(IDLE_TIMEOUT_S / 2)


def test_half_sent_body_is_cut_within_the_body_timeout(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(_head("/logstores/s/shards/lb", length=1000, host="p.127.0.0.1"))
        sock.sendall(b"x" * 500)
        started = time.monotonic()
        assert closed_within(sock, BODY_TIMEOUT_S + SLACK_S)
        assert time.monotonic() - started > BODY_TIMEOUT_S - 0.5
    assert _healthy(server)


def test_body_over_the_size_limit_gets_413_before_it_is_sent(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(_head("/logstores/s/shards/lb", length=31 * 1024 * 1024, host="p.127.0.0.1"))
        status, _, body = _read_reply(sock)
    assert status == 413
    assert json.loads(body)["errorCode"] == "PostBodyTooLarge"


def _gauge(server: ServerProcess, name: str) -> float:
    with httpx.Client(trust_env=False, timeout=5) as http:
        text = http.get(f"http://{server.endpoint}/metrics").text
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def _hold_the_budget(server: ServerProcess) -> socket.socket:
    """A connection whose request takes the whole body budget and keeps it: its body moves
    (a byte at a time, see _trickle) but never completes. Returns once the server says the
    budget is taken, so that a request sent next finds no room (on a busy machine a fixed
    pause was not always enough)."""
    holder = _connect(server)
    holder.sendall(_head("/logstores/s/shards/lb", length=BUDGET_BYTES, host="p.127.0.0.1"))
    holder.sendall(b"x" * 10)
    deadline = time.monotonic() + 10
    while _gauge(server, "loghub_http_body_bytes_in_use") < BUDGET_BYTES:
        assert time.monotonic() < deadline, "the holder's body never took the budget"
        # a byte a poll: on a busy machine the polls can take longer than the body timeout,
        # which would cut the holder and free the room the caller counts on
        holder.send(b"x")
        time.sleep(0.05)
    holder.send(b"x")  # the caller's body timeout starts now
    return holder


def _trickle(sock: socket.socket, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.send(b"x")
        time.sleep(0.25)


def test_body_without_room_waits_then_gets_503_with_retry_after(server: ServerProcess) -> None:
    with _hold_the_budget(server) as holder, _connect(server) as waiting:
        waiting.sendall(_head("/logstores/s/shards/lb", length=100, host="p.127.0.0.1"))
        waiting.sendall(b"y" * 100)
        started = time.monotonic()
        assert _healthy(server)  # a request without a body needs no room
        _trickle(holder, WAIT_S + 0.5)
        status, headers, body = _read_reply(waiting)
        assert status == 503
        assert headers["retry-after"] == "1"
        assert json.loads(body)["errorCode"] == "ServerBusy"
        assert WAIT_S - 0.5 < time.monotonic() - started < WAIT_S + 2.0
    # the holder was cut (or left): its room is free again, and the next body is let in
    with _connect(server) as sock:
        sock.sendall(_head("/logstores/s/shards/lb", length=100, host="p.127.0.0.1"))
        sock.sendall(b"z" * 100)
        status, _, body = _read_reply(sock)
    assert status == 404, body  # ProjectNotExist: past admission, into the API
    assert json.loads(body)["errorCode"] == "ProjectNotExist"


def test_connections_over_the_cap_get_503_while_open_ones_work(tmp_path: Path) -> None:
    cap = 4
    args = ("--connections-max", str(cap), "--header-timeout-s", "30")
    capped = ServerProcess(tmp_path / "data", extra_args=args).start()
    held: list[socket.socket] = []
    try:
        for _ in range(cap):
            held.append(_connect(capped))
        time.sleep(0.3)  # let the server accept them all
        with _connect(capped) as extra:
            extra.sendall(_head("/health"))
            try:
                status, headers, body = _read_reply(extra)
            except (ConnectionResetError, AssertionError):
                status = 0  # refused outright: also allowed
            if status:
                assert status == 503
                assert headers["retry-after"] == "1"
                assert json.loads(body)["errorCode"] == "ServerBusy"
            assert closed_within(extra, 2.0)
        for sock in held:  # every connection within the cap still works
            sock.sendall(_head("/health"))
            assert _read_reply(sock)[0] == 200
        held.pop().close()
        time.sleep(0.3)
        assert _healthy(capped)  # room again for a new connection
    finally:
        for sock in held:
            sock.close()
        capped.stop()


def test_six_bodies_at_the_limit_grow_the_server_by_less_than_256_mib() -> None:
    """benchmarks/big_bodies.py at its defaults: six clients, 30 MiB uncompressed each."""
    run = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "big_bodies.py"), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    print(run.stdout.strip().splitlines()[0])
    assert figures["body_bytes"] > 29 * 1024 * 1024
    assert figures["stored"] == 6, figures["statuses"]
    assert figures["growth_bytes"] < 256 * 1024 * 1024, figures


def test_lowering_the_body_limits_keeps_larger_stored_records(tmp_path: Path) -> None:
    """A record stored under a higher limit is data, not damage, after a restart with a
    lower one (the stored-record bound has a floor at the old 32 MiB default)."""
    headers = {"host": "lowered.127.0.0.1"}
    body = make_log_group([(1_700_000_000, {"line": "x" * 2_000_000})]).SerializeToString()
    server = ServerProcess(tmp_path / "data").start()
    try:
        with httpx.Client(trust_env=False, timeout=30, base_url=f"http://{server.endpoint}") as h:
            assert h.post("/", headers=headers, json={"projectName": "lowered"}).is_success
            reply = h.post(
                "/logstores",
                headers=headers,
                json={"logstoreName": "store", "shardCount": 1, "ttl": 1},
            )
            assert reply.is_success, reply.text
            put_headers = {**headers, "x-log-bodyrawsize": str(len(body))}
            for _ in range(2):
                reply = h.post("/logstores/store/shards/0", headers=put_headers, content=body)
                assert reply.is_success, reply.text
    finally:
        server.kill()  # a crash: the restart runs recovery over the active segment
    limit = str(1024 * 1024)
    server = ServerProcess(
        tmp_path / "data",
        extra_args=("--request-body-bytes-max", limit, "--raw-body-bytes-max", limit),
    ).start()
    try:
        with httpx.Client(trust_env=False, timeout=30, base_url=f"http://{server.endpoint}") as h:
            shard = "/logstores/store/shards/0"
            cursor = h.get(shard, headers=headers, params={"type": "cursor", "from": "begin"})
            reply = h.get(
                shard,
                headers={**headers, "accept-encoding": ""},
                params={"type": "log", "cursor": cursor.json()["cursor"], "count": "10"},
            )
            assert reply.status_code == 200, reply.text
            assert reply.headers["x-log-count"] == "2"
            groups = parse_log_group_list(reply.content).LogGroups
            assert [g.SerializeToString() for g in groups] == [body, body]
    finally:
        server.stop()


def test_body_waiting_for_room_is_not_cut_as_stalled(server: ServerProcess) -> None:
    """A large body the server stopped reading (no room yet) outlives the body timeout, and
    is read and answered once the room is free."""
    body = b"y" * (4 * 1024 * 1024)  # well over what the server and the kernel buffer
    with _hold_the_budget(server) as holder, _connect(server) as waiting:
        # a send buffer of fixed size: the kernel's autotuning grows it up to tcp_wmem's
        # maximum (4 MiB here), which then held the whole body without the server reading it
        waiting.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 * 1024)
        waiting.sendall(_head("/logstores/s/shards/lb", length=len(body), host="p.127.0.0.1"))
        waiting.setblocking(False)
        sent = 0
        with contextlib.suppress(BlockingIOError):
            while sent < len(body):
                sent += waiting.send(body[sent : sent + 65536])
        waiting.setblocking(True)
        assert sent < len(body), "the server read the whole body while it had no room"
        _trickle(holder, BODY_TIMEOUT_S + 1.0)
        holder.close()  # the room is free: the waiting body is let in and read to the end
        waiting.sendall(body[sent:])
        status, _, reply = _read_reply(waiting)
    assert status == 404, reply  # ProjectNotExist: it got past admission, whole
    assert json.loads(reply)["errorCode"] == "ProjectNotExist"
