"""The Kafka listener: an asyncio TCP server, one reader and one writer per connection.

Per connection, frames are read as they come and each request is handled in its own task,
so several may be in flight (both clients pipeline); the writer sends the answers strictly in
request order, as Kafka does. Limits:

- a frame over ``frame_bytes_max`` closes the connection (Kafka's
  ``socket.request.max.bytes``);
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

from loghub.kafka.broker import Broker, Session
from loghub.wire.kafka.codec import KafkaDecodeError

__all__ = ["KafkaListener", "ListenerLimits"]

log = logging.getLogger("loghub.kafka")
_SIZE = struct.Struct(">i")


@dataclass(frozen=True)
class ListenerLimits:
    frame_bytes_max: int = 100 * 1024 * 1024
    inflight_requests_max: int = 32
    idle_timeout_s: float = 600.0


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
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
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
            if not 8 <= size <= self._limits.frame_bytes_max:
                raise KafkaDecodeError(
                    f"frame of {size} bytes (limit {self._limits.frame_bytes_max})"
                )
            frame = await reader.readexactly(size)
            handled = self._broker.handle(frame, session)  # raises on an unsupported request
            await answers.put(asyncio.ensure_future(handled))
        await answers.put(None)

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
