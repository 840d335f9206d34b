"""The systems LogHub is measured beside, started and stopped by the benchmark itself.

Redis (Debian's ``redis-server``) runs on a loopback port with its data in a temp directory,
either in memory (no persistence) or with ``appendfsync always`` (an fsync before every
reply: the durability LogHub gives an acknowledged write). NATS (Debian's ``nats-server``)
runs with JetStream on (``-js``) and its store in a temp directory; its streams use file
storage. The benchmark keeps the PID it started and stops exactly that process.

The clients are the ones a Python user of each system would use, each given its best chance:
Redis gets pipelined ``XADD`` commands encoded before the timed part (as LogHub's producers
send bodies built before it); its XRANGE replies are counted off the socket in C, not
decoded (LogHub's readers do not decode theirs either), and XREADGROUP goes through redis-py's
reader (with ``hiredis`` when installed); NATS gets
``nats-py`` publishing a whole batch with ``publish_async`` before awaiting the acks. A log is
the same JSON entry for both (``_common.log_json``), made from the very logs LogHub is sent.
Producers and readers are separate processes, as many as LogHub's, each timed on the same
window, and the server's own CPU is read from /proc so that a reader can tell whether the
peer or its Python client was the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import cpu_seconds_of, free_port, stop_process

NATS_STREAM = "BENCH"


def _binary(name: str, fallback: str) -> str:
    path = shutil.which(name) or fallback
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{name} is missing: `make system-deps` installs it")
    return path


def redis_server_binary() -> str:
    return _binary("redis-server", "/usr/bin/redis-server")


def nats_server_binary() -> str:
    return _binary("nats-server", "/usr/sbin/nats-server")


class _PeerServer:
    """A server child on 127.0.0.1 with its data in a temp directory removed at stop()."""

    name = "peer"

    def __init__(self, data_parent: str | None = None) -> None:
        self.port = free_port()
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"loghub-bench-{self.name}-", dir=data_parent))
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> _PeerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def args(self) -> list[str]:
        raise NotImplementedError

    def ready(self, sock: socket.socket) -> bool:
        raise NotImplementedError

    def start(self, timeout_s: float = 20.0) -> _PeerServer:
        log_file = open(self.data_dir / f"{self.name}.log", "ab")  # noqa: SIM115 (closed in stop)
        self._log_file = log_file
        self.proc = subprocess.Popen(self.args(), stdout=log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock,
            ):
                if self.ready(sock):
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer in {timeout_s} s")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc)
        with contextlib.suppress(AttributeError, OSError):
            self._log_file.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


class RedisServer(_PeerServer):
    """``redis-server`` on 127.0.0.1; ``durable=True`` is AOF with ``appendfsync always``."""

    name = "redis"

    def __init__(self, durable: bool, data_parent: str | None = None) -> None:
        super().__init__(data_parent)
        self.durable = durable

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def args(self) -> list[str]:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.durable
            else ["--appendonly", "no"]
        )
        return [
            redis_server_binary(), "--bind", "127.0.0.1", "--port", str(self.port),
            "--dir", str(self.data_dir), "--save", "", "--daemonize", "no",
            "--protected-mode", "yes", "--loglevel", "warning", *persistence,
        ]  # fmt: skip

    def ready(self, sock: socket.socket) -> bool:
        sock.sendall(b"PING\r\n")
        return sock.recv(64).startswith(b"+PONG")


class NatsServer(_PeerServer):
    """``nats-server -js`` on 127.0.0.1 with its JetStream store in the temp directory.

    Debian's nats-server 2.9 writes file storage through the page cache and syncs it on a
    timer (every 2 minutes by default; ``sync_interval: always`` only exists from 2.10), so
    its acknowledgement is weaker than LogHub's fsync-before-ack: the reports say so."""

    name = "nats"

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def args(self) -> list[str]:
        return [
            nats_server_binary(), "-js", "-sd", str(self.data_dir / "store"),
            "-a", "127.0.0.1", "-p", str(self.port),
        ]  # fmt: skip

    def ready(self, sock: socket.socket) -> bool:
        return sock.recv(64).startswith(b"INFO")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


# --- payloads -----------------------------------------------------------------------------


def resp_command(*parts: bytes) -> bytes:
    """One Redis command in RESP, as a client library sends it."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


@dataclass(frozen=True)
class PeerBatch:
    entries: list[bytes]  # one JSON log each
    payload_bytes: int  # sum of the entries' lengths
    packed: bytes = b""  # the batch's pipelined XADDs (Redis), encoded ahead


def redis_batches(entries_by_batch: list[list[bytes]], key: bytes) -> list[PeerBatch]:
    return [
        PeerBatch(
            entries,
            sum(map(len, entries)),
            b"".join(resp_command(b"XADD", key, b"*", b"log", entry) for entry in entries),
        )
        for entries in entries_by_batch
    ]


def plain_batches(entries_by_batch: list[list[bytes]]) -> list[PeerBatch]:
    return [PeerBatch(entries, sum(map(len, entries))) for entries in entries_by_batch]


# --- timed producers ----------------------------------------------------------------------


@dataclass
class WorkerResult:
    batches: int = 0  # acknowledged inside the window
    logs: int = 0
    payload_bytes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0


@dataclass
class PeerRun:
    workers: list[WorkerResult]
    window_s: float
    server_cpu_s: float

    @property
    def logs(self) -> int:
        return sum(w.logs for w in self.workers)

    @property
    def payload_bytes(self) -> int:
        return sum(w.payload_bytes for w in self.workers)

    @property
    def errors(self) -> dict[str, int]:
        merged: dict[str, int] = {}
        for worker in self.workers:
            for key, value in worker.errors.items():
                merged[key] = merged.get(key, 0) + value
        return merged


def _count(result: WorkerResult, batch: PeerBatch, finished: float,
           window: tuple[float, float]) -> None:  # fmt: skip
    """Counts a batch acknowledged inside the window, whenever it was sent: a client that
    takes seconds per batch (nats-py) would otherwise lose most of a short window, while for
    fast ones it makes no difference."""
    if window[0] <= finished <= window[1]:
        result.batches += 1
        result.logs += len(batch.entries)
        result.payload_bytes += batch.payload_bytes


def _redis_producer(port: int, index: int, batches: list[PeerBatch], window: tuple[float, float],
                    max_batches: int | None, out: Any) -> None:  # fmt: skip
    """Sends each batch as one pipeline of XADDs and reads every reply before the next."""
    import redis

    result = WorkerResult()
    cpu_start = time.process_time()
    conn = redis.Connection(host="127.0.0.1", port=port, socket_timeout=120)
    try:
        conn.connect()
        position = index * 5
        sent = 0
        while max_batches is None or sent < max_batches:
            started = time.monotonic()
            if max_batches is None and started >= window[1]:
                break
            batch = batches[position % len(batches)]
            position += 1
            conn.send_packed_command([batch.packed], check_health=False)
            for _ in batch.entries:
                conn.read_response()
            sent += 1
            _count(result, batch, time.monotonic(), window)
    except Exception as exc:  # reported by the parent
        result.errors[repr(exc)[:200]] = result.errors.get(repr(exc)[:200], 0) + 1
    finally:
        conn.disconnect()
        result.cpu_s = time.process_time() - cpu_start
        out.put((index, result))


def _nats_producer(port: int, index: int, subject: str, batches: list[PeerBatch],
                   window: tuple[float, float], max_batches: int | None,
                   out: Any) -> None:  # fmt: skip
    """Publishes each batch with ``publish_async`` and awaits all its acks before the next."""
    result = WorkerResult()
    cpu_start = time.process_time()

    async def produce() -> None:
        import nats

        nc = await nats.connect(f"nats://127.0.0.1:{port}", max_reconnect_attempts=0)
        largest = max(len(b.entries) for b in batches)
        js = nc.jetstream(publish_async_max_pending=largest, timeout=60)
        try:
            position = index * 5
            sent = 0
            while max_batches is None or sent < max_batches:
                started = time.monotonic()
                if max_batches is None and started >= window[1]:
                    break
                batch = batches[position % len(batches)]
                position += 1
                futures = [await js.publish_async(subject, entry) for entry in batch.entries]
                await asyncio.gather(*futures)
                sent += 1
                _count(result, batch, time.monotonic(), window)
        finally:
            await nc.close()

    try:
        asyncio.run(produce())
    except Exception as exc:  # reported by the parent
        result.errors[repr(exc)[:200]] = result.errors.get(repr(exc)[:200], 0) + 1
    finally:
        result.cpu_s = time.process_time() - cpu_start
        out.put((index, result))


class _NatsWire:
    """The NATS client protocol over one socket, as lean as Python allows: what a client in a
    compiled language does, so that JetStream itself is measured rather than nats-py."""

    def __init__(self, port: int, subscribe: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.buffer = b""
        self.pos = 0  # of the first byte not read yet: no copy of the buffer per message
        self._line()  # INFO
        connect = b'{"verbose":false,"pedantic":false,"headers":true,"no_responders":true}'
        self.sock.sendall(b"CONNECT " + connect + b"\r\nSUB " + subscribe.encode()
                          + b" 1\r\nPING\r\n")  # fmt: skip
        while self._line() != b"PONG":
            pass

    def _fill(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("nats-server closed the connection")
        self.buffer = self.buffer[self.pos :] + data  # what is left is short: a cheap copy
        self.pos = 0

    def _line(self) -> bytes:
        while (end := self.buffer.find(b"\r\n", self.pos)) < 0:
            self._fill()
        line, self.pos = self.buffer[self.pos : end], end + 2
        return line

    def _payload(self, size: int) -> bytes:
        while len(self.buffer) - self.pos < size + 2:
            self._fill()
        start, self.pos = self.pos, self.pos + size + 2
        return self.buffer[start : start + size]

    def next_message(self) -> tuple[bool, bytes]:
        """(has headers, payload) of the next MSG or HMSG; answers PINGs on the way."""
        while True:
            line = self._line()
            if line.startswith(b"MSG "):
                return False, self._payload(int(line.rsplit(b" ", 1)[1]))
            if line.startswith(b"HMSG "):
                return True, self._payload(int(line.rsplit(b" ", 1)[1]))
            if line == b"PING":
                self.sock.sendall(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise RuntimeError(line.decode(errors="replace"))

    def close(self) -> None:
        self.sock.close()


def nats_publishes(subject: str, reply: str, entries: list[bytes]) -> bytes:
    """A batch of JetStream publishes (PUB with a reply subject for the ack), encoded ahead."""
    head = f"PUB {subject} {reply} ".encode()
    return b"".join(b"%s%d\r\n%s\r\n" % (head, len(entry), entry) for entry in entries)


def _nats_wire_producer(port: int, index: int, subject: str, batches: list[PeerBatch],
                        window: tuple[float, float], max_batches: int | None,
                        out: Any) -> None:  # fmt: skip
    """Sends a batch's publishes in one write, then reads one ack per message."""
    result = WorkerResult()
    cpu_start = time.process_time()
    reply = f"_ACK.{index}"
    packed = [nats_publishes(subject, reply, batch.entries) for batch in batches]
    wire = None
    try:
        wire = _NatsWire(port, reply)
        position = index * 5
        sent = 0
        while max_batches is None or sent < max_batches:
            started = time.monotonic()
            if max_batches is None and started >= window[1]:
                break
            batch = batches[position % len(batches)]
            wire.sock.sendall(packed[position % len(batches)])
            position += 1
            for _ in batch.entries:
                has_headers, ack = wire.next_message()
                if has_headers or b'"error"' in ack:
                    raise RuntimeError(f"publish refused: {ack[:200]!r}")
            sent += 1
            _count(result, batch, time.monotonic(), window)
    except Exception as exc:  # reported by the parent
        result.errors[repr(exc)[:200]] = result.errors.get(repr(exc)[:200], 0) + 1
    finally:
        if wire is not None:
            wire.close()
        result.cpu_s = time.process_time() - cpu_start
        out.put((index, result))


def _run_workers(server_pid: int, producers: int, target: Callable[..., None],
                 args_of: Callable[[int], tuple[Any, ...]], warmup_s: float,
                 seconds: float | None, max_batches: int | None) -> PeerRun:  # fmt: skip
    """Timed (warm-up, then ``seconds`` counted) or count-bounded (``max_batches`` each, all
    counted, the window being the wall time); server CPU over the same window."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start_at = time.monotonic() + 0.5
    if max_batches is None:
        assert seconds is not None
        window = (start_at + warmup_s, start_at + warmup_s + seconds)
    else:
        window = (0.0, float("inf"))
    processes = [
        ctx.Process(target=target, args=(*args_of(i), window, max_batches, out), daemon=True)
        for i in range(producers)
    ]
    for process in processes:
        process.start()
    try:
        if max_batches is None:
            time.sleep(max(0.0, window[0] - time.monotonic()))
            cpu_before = cpu_seconds_of(server_pid)
            time.sleep(max(0.0, window[1] - time.monotonic()))
            cpu_after = cpu_seconds_of(server_pid)
            window_s = window[1] - window[0]
        else:
            cpu_before = cpu_seconds_of(server_pid)
            wall_start = time.monotonic()
        results: dict[int, WorkerResult] = {}
        while len(results) < producers:
            index, result = out.get(timeout=600)
            results[index] = result
        if max_batches is not None:
            window_s = time.monotonic() - wall_start
            cpu_after = cpu_seconds_of(server_pid)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGKILL)
                process.join(timeout=10)
    return PeerRun([results[i] for i in range(producers)], window_s, cpu_after - cpu_before)


def redis_stream_key(index: int, streams: int) -> bytes:
    return b"bench-%d" % (index % streams)


def redis_ingest(server: RedisServer, batches_by_stream: list[list[PeerBatch]], producers: int,
                 *, warmup_s: float = 0.0, seconds: float | None = None,
                 batches_each: int | None = None) -> PeerRun:  # fmt: skip
    """Producer i appends to stream ``bench-<i % streams>`` (the batches of that stream)."""
    streams = len(batches_by_stream)
    return _run_workers(
        server.pid, producers, _redis_producer,
        lambda i: (server.port, i, batches_by_stream[i % streams]),
        warmup_s, seconds, batches_each,
    )  # fmt: skip


def nats_subject(index: int, streams: int) -> str:
    return f"bench.{index % streams}"


async def nats_create_stream(url: str, timeout_s: float = 20.0) -> None:
    """The JetStream stream ``BENCH`` on ``bench.*``, file storage; retried while JetStream
    is still starting."""
    import nats
    from nats.js.api import StorageType, StreamConfig

    deadline = time.monotonic() + timeout_s
    nc = await nats.connect(url, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        while True:
            try:
                await js.add_stream(
                    StreamConfig(name=NATS_STREAM, subjects=["bench.*"], storage=StorageType.FILE)
                )
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
    finally:
        await nc.close()


def nats_ingest(server: NatsServer, batches: list[PeerBatch], producers: int, streams: int,
                *, warmup_s: float = 0.0, seconds: float | None = None,
                batches_each: int | None = None, client: str = "nats-py") -> PeerRun:  # fmt: skip
    """Producer i publishes to subject ``bench.<i % streams>`` of the one stream, with
    nats-py (``client="nats-py"``) or the lean protocol client (``client="wire"``)."""
    asyncio.run(nats_create_stream(server.url))
    return _run_workers(
        server.pid, producers, _nats_producer if client == "nats-py" else _nats_wire_producer,
        lambda i: (server.port, i, nats_subject(i, streams), batches),
        warmup_s, seconds, batches_each,
    )  # fmt: skip


# --- catch-up readers ---------------------------------------------------------------------


_ENTRY_FIELD = b"*2\r\n$3\r\nlog\r\n$"  # what precedes each entry's value (no JSON holds CR LF)


def read_resp_xrange(sock: socket.socket, buffer: bytearray) -> tuple[int, bytes]:
    """Reads one XRANGE reply of entries with the one field ``log``; returns (entries, last
    id). Counts the entries' field markers with ``bytes.count`` (in C) instead of walking the
    reply in Python, so that the reader costs about what LogHub's (lz4 plus headers) does."""
    while b"\r\n" not in buffer:
        buffer.extend(sock.recv(1 << 20) or b"")
    header_end = buffer.index(b"\r\n")
    if buffer[:1] != b"*":
        raise RuntimeError(f"XRANGE answered {bytes(buffer[:200])!r}")
    count = int(buffer[1:header_end])
    if count == 0:
        del buffer[: header_end + 2]
        return 0, b""
    seen, scanned = 0, header_end
    while True:
        seen += buffer.count(_ENTRY_FIELD, max(header_end, scanned - len(_ENTRY_FIELD) + 1))
        scanned = len(buffer)
        if seen == count:
            last = buffer.rfind(_ENTRY_FIELD)
            length_end = buffer.find(b"\r\n", last + len(_ENTRY_FIELD))
            if length_end > 0:
                value_length = int(buffer[last + len(_ENTRY_FIELD) : length_end])
                reply_end = length_end + 2 + value_length + 2
                if len(buffer) >= reply_end:
                    id_start = buffer.rfind(b"\r\n", 0, last - 2) + 2
                    last_id = bytes(buffer[id_start : last - 2])
                    del buffer[:reply_end]
                    return count, last_id
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        buffer.extend(chunk)


def _redis_reader(port: int, key: bytes, mode: str, group: bytes, count: int, start_at: float,
                  out: Any) -> None:  # fmt: skip
    """Reads a stream from its first entry to its last, ``count`` entries a command:
    ``XRANGE`` from the last ID seen, or ``XREADGROUP ... >`` of a new group. XRANGE replies
    are read off the socket and their entries counted in C (``read_resp_xrange``), as
    LogHub's readers only decompress their replies: neither side decodes entries in Python.
    XREADGROUP goes through redis-py (and hiredis), which builds every entry's objects."""
    if mode == "xrange":
        _redis_xrange_reader(port, key, count, start_at, out)
        return
    import redis

    conn = redis.Connection(host="127.0.0.1", port=port, socket_timeout=120)
    entries = 0
    error = ""
    try:
        conn.connect()
        if mode == "xreadgroup":
            conn.send_command("XGROUP", "CREATE", key, group, "0")
            conn.read_response()
        time.sleep(max(0.0, start_at - time.monotonic()))
        started = time.monotonic()
        last = b"-"
        while True:
            if mode == "xrange":
                conn.send_command("XRANGE", key, last, "+", "COUNT", count)
                reply = conn.read_response()
                if not reply:
                    break
                last = b"(" + reply[-1][0]
            else:
                conn.send_command(
                    "XREADGROUP", "GROUP", group, "c", "COUNT", count, "STREAMS", key, ">"
                )
                streams = conn.read_response()  # a map (RESP3) or [[key, entries]]
                if isinstance(streams, dict):
                    reply = next(iter(streams.values()), None)
                else:
                    reply = streams[0][1] if streams else None
                if not reply:
                    break
            entries += len(reply)
        elapsed = time.monotonic() - started
    except Exception as exc:  # reported by the parent
        error, elapsed = repr(exc)[:300], 0.0
    finally:
        conn.disconnect()
    out.put((entries, elapsed, error))


def _redis_xrange_reader(port: int, key: bytes, count: int, start_at: float, out: Any) -> None:
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    buffer = bytearray()
    entries = 0
    error = ""
    try:
        time.sleep(max(0.0, start_at - time.monotonic()))
        started = time.monotonic()
        last = b"-"
        while True:
            sock.sendall(resp_command(b"XRANGE", key, last, b"+", b"COUNT", b"%d" % count))
            found, last_id = read_resp_xrange(sock, buffer)
            if not found:
                break
            entries += found
            last = b"(" + last_id
        elapsed = time.monotonic() - started
    except Exception as exc:  # reported by the parent
        error, elapsed = repr(exc)[:300], 0.0
    finally:
        sock.close()
    out.put((entries, elapsed, error))


def _nats_reader(port: int, subject: str, durable: str, expected: int, count: int,
                 start_at: float, out: Any) -> None:  # fmt: skip
    """A JetStream pull consumer (no acks, from the first message) on one subject, fetching
    ``count`` messages a request until it has all ``expected``."""

    async def read() -> tuple[int, float]:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        nc = await nats.connect(f"nats://127.0.0.1:{port}", max_reconnect_attempts=0)
        try:
            js = nc.jetstream(timeout=60)
            config = ConsumerConfig(
                ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, max_waiting=16
            )
            sub = await js.pull_subscribe(subject, durable, stream=NATS_STREAM, config=config)
            await asyncio.sleep(max(0.0, start_at - time.monotonic()))
            started = time.monotonic()
            got = 0
            while got < expected:
                got += len(await sub.fetch(min(count, expected - got), timeout=30))
            return got, time.monotonic() - started
        finally:
            await nc.close()

    try:
        got, elapsed = asyncio.run(read())
        out.put((got, elapsed, ""))
    except Exception as exc:  # reported by the parent
        out.put((0, 0.0, repr(exc)[:300]))


def _nats_wire_reader(port: int, subject: str, durable: str, expected: int, count: int,
                      start_at: float, out: Any) -> None:  # fmt: skip
    """The pull consumer ``durable`` (made by the parent) read over the lean protocol client:
    one ``CONSUMER.MSG.NEXT`` request of ``count`` messages at a time."""
    inbox = f"_PULL.{durable}"

    def pull(batch: int) -> bytes:
        request = json.dumps({"batch": batch, "expires": 30_000_000_000}).encode()
        return b"PUB $JS.API.CONSUMER.MSG.NEXT.%s.%s %s %d\r\n%s\r\n" % (
            NATS_STREAM.encode(), durable.encode(), inbox.encode(), len(request), request,
        )  # fmt: skip

    full = pull(count)
    wire = None
    try:
        wire = _NatsWire(port, inbox)
        time.sleep(max(0.0, start_at - time.monotonic()))
        started = time.monotonic()
        got = 0
        while got < expected:
            batch = min(count, expected - got)
            wire.sock.sendall(full if batch == count else pull(batch))
            for _ in range(batch):
                has_headers, _payload = wire.next_message()
                if has_headers:  # a status (404 no messages, 408 timeout): this pull is over
                    break
                got += 1
        out.put((got, time.monotonic() - started, ""))
    except Exception as exc:  # reported by the parent
        out.put((0, 0.0, repr(exc)[:300]))
    finally:
        if wire is not None:
            wire.close()


async def nats_create_consumers(url: str, durables: list[tuple[str, str]]) -> None:
    """Pull consumers (durable, subject) from the first message, without acks."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await nats.connect(url, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=60)
        for durable, subject in durables:
            await js.add_consumer(
                NATS_STREAM,
                ConsumerConfig(
                    durable_name=durable, ack_policy=AckPolicy.NONE,
                    deliver_policy=DeliverPolicy.ALL, filter_subject=subject,
                ),
            )  # fmt: skip
    finally:
        await nc.close()


@dataclass
class ReadPass:
    entries: int
    wall_s: float  # the slowest reader's time
    server_cpu_s: float
    errors: list[str]


def _read_pass(server_pid: int, target: Callable[..., None],
               args: list[tuple[Any, ...]]) -> ReadPass:  # fmt: skip
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start_at = time.monotonic() + 1.0  # time to connect and make the group or consumer
    processes = [ctx.Process(target=target, args=(*a, start_at, out), daemon=True) for a in args]
    for process in processes:
        process.start()
    try:
        time.sleep(max(0.0, start_at - time.monotonic()))
        cpu_before = cpu_seconds_of(server_pid)
        results = [out.get(timeout=600) for _ in processes]
        cpu_after = cpu_seconds_of(server_pid)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGKILL)
                process.join(timeout=10)
    return ReadPass(
        sum(r[0] for r in results),
        max(r[1] for r in results),
        cpu_after - cpu_before,
        [r[2] for r in results if r[2]],
    )


def redis_read(server: RedisServer, streams: int, mode: str, pass_index: int,
               count: int = 1000) -> ReadPass:  # fmt: skip
    """One reader process per stream; ``mode`` is "xrange" or "xreadgroup" (a new group per
    pass, so that every pass reads everything)."""
    group = b"pass-%d" % pass_index
    return _read_pass(
        server.pid, _redis_reader,
        [(server.port, redis_stream_key(i, streams), mode, group, count) for i in range(streams)],
    )  # fmt: skip


def nats_read(server: NatsServer, per_subject: list[int], pass_index: int,
              count: int = 1000, client: str = "nats-py") -> ReadPass:  # fmt: skip
    """One pull consumer process per subject; a new durable consumer per pass, read with
    nats-py's ``fetch`` or the lean protocol client (``client="wire"``)."""
    streams = len(per_subject)
    durables = [(f"{client}-{pass_index}-{i}", nats_subject(i, streams)) for i in range(streams)]
    if client != "nats-py":
        asyncio.run(nats_create_consumers(server.url, durables))
    return _read_pass(
        server.pid, _nats_reader if client == "nats-py" else _nats_wire_reader,
        [
            (server.port, subject, durable, per_subject[i], count)
            for i, (durable, subject) in enumerate(durables)
        ],
    )  # fmt: skip
