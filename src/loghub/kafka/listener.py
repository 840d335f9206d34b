"""The Kafka listener: an asyncio TCP server, one reader and one writer per connection.

Per connection, frames are read as they come and each request is handled in its own task,
so several may be in flight (both clients pipeline); the writer sends the answers strictly in
request order, as Kafka does. Limits:

- a frame over ``frame_bytes_max`` closes the connection (Kafka's
  ``socket.request.max.bytes``); before a connection has authenticated, when access keys
  are set, the bound is ``unauthenticated_frame_bytes_max`` (Kafka's
  ``sasl.server.max.receive.size``), so that no one without a key makes the server hold
  100 MB;
- a frame whose bytes stop coming for ``frame_timeout_s`` closes the connection (a client
  that sends a length and then nothing would otherwise hold its socket and buffer for good);
- frames are read only while the frames of all connections being read or handled hold at
  most ``inflight_frame_bytes_max`` bytes; beyond that, reading waits for room (Kafka's
  ``queued.max.request.bytes``), which bounds the memory many connections can make the
  server hold;
- at most ``connections_max`` connections are open; one more is closed at once (Kafka's
  ``max.connections``), so that file descriptors stay for the data;
- at most ``inflight_requests_max`` requests per connection are in flight; reading pauses
  beyond that;
- a connection with nothing to read for ``idle_timeout_s`` is closed, unless a request is
  still being answered;
- an API or version not advertised in ApiVersions, or a body that does not decode, closes the
  connection (the clients only send what was advertised).

Blocking service calls run in a thread pool (``Broker``). The listener runs its own event
loop in a thread beside the HTTP server's, sharing the same ``LogHubService``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from functools import partial

from loghub.kafka.broker import Broker, Session
from loghub.wire.kafka.codec import KafkaDecodeError

__all__ = ["KafkaListener", "ListenerLimits"]

log = logging.getLogger("loghub.kafka")
_SIZE = struct.Struct(">i")
_READ_BYTES_MAX = 1024 * 1024  # a large frame is read in steps of this, each with a timeout


def _give_back(frame_bytes: _FrameBytes, size: int, _handled: object) -> None:
    frame_bytes.give_back(size)


@dataclass(frozen=True)
class ListenerLimits:
    frame_bytes_max: int = 100 * 1024 * 1024
    unauthenticated_frame_bytes_max: int = 512 * 1024
    # twice the largest frame: one such frame is always let in beside many small ones
    inflight_frame_bytes_max: int = 200 * 1024 * 1024
    inflight_requests_max: int = 32
    idle_timeout_s: float = 600.0
    frame_timeout_s: float = 60.0
    connections_max: int = 1000


class _FrameBytes:
    """The bytes of the frames being read or handled, over all connections: a frame waits
    for room before it is read, and one frame alone is always let in. Used from one event
    loop only."""

    def __init__(self, bytes_max: int) -> None:
        self._max = bytes_max
        self._in_use = 0
        self._waiters: list[asyncio.Future[None]] = []

    async def take(self, size: int) -> None:
        while self._in_use and self._in_use + size > self._max:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self._in_use += size

    def give_back(self, size: int) -> None:
        self._in_use -= size
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:  # each checks again whether it fits now
            if not waiter.done():
                waiter.set_result(None)


class KafkaListener:
    def __init__(
        self,
        broker: Broker,
        sock: socket.socket,
        limits: ListenerLimits,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._broker = broker
        self._tls = tls
        self._sock = sock
        self._limits = limits
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._started = threading.Event()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._frame_bytes: _FrameBytes | None = None  # made in the listener's loop

    # -- running in a thread of its own -------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="loghub-kafka", daemon=True)
        self._thread.start()
        self._started.wait()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._frame_bytes = _FrameBytes(self._limits.inflight_frame_bytes_max)
        self._server = await asyncio.start_server(self._serve, sock=self._sock, ssl=self._tls)
        ticker = asyncio.create_task(self._broker.run_timers())
        self._started.set()
        try:
            while not self._stopped.is_set():
                await asyncio.sleep(0.1)
        finally:
            ticker.cancel()
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._broker.close()

    # -- one connection -------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        if len(self._connections) >= self._limits.connections_max:
            log.warning(
                "closing a Kafka connection from %s: %d are open already",
                peer,
                self._limits.connections_max,
            )
            writer.close()
            return
        self._connections.add(task)
        session = Session(client_host=str(peer[0]) if peer else "")
        answers: asyncio.Queue[Awaitable[bytes | None] | None] = asyncio.Queue(
            self._limits.inflight_requests_max
        )
        sender = asyncio.create_task(self._send(answers, writer))
        try:
            await self._read(reader, session, answers, sender)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except KafkaDecodeError as exc:
            log.info("closing Kafka connection from %s: %s", peer, exc)
        except TimeoutError:
            log.info(
                "closing Kafka connection from %s: a frame made no progress for %s s",
                peer,
                self._limits.frame_timeout_s,
            )
        finally:
            if not sender.done():
                with contextlib.suppress(asyncio.QueueFull):
                    answers.put_nowait(None)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(sender, 30)
            sender.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._connections.discard(task)

    async def _read(
        self,
        reader: asyncio.StreamReader,
        session: Session,
        answers: asyncio.Queue[Awaitable[bytes | None] | None],
        sender: asyncio.Task[None],
    ) -> None:
        while not sender.done():
            try:
                head = await asyncio.wait_for(reader.readexactly(4), self._limits.idle_timeout_s)
            except TimeoutError:
                if answers.empty():
                    return
                continue
            (size,) = _SIZE.unpack(head)
            if self._broker.config.keys and session.key_id is None:
                limit = self._limits.unauthenticated_frame_bytes_max
            else:
                limit = self._limits.frame_bytes_max
            if not 8 <= size <= limit:
                raise KafkaDecodeError(f"frame of {size} bytes (limit {limit})")
            assert self._frame_bytes is not None, "made before the server starts"
            await self._frame_bytes.take(size)
            try:
                frame = await self._read_frame(reader, size)
                # decoding raises on an unsupported request
                handled = asyncio.ensure_future(self._broker.handle(frame, session))
            except BaseException:
                self._frame_bytes.give_back(size)
                raise
            handled.add_done_callback(partial(_give_back, self._frame_bytes, size))
            await answers.put(handled)
        await answers.put(None)

    async def _read_frame(self, reader: asyncio.StreamReader, size: int) -> bytes:
        """The frame's ``size`` bytes; ``TimeoutError`` when none came for
        ``frame_timeout_s`` (progress resets the clock, so a slow link may take longer)."""
        chunks: list[bytes] = []
        left = size
        while left:
            chunk = await asyncio.wait_for(
                reader.read(min(left, _READ_BYTES_MAX)), self._limits.frame_timeout_s
            )
            if not chunk:
                raise asyncio.IncompleteReadError(b"".join(chunks), size)
            chunks.append(chunk)
            left -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _send(
        self, answers: asyncio.Queue[Awaitable[bytes | None] | None], writer: asyncio.StreamWriter
    ) -> None:
        while True:
            pending = await answers.get()
            if pending is None:
                return
            try:
                response = await pending
            except Exception:
                log.exception("a Kafka request failed; closing its connection")
                writer.close()
                return
            if response is not None:
                writer.write(response)
                await writer.drain()
