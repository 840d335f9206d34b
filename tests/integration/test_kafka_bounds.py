"""The Kafka listener's own bounds, against a real `loghub serve --kafka-port` over raw sockets.

A frame whose bytes stop coming is cut after the body timeout, while a slow one that keeps
coming is answered; stalled large frames from many connections hold a bounded amount of the
server's memory (later frames wait for room instead of being read); connections over the cap
are closed while the open ones carry on; and with access keys, a frame over 512 KiB before
authentication closes the connection without being read, while an authenticated client still
sends large records; and a Fetch asking for 2 GiB gets at most the server's pull bound. The
timeouts and bounds are small here so that the tests are quick.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from raw_sockets import closed_within, kafka_call, read_exactly
from server_process import ServerProcess, free_port

from loghub.client import LogHubClient
from loghub.wire.logs import make_log_group

BODY_TIMEOUT_S = 1.5
SLACK_S = 2.0
MIB = 1024 * 1024


def _start(data_dir: Path, *args: str, keys: dict[str, str] | None = None) -> ServerProcess:
    kafka_port = free_port()
    process = ServerProcess(
        data_dir, keys=keys, extra_args=("--kafka-port", str(kafka_port), *args)
    )
    process.kafka_port = kafka_port  # type: ignore[attr-defined]
    return process.start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = _start(
        tmp_path_factory.mktemp("kafka-bounds") / "data", f"--body-timeout-s={BODY_TIMEOUT_S}"
    )
    try:
        yield process
    finally:
        process.stop()


def _connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.kafka_port), timeout=10)  # type: ignore[attr-defined]


def _api_versions_frame(correlation_id: int) -> bytes:
    """ApiVersions v0: the request every client sends first (header v1, empty body)."""
    payload = struct.pack(">hhih", 18, 0, correlation_id, 4) + b"test"
    return struct.pack(">i", len(payload)) + payload


def _answered(sock: socket.socket, correlation_id: int) -> bool:
    """Whether the next answer on ``sock`` is the one to ``correlation_id``."""
    head = read_exactly(sock, 8)
    size, answered_id = struct.unpack(">ii", head)
    read_exactly(sock, size - 4)
    return bool(answered_id == correlation_id)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_frame_that_stops_coming_is_cut_within_the_body_timeout(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(struct.pack(">i", 1000) + b"\x00" * 10)  # then nothing
        started = time.monotonic()
        assert closed_within(sock, BODY_TIMEOUT_S + SLACK_S)
        assert time.monotonic() - started >= BODY_TIMEOUT_S * 0.8
    with _connect(server) as sock:  # the listener carries on
        sock.sendall(_api_versions_frame(1))
        assert _answered(sock, 1)


def test_a_slow_frame_that_keeps_coming_is_answered(server: ServerProcess) -> None:
    frame = _api_versions_frame(2)
    with _connect(server) as sock:
        # each step within the timeout, all of them well past it
        for start in range(0, len(frame), 4):
            sock.sendall(frame[start : start + 4])
            time.sleep(BODY_TIMEOUT_S * 0.6)
        assert _answered(sock, 2)


def test_stalled_large_frames_of_many_connections_hold_bounded_memory(
    server: ServerProcess,
) -> None:
    """Four connections each send all but the last byte of a 90 MiB frame. Without a bound on
    the bytes of frames in flight the server held all 360 MiB until the connections closed;
    with it, two frames are read and the others wait, unread, for room."""
    before = _rss_mib(server.pid)
    sockets = [_connect(server) for _ in range(4)]
    size = 90 * MIB

    def stall(sock: socket.socket) -> None:
        sock.settimeout(BODY_TIMEOUT_S + SLACK_S + 5)
        with contextlib.suppress(OSError):  # a waiting frame's send blocks, then is cut
            sock.sendall(struct.pack(">i", size) + b"\x00" * (size - 1))

    senders = [threading.Thread(target=stall, args=(sock,)) for sock in sockets]
    try:
        for sender in senders:
            sender.start()
        time.sleep(BODY_TIMEOUT_S * 0.6)  # the frames that got room are all in by now
        grown = _rss_mib(server.pid) - before
        assert grown < 260, f"the server grew by {grown:.0f} MiB for stalled frames"
        for sock in sockets:  # stalled or waiting: cut, and their room is given back
            assert closed_within(sock, BODY_TIMEOUT_S * 3 + SLACK_S)
        with _connect(server) as sock:
            sock.sendall(_api_versions_frame(3))
            assert _answered(sock, 3)
    finally:
        for sock in sockets:
            sock.close()
        for sender in senders:
            sender.join(30)


def test_kafka_connections_over_the_cap_are_closed_while_open_ones_work(tmp_path: Path) -> None:
    cap = 4
    capped = _start(tmp_path / "data", "--connections-max", str(cap))
    held: list[socket.socket] = []
    try:
        for _ in range(cap):
            held.append(_connect(capped))
        time.sleep(0.3)  # let the listener accept them all
        with _connect(capped) as extra:
            with contextlib.suppress(OSError):
                extra.sendall(_api_versions_frame(9))
            assert closed_within(extra, 2.0)
        for index, sock in enumerate(held):  # every connection within the cap still works
            sock.sendall(_api_versions_frame(index))
            assert _answered(sock, index)
        held.pop().close()
        time.sleep(0.3)
        with _connect(capped) as again:  # room again for a new connection
            again.sendall(_api_versions_frame(10))
            assert _answered(again, 10)
    finally:
        for sock in held:
            sock.close()
        capped.stop()


def test_before_sasl_a_frame_over_512_kib_is_refused_unread(tmp_path: Path) -> None:
    from confluent_kafka import Producer

    keyed = _start(tmp_path / "data", keys={"ak": "sk"})
    bootstrap = f"127.0.0.1:{keyed.kafka_port}"  # type: ignore[attr-defined]
    try:
        with _connect(keyed) as sock:
            sock.sendall(struct.pack(">i", 600 * 1024))  # the length alone is enough
            assert closed_within(sock, 2.0)
        with _connect(keyed) as sock:  # small frames before authentication are read
            sock.sendall(_api_versions_frame(4))
            assert _answered(sock, 4)
        sasl = {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "ak",
            "sasl.password": "sk",
        }
        with LogHubClient(keyed.endpoint, "ak", "sk") as client:
            client.create_project("bounds")
            client.create_logstore("bounds", "large", shard_count=1)
        # once authenticated, a client sends frames up to the full bound
        producer = Producer({**sasl, "compression.type": "none"})
        delivered: list[object] = []
        producer.produce(
            "bounds.large", value=b"x" * 700 * 1024, on_delivery=lambda e, m: delivered.append(e)
        )
        assert producer.flush(15) == 0
        assert delivered == [None]
    finally:
        keyed.stop()


def test_a_fetch_asking_for_2_gib_gets_at_most_the_pull_bound(tmp_path: Path) -> None:
    bound = MIB
    small = _start(tmp_path / "data", f"--pull-bytes-max={bound}")
    try:
        with LogHubClient(small.endpoint) as client:
            client.create_project("bounds")
            client.create_logstore("bounds", "big", shard_count=1)
            for index in range(12):  # about 300 KiB raw each, 3.6 MiB in all
                logs = [
                    (1_700_000_000, {"i": str(index), "pad": f"{n:06d}" * 5000}) for n in range(10)
                ]
                client.put_log_group("bounds", "big", make_log_group(logs), shard_id=0)
        request = {
            "ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 1, "MaxBytes": 2**31 - 1,
            "IsolationLevel": 0,
            "Topics": [{"Topic": "bounds.big", "Partitions": [
                {"Partition": 0, "FetchOffset": 0, "PartitionMaxBytes": 2**31 - 1},
            ]}],
        }  # fmt: skip
        with _connect(small) as sock:
            answer = kafka_call(sock, 1, 4, request)
        partition = answer["Responses"][0]["Partitions"][0]
        assert partition["ErrorCode"] == 0
        # the bound, plus at most the one group that crosses it
        assert 0 < len(partition["Records"]) < bound + 400 * 1024, len(partition["Records"])
        assert partition["HighWatermark"] > 0
    finally:
        small.stop()
