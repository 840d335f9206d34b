"""Running the server: `loghub serve` ends up here.

Without access keys the server answers anyone, so it refuses to listen on anything but a
loopback address; with keys every request must be signed (v1 or v4) with a fresh date.
TLS does not change that rule: encryption says nothing about who is calling.
With a certificate and key the server speaks only https on its port: a plain-http request
to it gets no HTTP answer (the TLS handshake fails and the connection is closed).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import math
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy.exc
import uvicorn

from loghub.errors import DatabaseError, ParameterInvalid
from loghub.server.app import LogHubApp, build_app
from loghub.server.config import (
    KeyRing,
    ServerConfig,
    is_loopback_host,
    keys_document,
    parse_keys_document,
    split_keys,
)
from loghub.server.http_protocol import bounded_protocol
from loghub.server.memory import return_large_buffers_to_os
from loghub.server.service import LogHubService

FrontEnd = Callable[[LogHubService], Callable[[], None]]

__all__ = [
    "bind_listener",
    "check_bind",
    "check_tls",
    "serve",
    "uvicorn_config",
    "uvicorn_server",
    "with_cluster_keys",
]

log = logging.getLogger("loghub.server")


def check_bind(config: ServerConfig) -> None:
    if not config.auth_enabled and not is_loopback_host(config.host):
        raise ParameterInvalid(
            f"refusing to listen on {config.host} without access keys: set "
            "LOGHUB_ACCESS_KEY_ID and LOGHUB_ACCESS_KEY_SECRET (or --keys-file), "
            "or listen on a loopback address"
        )


def check_tls(config: ServerConfig) -> None:
    """Both TLS files or neither, and both readable, so a typo fails at start-up rather than
    at the first client's handshake."""
    cert, key = config.tls_cert_file, config.tls_key_file
    if (cert is None) != (key is None):
        raise ParameterInvalid("TLS needs both --tls-cert and --tls-key")
    for path in (cert, key):
        if path is not None and not path.is_file():
            raise ParameterInvalid(f"TLS file {path} does not exist or is not a file")


def with_cluster_keys(config: ServerConfig) -> ServerConfig:
    """``config`` with the cluster's access keys (``loghub.cluster.keys``) in place of the
    node's own, as live rings that ``ClusterRouting`` keeps following etcd; unchanged outside
    a cluster. Read before the server binds, so the loopback-or-keys rule applies to the
    keys that will be in force."""
    if config.cluster is None:
        return config
    import asyncio

    from loghub.cluster.etcd_metadata import STARTUP_WAIT_S
    from loghub.cluster.etcd_store import EtcdStore
    from loghub.cluster.keys import resolve_keys
    from loghub.errors import ControlPlaneError

    offered = keys_document(config.keys, config.key_grants) if config.keys else None

    async def resolve() -> dict[str, Any]:
        assert config.cluster is not None
        deadline = time.monotonic() + STARTUP_WAIT_S
        async with EtcdStore(config.cluster.url) as store:
            while True:
                try:
                    return await resolve_keys(store, offered)
                except ControlPlaneError as exc:
                    if time.monotonic() >= deadline:
                        raise
                    log.warning("etcd did not answer (%s); trying again for up to %.0f s",
                                exc, STARTUP_WAIT_S)  # fmt: skip
                    await asyncio.sleep(0.5)

    entries = parse_keys_document(asyncio.run(resolve()), "the cluster's keys in etcd")
    keys, grants = split_keys(entries)
    return dataclasses.replace(config, keys=KeyRing(keys), key_grants=KeyRing(grants))


def serve(config: ServerConfig, front_ends: Sequence[FrontEnd] = ()) -> None:
    """Runs until SIGINT or SIGTERM; then stops accepting, finishes requests and closes.
    Each of ``front_ends`` (the Kafka listener) is started with the service once it is
    open, and stopped by the function it returned when the HTTP server has stopped.

    The HTTP protocol is uvicorn's httptools one with LogHub's header, body and idle
    timeouts and its connection cap (``http_protocol.py``)."""
    check_tls(config)
    check_kafka(config)
    config = with_cluster_keys(config)  # after the checks that need no etcd
    check_bind(config)
    listener = bind_listener(config.host, config.port)
    return_large_buffers_to_os()
    try:
        app = build_app(config)
    except sqlalchemy.exc.SQLAlchemyError as exc:
        listener.close()
        raise DatabaseError(f"metadata database: {exc}") from exc
    except BaseException:
        listener.close()
        raise
    stops = [start(app.service) for start in front_ends]
    log.info(
        "LogHub serving %s on %s://%s:%d (auth %s, fsync %s)",
        config.data_dir,
        "https" if config.tls_enabled else "http",
        config.host,
        config.port,
        "on" if config.auth_enabled else "off",
        config.fsync_policy,
    )
    try:
        uvicorn_server(app, config).run(sockets=[listener])
    except SystemExit:
        # uvicorn exits with its own status when the startup fails; the cause is the error
        if app.startup_error is None:
            raise
    finally:
        for stop in stops:
            stop()
    if app.startup_error is not None:
        raise app.startup_error


def check_kafka(config: ServerConfig) -> None:
    """The Kafka listener's settings, checked before anything listens."""
    if config.kafka_port is None:
        return
    config.kafka_address()  # a malformed --kafka-advertise fails here
    if not config.kafka_topic_separator or config.limits.logs_per_group_max > 1 << 20:
        raise ParameterInvalid(
            "the Kafka listener needs a topic separator and logs_per_group_max <= 1048576"
        )


def bind_listener(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything says "serving": a port in use is one
    clear error at start-up instead of uvicorn's log line after the server claimed to run.
    Options as uvicorn's own (address reuse for a quick restart after TIME_WAIT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(2048)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise ParameterInvalid(
                f"cannot listen on {host}:{port}: address already in use by another process;"
                " stop it, or choose another --port"
            ) from None
        raise ParameterInvalid(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    listener.set_inheritable(True)
    return listener


def uvicorn_config(app: Any, config: ServerConfig) -> uvicorn.Config:
    """The one uvicorn configuration, for `loghub serve` and the embedded server alike."""
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        loop="uvloop",
        http=bounded_protocol(
            config.limits,
            app.handle_direct if isinstance(app, LogHubApp) and app.direct_enabled else None,
        ),
        lifespan="on",
        access_log=False,
        # LogHub reads no client address; the middleware would cost every request a layer
        proxy_headers=False,
        log_level="warning",
        # the protocol closes idle connections itself; uvicorn's own timer agrees with it
        timeout_keep_alive=math.ceil(config.limits.idle_timeout_s),
        h11_max_incomplete_event_size=1024 * 1024,
        # TLS
        ssl_certfile=None if config.tls_cert_file is None else str(config.tls_cert_file),
        ssl_keyfile=None if config.tls_key_file is None else str(config.tls_key_file),
    )


class _Server(uvicorn.Server):
    """uvicorn's server, ending the long-poll waits as soon as it starts shutting down: it
    waits for in-flight requests to finish, and a parked pull would hold it up to
    ``pull_wait_ms_max``. A node of a replicated cluster hands the shards it leads to other
    replicas before it stops answering (``LogHubApp.before_shutdown``)."""

    def __init__(self, config: uvicorn.Config, app: LogHubApp) -> None:
        super().__init__(config)
        self._loghub_app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._loghub_app.stop_waiting()
        # while the server still answers: a cluster node hands its leaderships over first
        await self._loghub_app.before_shutdown()
        await super().shutdown(sockets)


def uvicorn_server(app: LogHubApp, config: ServerConfig) -> uvicorn.Server:
    """The one uvicorn server, for `loghub serve` and the embedded server alike."""
    return _Server(uvicorn_config(app, config), app)
