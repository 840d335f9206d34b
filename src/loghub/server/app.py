"""The HTTP face of the server: the LogHub REST API as an ASGI application.

Routing follows the protocol reference: the project comes from the first label of the `Host`
header (``<project>.<base host>``), never from the path, and one path often carries several
operations told apart by the method and the `type` or `action` query parameter. Paths are
matched by Starlette's routes (``_ROUTES``, one per path); the endpoint each names tells the
method and those query parameters apart. Those two parameters are checked on every route: a
value that names an API LogHub lacks (a query, ``type=log`` on a logstore; an unknown
``action``), or one sent where no API of that path takes it, is refused, never served by
another API of the same path. Optional query parameters follow one rule everywhere: empty
(``offset=``) is the same as absent. Absolute-form request targets (``GET
http://proj.127.0.0.1:8080/logstores HTTP/1.1``, what the SDK sends through ``HTTP_PROXY``)
reach here as plain paths: uvicorn's httptools parser keeps only path and query (``raw_path``
holds no authority), so the authority of such a target can neither route nor conflict; `Host`
alone routes, and it is the `Host` the signature covers. A target that still is not a path
(another HTTP parser) is refused.

Headers are read once into one mapping (``header_map``): a second `Host`, or a second copy
of any header a signature covers, is refused with 400 before routing or verifying, so the
project a request is routed to is the one its signature was checked against. Query
parameters likewise: each name once. Numbers in the path, the query, headers and JSON bodies
are read by ``wire/values.py`` (ASCII digits only, bounded), JSON by its bounded reader.

Every failure becomes ``{"errorCode", "errorMessage", "requestId"}`` with the status from
``server/errors.py``; an unexpected exception is logged and answered with 500
InternalServerError (never with its text, which may hold internals).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import parse_qsl

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Match, Route

from loghub._clock import Clock, SystemClock
from loghub.coordination.replica import FetchRequest
from loghub.errors import (
    IndexConfigNotExist,
    LogHubError,
    ParameterInvalid,
    PostBodyInvalid,
    PostBodyTooLarge,
    ProjectNotExist,
    ServerBusy,
    ShardReadOnly,
    SignatureReused,
    Unauthorized,
)
from loghub.server.admission import BodyBudget
from loghub.server.auth import Authenticator, needs_write
from loghub.server.config import ServerConfig
from loghub.server.console import Console, is_console_path
from loghub.server.errors import protocol_error
from loghub.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from loghub.server.metrics import api_label
from loghub.server.service import (
    NOT_SERVED_HEADER,
    LogHubService,
    NodeUnreachable,
    NotServedHere,
    ShardElsewhere,
    parse_shard_id,
)
from loghub.server.tail_waits import WaitEnd
from loghub.wire.compression import choose_response_compression
from loghub.wire.errors import error_body
from loghub.wire.logs import (
    OWNER_ONLY_HEADER,
    PULL_BYTES_MAX_HEADER,
    PULL_BYTES_MAX_PARAM,
    PULL_WAIT_MS_HEADER,
    PULL_WAIT_MS_PARAM,
)
from loghub.wire.producer_ids import PRODUCER_HEADER, parse_producer_header
from loghub.wire.signing import header_map
from loghub.wire.values import loads_json, parse_decimal

if TYPE_CHECKING:  # the cluster's modules (and the etcd client) load only in cluster mode
    from loghub.cluster.membership import NodeInfo
    from loghub.server.cluster_routing import ClusterRouting

__all__ = ["LogHubApp", "build_app", "project_from_host"]

log = logging.getLogger("loghub.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
T = TypeVar("T")

_JSON = "application/json"
# API labels kept for request shapes seen (a key holds no names, only the shape's parts; but
# a client may send any first segment or selector, so the cache is bounded)
_API_LABELS_CACHED_MAX = 1024
_PROTOBUF = "application/x-protobuf"
# Host header values whose project is remembered (see ``LogHubApp._project_from_host``)
_HOSTS_CACHED_MAX = 1024
# how often a write in a cluster follows its shard to another node or chooses again, before
# the client is told to try later (each move is a hand-over or a split that committed)
_WRITE_MOVES_MAX = 16
_UNKNOWN_HOST = ""  # a project is never empty: marks a Host not seen yet


def project_from_host(host: str, base_hosts: tuple[str, ...]) -> str | None:
    """The project named by a Host header, or None for a request to the server itself."""
    host = host.strip().lower()
    if host.startswith("["):  # [v6]:port
        host = host[: host.find("]") + 1]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    if not host or host in base_hosts:
        return None
    for base in base_hosts:
        if host.endswith("." + base):
            return host[: -len(base) - 1] or None
    if _is_ip(host):
        return None
    return host.split(".", 1)[0]


def _is_ip(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() for p in parts)


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers, once each (see ``header_map``); latin-1 as HTTP/1.1 allows."""
    raw: list[tuple[bytes, bytes]] = scope["headers"]
    return header_map((name.decode("latin-1"), value.decode("latin-1")) for name, value in raw)


def _query(raw_query: bytes) -> dict[str, str]:
    if not raw_query:
        return {}
    pairs = parse_qsl(raw_query.decode("latin-1"), keep_blank_values=True)
    query = dict(pairs)
    if len(query) != len(pairs):
        raise ParameterInvalid("a query parameter appears more than once")
    return query


class _Call:
    """One request, parsed once: what every handler needs."""

    __slots__ = (
        "body",
        "headers",
        "key_id",
        "method",
        "path",
        "parts",
        "project",
        "query",
        "query_string",
        "request",
        "request_id",
    )

    def __init__(
        self,
        request: Request | None,
        method: str,
        path: str,
        query_string: bytes,
        request_id: str,
        headers: dict[str, str],
        project: str | None,
    ) -> None:
        self.request = request  # None when it came the direct way (see ``handle_direct``)
        self.request_id = request_id
        self.headers = headers
        self.project = project
        self.method = method
        self.path = path
        self.parts = [p for p in path.split("/") if p]
        self.query_string = query_string
        self.query = _query(query_string)
        self.body = b""
        self.key_id: str | None = None  # who signed it, when keys are configured

    def optional(self, name: str) -> str | None:
        """An optional query parameter: absent and empty (``key=``) are the same, None."""
        return self.query.get(name) or None

    def need_project(self) -> str:
        if self.project is None:
            raise ProjectNotExist("the Host header names no project (<project>.<host>)")
        return self.project

    def json_body(self) -> Any:
        return loads_json(self.body, PostBodyInvalid) if self.body else None

    def json_object(self) -> dict[str, Any]:
        value = self.json_body()
        if not isinstance(value, dict):
            raise PostBodyInvalid("the body must be a JSON object")
        return value


def _json(value: Any, request_id: str) -> Response:
    return Response(
        json.dumps(value, separators=(",", ":")),
        media_type=_JSON,
        headers={"x-log-requestid": request_id},
    )


class _EmptyReply(Response):
    """200 with no body, what every write answers: Starlette's Response with its header
    building and background-task handling cut, as a PutLogs of a few logs is answered
    thousands of times a second. The same headers as ``Response(b"", headers=...)``."""

    def __init__(self, request_id: str) -> None:  # no super().__init__(): nothing to render
        self.status_code = 200
        self.body = b""
        self.background = None
        self.raw_headers = [(b"content-length", b"0"), (b"x-log-requestid", request_id.encode())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": b""})


def _empty(request_id: str) -> Response:
    return _EmptyReply(request_id)


def _error(exc: LogHubError, request_id: str) -> Response:
    headers = {"x-log-requestid": request_id}
    if isinstance(exc, SignatureReused):
        headers["retry-after"] = "1"  # a new second, a new date, a new signature
    reply = protocol_error(exc)
    if isinstance(exc, NotServedHere):
        headers[NOT_SERVED_HEADER] = "1"
    if reply.code == "ServerBusy":  # ServerBusy, or the cluster's control plane (errors.py)
        headers["retry-after"] = "1"  # seconds; the SDK waits that long between tries anyway
    return Response(
        error_body(reply.code, reply.message, request_id),
        status_code=reply.status,
        media_type=_JSON,
        headers=headers,
    )


# The query parameters that choose among the APIs sharing a path.
_SELECTORS = ("type", "action")
# GET /logstores/{name}?type=...: the query APIs of the hosted service, which need an index.
_QUERY_TYPES = frozenset(("log", "histogram", "topic"))


def _refuse_selectors(call: _Call, *taken: str) -> None:
    """Refuses a ``type`` or ``action`` on a route whose APIs do not take it: such a request
    names an API LogHub does not have, and must not be served by the one that shares the
    path (``GET /logstores/ls?type=log`` is a query, not GetLogStore)."""
    for name in _SELECTORS:
        value = call.optional(name)
        if name not in taken and value is not None:
            raise ParameterInvalid(
                f"unsupported API: {call.method} {call.path} with {name}={value[:64]!r}"
            )


def _int_param(call: _Call, name: str, default: int | None = None) -> int:
    """An integer query parameter; an empty value (``offset=``) counts as absent, and an
    integral one written as a float (``size=100.0``) is that integer."""
    text = call.optional(name)
    if text is None or not text.strip():
        if default is None:
            raise ParameterInvalid(f"the query parameter {name} is required")
        return default
    return parse_decimal(text, name, ParameterInvalid, negative=True, digits_max=12, fraction=True)


def _bool_param(call: _Call, name: str, default: bool) -> bool:
    """A boolean query parameter, ``true`` or ``false`` in any case (the Python SDK sends
    ``True``); absent or empty is ``default``. Anything else is refused rather than read as
    false: a typo in ``forceSuccess`` must not quietly fence a checkpoint."""
    text = call.optional(name)
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise ParameterInvalid(f"{name} must be true or false, not {text[:40]!r}")
    return text.lower() == "true"


class LogHubApp:
    def __init__(self, service: LogHubService) -> None:
        self.service = service
        self.config: ServerConfig = service.config
        self.clock: Clock = service.clock
        self._executor = ThreadPoolExecutor(
            self.config.storage_threads, thread_name_prefix="loghub-storage"
        )
        self._background: list[asyncio.Task[None]] = []
        self._auth = Authenticator(self.config)
        self._console = Console(self.service, self._auth, partial(self._blocking))
        data_dirs = {str(self.config.data_dir), str(self.config.data_dir.resolve())}
        self._data_dir_paths = re.compile(
            "|".join(re.escape(d) + r"[^\s\"']*" for d in sorted(data_dirs, key=len, reverse=True))
        )
        limits = self.config.limits
        self._body_budget = BodyBudget(limits.inflight_body_bytes_max, limits.inflight_wait_s)
        self.service.metrics.watch_body_budget(self._body_budget)
        self._api_labels: dict[tuple[str, int, bool, str, str], str] = {}
        self._routed: dict[tuple[str, str], _Routed] = {}
        self._host_projects: dict[str, str | None] = {}
        # Request ids: 24 hex digits as before, a random half per process and a counter,
        # instead of os.urandom per request (a system call that also lets other threads
        # take the GIL from the event loop).
        self._request_id_prefix = os.urandom(6).hex().upper()
        self._request_numbers = itertools.count()
        self._cluster: ClusterRouting | None = None
        # why the server could not start (a cluster it could not join), for ``serve`` to raise
        self.startup_error: LogHubError | None = None
        if self.config.cluster is not None:
            from loghub.cluster.membership import NodeInfo
            from loghub.cluster.replication import ReplicationSettings
            from loghub.server.cluster_routing import ClusterRouting

            cluster = self.config.cluster
            kafka = self.config.kafka_address()
            self._cluster = ClusterRouting(
                cluster.url,
                NodeInfo(
                    cluster.node_id,
                    cluster.advertise,
                    cluster.rack,
                    kafka="" if kafka is None else f"{kafka[0]}:{kafka[1]}",
                ),
                self.service.metadata,
                self.service,
                cluster.node_ttl_s,
                self.config.keys,
                key_grants=self.config.key_grants,
                replication=ReplicationSettings(
                    cluster.replication_factor,
                    cluster.min_insync_replicas,
                    cluster.replica_lag_ms,
                ),
            )
            self.service.storage.replicated = cluster.replication_factor > 1
            self.service.remote_logs = self._cluster
            routing = self._cluster
            self.service.holds_shard = routing.holds
            self.service.groups.is_remote = lambda p, ls, s: not routing.is_local(p, ls, s)
            self.service.groups.persistence = routing
            routing.on_group_lost = self.service.groups.forget
            self.service.metrics.watch_cluster(
                lambda: None if routing.agent is None else routing.agent.status()
            )
        self._lb_turn = itertools.count()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        request_id = f"{self._request_id_prefix}{next(self._request_numbers):012X}"
        started = time.perf_counter()
        try:
            response = await self._handle(request, request_id)
        except ClientDisconnect:
            return  # cut mid-body (a timeout, or the client left): nobody to answer
        except Exception as exc:
            response = self._failure(exc, scope["method"], scope["path"], request_id)
        await response(scope, receive, send)
        self._count(
            scope["method"],
            scope["path"],
            scope.get("query_string", b""),
            response.status_code,
            time.perf_counter() - started,
        )

    @property
    def direct_enabled(self) -> bool:
        """Whether the HTTP protocol may hand requests to ``handle_direct``: not in a
        cluster, where a shard request may be forwarded with the ASGI request it came as."""
        return self._cluster is None

    async def handle_direct(
        self,
        method: str,
        path: str,
        query_string: bytes,
        raw_headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> Response:
        """One request whose body the HTTP protocol has already read, without the ASGI
        layer (``http_protocol.py`` sends only shard requests with a small declared body
        this way): the same headers check, admission, signature check, routing, errors and
        metrics as ``__call__``, at a fraction of its fixed cost per request, which is most
        of what a PutLogs of a few logs costs. Returns the response for the protocol to
        write."""
        request_id = f"{self._request_id_prefix}{next(self._request_numbers):012X}"
        started = time.perf_counter()
        try:
            headers = header_map(
                [(name.decode("latin-1"), value.decode("latin-1")) for name, value in raw_headers]
            )
            project = self._project_from_host(headers.get("host", ""))
            call = _Call(None, method, path, query_string, request_id, headers, project)
            call.body = body
            async with self._body_budget.room(self._body_room_bytes(headers)):
                if self.config.auth_enabled:
                    self._authenticate(call)
                response = await self._route(call)
        except Exception as exc:
            response = self._failure(exc, method, path, request_id)
        self._count(method, path, query_string, response.status_code, time.perf_counter() - started)
        return response

    def _project_from_host(self, host: str) -> str | None:
        """``project_from_host``, remembered per Host value: a client sends the same one on
        every request. Hosts are the clients' to choose, so the table is bounded."""
        found = self._host_projects.get(host, _UNKNOWN_HOST)
        if found is _UNKNOWN_HOST:
            found = project_from_host(host, self.config.base_hosts)
            if len(self._host_projects) >= _HOSTS_CACHED_MAX:
                self._host_projects.clear()
            self._host_projects[host] = found
        return found

    def _failure(self, exc: Exception, method: str, path: str, request_id: str) -> Response:
        """The answer to a request that raised: its LogHub error, or 500 without the
        exception's text (which may hold internals) for anything else."""
        if isinstance(exc, LogHubError):
            if protocol_error(exc).internal:
                # the server's own fault: the details (paths, positions, SQL) are for its log
                log.error("request %s %s: %r", method, path, exc)
            self.service.metrics.errors.labels(protocol_error(exc).code).inc()
            return _error(self._without_paths(exc), request_id)
        log.error("request %s %s failed", method, path, exc_info=exc)
        self.service.metrics.errors.labels("InternalServerError").inc()
        return _error(LogHubError("internal server error"), request_id)

    def _without_paths(self, exc: LogHubError) -> LogHubError:
        """The error with every path under the data directory cut from its message: where
        the server keeps its files is nobody's business over HTTP (the lower layers name
        them for the server's own log)."""
        scrubbed = self._data_dir_paths.sub("<data dir>", exc.message)
        if scrubbed == exc.message:
            return exc
        clean = copy.copy(exc)
        clean.message = scrubbed
        return clean

    def _count(
        self, method: str, path: str, raw_query: bytes, status: int, elapsed_s: float
    ) -> None:
        if path in ("/health", "/metrics") or is_console_path(path):
            return
        self.service.metrics.count_request(self._api(method, path, raw_query), status, elapsed_s)

    def _api(self, method: str, path: str, raw_query: bytes) -> str:
        """The request's metrics label (see ``api_label``)."""
        parts = [p for p in path.split("/") if p]
        # the label depends on the path's shape and the selector only: cached by those, so
        # that a request pays no query parsing unless it carries a selector
        selector = ""
        if b"type=" in raw_query or b"action=" in raw_query:
            query = dict(parse_qsl(raw_query.decode("latin-1")))
            selector = f"{query.get('type', '')}&{query.get('action', '')}"
        kind = parts[2] if len(parts) >= 3 and parts[2] in ("shards", "consumergroups") else ""
        key = (method, len(parts), not parts or parts[0] == "logstores", kind, selector)
        api = self._api_labels.get(key)
        if api is None:
            query = dict(parse_qsl(raw_query.decode("latin-1")))
            api = api_label(method, parts, query)
            if len(self._api_labels) < _API_LABELS_CACHED_MAX:
                self._api_labels[key] = api
        return api

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self._cluster is not None:
                    try:
                        await self._cluster.start()
                        self.service.replication = self._cluster.replication
                    except LogHubError as exc:
                        self.startup_error = exc
                        with contextlib.suppress(Exception):
                            await self._cluster.stop()
                        await send({"type": "lifespan.startup.failed", "message": str(exc)})
                        return
                self._background = [
                    asyncio.create_task(
                        self._every(self.config.retention_interval_s, self._apply_retention)
                    ),
                    asyncio.create_task(
                        self._every(self.config.auto_split_check_interval_s, self._check_autosplit)
                    ),
                ]
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def before_shutdown(self) -> None:
        """A node of a replicated cluster that is asked to stop hands the shards it leads
        to in-sync replicas while it still answers (forwarded writes wait for the move
        rather than fail); a bounded wait, then the shutdown goes on."""
        if self._cluster is not None and self._cluster.replication is not None:
            await self._cluster.replication.hand_over_all()

    def stop_waiting(self) -> None:
        """Ends every long-poll wait at once, answering those pulls empty: called when the
        server starts shutting down, which otherwise waits for in-flight requests."""
        self.service.tail_waits.close()

    async def close(self) -> None:
        self.stop_waiting()
        for task in self._background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._cluster is not None:
            await self._cluster.stop()
        self._executor.shutdown(wait=True)
        self.service.close()

    async def _every(self, interval_s: float, job: Callable[[], Awaitable[None]]) -> None:
        """Runs a housekeeping job every interval; a failure is logged, and the next run
        comes as usual."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await job()
            except Exception:
                log.exception("%s failed", job.__name__)

    async def _apply_retention(self) -> None:
        deleted = await self._blocking(self.service.apply_retention)
        if deleted:
            log.info("retention deleted %d segments", deleted)

    async def _check_autosplit(self) -> None:
        created = await self._blocking(self.service.check_autosplit)
        if created:
            log.info("auto-split created shards %s", [s.shard_id for s in created])

    def _body_room_bytes(self, headers: dict[str, str]) -> int:
        """The room a request's body takes in the in-flight budget: the larger of its length
        and its declared raw size; a body of unknown length (chunked) may be as large as
        allowed. Refuses a declared length over the limit (413) before anything is read."""
        limits = self.config.limits
        declared = headers.get("content-length", "").strip()
        if declared.isascii() and declared.isdigit():
            if len(declared) > 12 or int(declared) > limits.request_body_bytes_max:
                raise PostBodyTooLarge(
                    f"the body is {declared} bytes; at most "
                    f"{limits.request_body_bytes_max} are allowed"
                )
            size = int(declared)
        elif "transfer-encoding" in headers:
            size = limits.request_body_bytes_max
        else:
            size = 0
        raw = headers.get("x-log-bodyrawsize", "").strip()
        if size and raw.isascii() and raw.isdigit():
            size = max(size, min(int(raw[:12]), limits.raw_body_bytes_max))
        return size

    async def _read_body(self, request: Request) -> bytes:
        limit = self.config.limits.request_body_bytes_max
        chunks: list[bytes] = []
        size = 0
        receive = request.receive  # ASGI messages as they come: no generator per request
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PostBodyTooLarge(f"the body is over {limit} bytes")
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _handle(self, request: Request, request_id: str) -> Response:
        scope = request.scope
        if scope["path"] == "/health":
            return _json({"status": "ok", "pid": os.getpid()}, request_id)
        if not scope["path"].startswith("/"):
            raise ParameterInvalid("the request target must be a path (origin-form)")
        headers = _headers(scope)
        if scope["path"] == "/metrics":
            if self.config.auth_enabled:
                self._auth.authenticate_metrics(
                    request.method,
                    scope["path"],
                    scope.get("query_string", b""),
                    headers,
                    self.clock.wall_ms() / 1000,
                )
            # a scrape reads every shard's statistics and every group's checkpoints: not on
            # the event loop
            exposition = await self._blocking(self.service.metrics.exposition)
            return Response(exposition, media_type=METRICS_CONTENT_TYPE)
        if is_console_path(scope["path"]):
            return await self._console.handle(request, headers, request_id)
        project = self._project_from_host(headers.get("host", ""))
        call = _Call(
            request,
            request.method,
            scope["path"],
            scope.get("query_string", b""),
            request_id,
            headers,
            project,
        )
        async with self._body_budget.room(self._body_room_bytes(headers)):
            call.body = await self._read_body(request)
            if self.config.auth_enabled:
                self._authenticate(call)
            return await self._route(call)

    def _authenticate(self, call: _Call) -> None:
        call.key_id = self._auth.authenticate(
            call.method,
            call.path,
            call.query_string,
            call.headers,
            call.body,
            self.clock.wall_ms() / 1000,
            call.project,
            needs_write(call.method, call.parts),
        )

    async def _route(self, call: _Call) -> Response:
        """Hands the call to the endpoint whose route matches its path (empty segments
        dropped: ``//logstores/`` is ``/logstores``); a path no route takes, or a method its
        route does not take, names no API."""
        path = "/" + "/".join(call.parts)
        key = (call.method, path)
        found = self._routed.get(key)
        if found is None:
            found = _match_route(call.method, path)
            if len(self._routed) >= _ROUTES_CACHED_MAX:
                self._routed.clear()  # a client walking many names: start again
            self._routed[key] = found
        if found is _NO_ROUTE:
            raise ParameterInvalid(f"unsupported API: {call.method} {call.path}")
        endpoint, path_params = found
        return await endpoint(self, call, **path_params)

    async def _query_logs(self, call: _Call, logstore: str) -> Response:
        """GetLogs v2 (``POST .../logs``); GetIndex, and GetHistograms as the OpenAPI SDKs
        send it (``GET .../index``)."""
        if call.optional("type") not in _QUERY_TYPES:
            _refuse_selectors(call)
        return self._no_index(call, logstore)

    def _no_index(self, call: _Call, logstore: str) -> NoReturn:
        """The queries (GetLogs v1 and v2, histograms, topics) and GetIndex: the hosted
        service's answer for a logstore without an index, after the checks that come first
        there (project, logstore). Writing an index config is not offered at all."""
        self.service.metadata.get_logstore(call.need_project(), logstore)
        raise IndexConfigNotExist(
            f"logstore {logstore} has no index: LogHub keeps no index and answers no queries"
            " (read logs with PullLogs through cursors)"
        )

    # -- projects ----------------------------------------------------------------------------

    async def _project(self, call: _Call) -> Response:
        _refuse_selectors(call)
        meta = self.service.metadata
        if call.method == "POST":
            return self._create_project(call)
        if call.project is None:
            if call.method != "GET":
                raise ParameterInvalid(f"unsupported API: {call.method} / without a project")
            offset = _int_param(call, "offset", 0)
            size = _int_param(call, "size", 500)
            name = call.query.get("projectName", "")
            grant = None if call.key_id is None else self._auth.grant(call.key_id)
            if grant is None or grant.all_projects:
                projects, total = meta.list_projects(offset, size, name)
            else:
                # a key limited to some projects sees only those
                meta.list_projects(offset, 0, name)  # the same checks of offset and size
                everything = meta.list_projects(0, 1_000_000, name)[0]
                visible = [p for p in everything if grant.allows(p.name, False)]
                projects, total = visible[offset : offset + max(size, 0)], len(visible)
            return _json(
                {
                    "count": len(projects),
                    "total": total,
                    "projects": [p.to_json() for p in projects],
                },
                call.request_id,
            )
        if call.method == "GET":
            return _json(meta.get_project(call.project).to_json(), call.request_id)
        if call.method == "DELETE":
            await self._blocking(self.service.delete_project, call.project)
            return _empty(call.request_id)
        raise ParameterInvalid(f"unsupported API: {call.method} /")

    def _create_project(self, call: _Call) -> Response:
        """CreateProject in both of its forms: ``POST /`` to ``<project>.<host>`` (the classic
        Python SDK) and ``POST /`` to the bare endpoint with the name in the body's
        ``projectName`` (the Node.js and OpenAPI-generation SDKs). One name, one validation:
        a body naming another project than the host is refused."""
        body = call.json_object()
        named = body.get("projectName")
        if named is not None and not isinstance(named, str):
            raise PostBodyInvalid("projectName must be a string")
        if call.project is not None and named and named != call.project:
            raise ParameterInvalid(
                f"the body names project {named[:64]!r}, the host {call.project!r}"
            )
        name = call.project or named
        if not name:
            raise ParameterInvalid(
                "CreateProject needs a project: in the Host (<project>.<host>) or in the"
                " body's projectName"
            )
        if call.project is None and call.key_id is not None:
            # the signature checked no grant for the bare endpoint: check it for the body's name
            grant = self._auth.grant(call.key_id)
            if not grant.allows(name, True):
                raise Unauthorized(f"access key {call.key_id!r} may not create project {name!r}")
        description = body.get("description")
        self.service.metadata.create_project(name, "" if description is None else str(description))
        return _empty(call.request_id)

    # -- logstores ---------------------------------------------------------------------------

    async def _logstores(self, call: _Call) -> Response:
        _refuse_selectors(call)
        project = call.need_project()
        if call.method == "POST":
            self.service.create_logstore(project, call.json_object())
            return _empty(call.request_id)
        if call.method == "GET":
            offset = _int_param(call, "offset", 0)
            size = _int_param(call, "size", 500)
            names, total = self.service.metadata.list_logstores(
                project, offset, size, call.query.get("logstoreName", "")
            )
            return _json({"count": len(names), "total": total, "logstores": names}, call.request_id)
        raise ParameterInvalid(f"unsupported API: {call.method} /logstores")

    async def _logstore(self, call: _Call, name: str) -> Response:
        project = call.need_project()
        kind = call.optional("type")
        if call.method == "GET" and kind in _QUERY_TYPES:
            return self._no_index(call, name)
        if call.method == "GET" and kind == "describe":  # LogHub only: sizes and rates
            description = await self._blocking(self.service.describe_logstore, project, name)
            return _json(description, call.request_id)
        _refuse_selectors(call)
        if call.method == "GET":
            logstore = self.service.metadata.get_logstore(project, name)
            return _json(logstore.to_json(), call.request_id)
        if call.method == "PUT":
            self.service.update_logstore(project, name, call.json_object())
            return _empty(call.request_id)
        if call.method == "DELETE":
            await self._blocking(self.service.delete_logstore, project, name)
            return _empty(call.request_id)
        raise ParameterInvalid(f"unsupported API: {call.method} /logstores/{name}")

    # -- consumer groups -----------------------------------------------------------------------

    async def _consumer_groups(self, call: _Call, logstore: str) -> Response:
        _refuse_selectors(call)
        project = call.need_project()
        groups = self.service.groups  # definitions are in etcd: any node serves them
        if call.method == "POST":
            await self._blocking(groups.create, project, logstore, call.json_body())
            return _empty(call.request_id)
        if call.method == "GET":
            return _json(groups.list_groups(project, logstore), call.request_id)
        raise ParameterInvalid(f"unsupported API: {call.method} {call.path}")

    async def _consumer_group(self, call: _Call, logstore: str, name: str) -> Response:
        project = call.need_project()
        if self._cluster is not None:
            node = await self._cluster.coordinate(project, logstore, name)
            if node is not None:
                return await self._forward(call, node)
        groups = self.service.groups
        _refuse_selectors(call, "type" if call.method in ("POST", "GET") else "")
        kind = call.optional("type")
        consumer = call.query.get("consumer", "")
        if call.method == "GET" and kind == "describe":  # LogHub only: owners and lag
            description = await self._blocking(groups.describe, project, logstore, name)
            return _json(description, call.request_id)
        if call.method == "GET" and kind is not None:
            _refuse_selectors(call)
        if call.method == "POST" and kind == "heartbeat":
            held = call.json_body()
            granted = groups.heartbeat_in_memory(project, logstore, name, consumer, held)
            if granted is None:
                granted = await self._blocking(
                    groups.heartbeat, project, logstore, name, consumer, held
                )
            return _json(granted, call.request_id)
        if call.method == "POST" and kind == "checkpoint":
            force = _bool_param(call, "forceSuccess", default=True)
            await self._blocking(
                groups.update_checkpoint,
                project,
                logstore,
                name,
                consumer,
                force,
                call.json_body(),
            )
            return _empty(call.request_id)
        if call.method == "GET":
            # absent, empty or negative: every shard
            shard_id: int | None = _int_param(call, "shard", -1)
            if shard_id is not None and shard_id < 0:
                shard_id = None
            if self._cluster is not None:  # may load the group's assignment from etcd
                checkpoints = await self._blocking(
                    groups.get_checkpoints, project, logstore, name, shard_id
                )
            else:
                checkpoints = groups.get_checkpoints(project, logstore, name, shard_id)
            return _json(checkpoints, call.request_id)
        if call.method == "PUT":
            await self._blocking(groups.update, project, logstore, name, call.json_body())
            return _empty(call.request_id)
        if call.method == "DELETE":
            await self._blocking(groups.delete, project, logstore, name)
            return _empty(call.request_id)
        raise ParameterInvalid(f"unsupported API: {call.method} {call.path} type={kind!r}")

    # -- shards ------------------------------------------------------------------------------

    async def _list_shards(self, call: _Call, logstore: str) -> Response:
        _refuse_selectors(call)
        project = call.need_project()
        shards = self.service.metadata.list_shards(project, logstore)
        answer = [self.service.shard_json(s) for s in shards]
        if self._cluster is not None:
            # LogHub only: where each shard's log is, so that a reader (Spark's executors)
            # can pull from that node and spare every pull a hop (see docs/protocol.md)
            for body in answer:
                body.update(self._cluster.shard_location(project, logstore, body["shardID"]))
        return _json(answer, call.request_id)

    async def _shard(self, call: _Call, logstore: str, target: str) -> Response:
        project = call.need_project()
        _refuse_selectors(call, {"POST": "action", "GET": "type"}.get(call.method, ""))
        asked = target
        if (
            self._cluster is not None
            and call.method == "GET"
            and call.optional("type") == "replica"
        ):
            return await self._replica_fetch(call, project, logstore, parse_shard_id(target))
        if self._cluster is not None:
            await self._cluster_placed(project, logstore, target)
            node, target = self._shard_node(call, project, logstore, asked)
            for attempt in range(_WRITE_MOVES_MAX):
                if node is None:
                    break
                try:
                    reply = await self._forward_shard_request(call, node, logstore, target)
                except NodeUnreachable:
                    # the node refused the connection (nothing was sent): it stopped after
                    # handing its shards over, or died; route again once the view moved on
                    shard_id = self._shard_of(call, project, logstore, asked, target)
                    if shard_id is None:
                        await asyncio.sleep(0.2)  # a load-balanced write: choose again
                    elif not await self._cluster.rerouted(
                        project, logstore, shard_id, node.node_id
                    ):
                        raise
                    node, target = self._shard_node(call, project, logstore, asked)
                    continue
                if NOT_SERVED_HEADER not in reply.headers or attempt == _WRITE_MOVES_MAX - 1:
                    return reply
                # the node this one's view named had just stopped serving the shard (its
                # leadership moved on, a hand-over): this view follows within a watch
                # event, so route again rather than answer 503 for a move with no outage
                await asyncio.sleep(0.01 * (attempt + 1))
                node, target = self._shard_node(call, project, logstore, asked)
        if call.method == "POST" and call.optional("action") is None:
            if self._cluster is not None:
                return await self._put_logs_in_cluster(call, project, logstore, asked, target)
            return await self._put_logs(call, project, logstore, target)
        if call.method == "POST":
            return await self._reshard(call, project, logstore, target)
        if call.method == "GET":
            shard_id = parse_shard_id(target)
            kind = call.optional("type")
            if kind == "log":
                return await self._pull_logs(call, project, logstore, shard_id)
            if kind == "cursor":
                position = call.query.get("from", "").strip()
                cursor = self.service.get_cursor(project, logstore, shard_id, position)
                return _json({"cursor": cursor}, call.request_id)
            if kind == "cursor_time":
                cursor_time = self.service.get_cursor_time(
                    project, logstore, shard_id, call.query.get("cursor", "")
                )
                return _json({"cursor_time": cursor_time}, call.request_id)
            raise ParameterInvalid(f"type must be log, cursor or cursor_time, not {kind!r}")
        raise ParameterInvalid(f"unsupported API: {call.method} {call.path}")

    async def _replica_fetch(
        self, call: _Call, project: str, logstore: str, shard_id: int
    ) -> Response:
        """A follower's fetch of a shard this node leads (``loghub.cluster.replication``):
        never forwarded, since only the leader of the epoch the follower names may answer
        it. The records are the body; the leader's epoch, high watermark and a diverging
        epoch are headers."""
        assert self._cluster is not None
        replication = self._cluster.replication
        if replication is None:
            raise ParameterInvalid("this cluster does not replicate shards")
        if call.key_id is not None:
            # a fetch reports what a follower holds, which acknowledges writes: only a key
            # that may write everywhere (the nodes' own) may make one
            grant = self._auth.grant(call.key_id)
            if not (grant.all_projects and grant.access == "write"):
                raise Unauthorized("replica fetches take a key that may write every project")
        offset = _int_param(call, "offset")
        fsynced_end = _int_param(call, "fsyncedEnd")
        if not 0 <= fsynced_end <= offset:
            raise ParameterInvalid("fsyncedEnd must be between 0 and offset")
        last_epoch = _int_param(call, "lastEpoch")
        if last_epoch < -1 or (last_epoch == -1 and offset != 0):
            raise ParameterInvalid("lastEpoch must be -1 (an empty log) or an epoch")
        leader_epoch = _int_param(call, "leaderEpoch")
        if leader_epoch < 0:
            raise ParameterInvalid("leaderEpoch must be an epoch (0 or more)")
        request = FetchRequest(
            call.query.get("replica", ""),
            leader_epoch,
            offset,
            last_epoch,
            fsynced_end,
        )
        wait_ms = min(max(_int_param(call, "waitMs", 0), 0), 30_000)
        bytes_max = min(max(_int_param(call, "bytesMax", 1 << 20), 1), 64 << 20)
        answer = await replication.handle_fetch(
            (project, logstore, shard_id), request, wait_ms, bytes_max
        )
        headers = {
            "x-log-requestid": call.request_id,
            "x-loghub-leader-epoch": str(answer.leader_epoch),
            "x-loghub-high-watermark": str(answer.high_watermark),
            "content-type": "application/octet-stream",
        }
        if answer.diverging is not None:
            headers["x-loghub-diverging-epoch"] = str(answer.diverging.leader_epoch)
            headers["x-loghub-diverging-end"] = str(answer.diverging.end_offset)
        return Response(answer.records, headers=headers)

    def _shard_of(
        self, call: _Call, project: str, logstore: str, asked: str, target: str
    ) -> int | None:
        """The shard a routed request is for (None for a load-balanced write, which the
        next routing sends wherever a writable shard is)."""
        if target.isdigit():
            return int(target)
        if asked == "route":
            return self.service.pick_shard(
                project, logstore, "route", call.optional("key")
            ).shard_id
        return None

    async def _forward_shard_request(
        self, call: _Call, node: NodeInfo, logstore: str, target: str
    ) -> Response:
        assert self._cluster is not None
        if call.headers.get(OWNER_ONLY_HEADER):
            # the client chose this node from a shard list that is out of date: it goes back
            # to its endpoint rather than have the request passed on
            raise ServerBusy(
                f"node {self._cluster.node_id} does not serve shard {target} of "
                f"{logstore} (node {node.node_id} does); list the shards again"
            )
        return await self._forward(call, node)

    async def _put_logs_in_cluster(
        self, call: _Call, project: str, logstore: str, asked: str, target: str
    ) -> Response:
        """A PutLogs this node took: appended here, or, when its shard turns out to be held
        by another node by the time it is appended (``ShardElsewhere``: a hand-over sealed
        the shard under a routed write, which then routes to the successor, placed
        elsewhere), passed on to that node as it came. A load-balanced write whose local
        shard was handed over chooses again rather than fail with ShardReadOnly, since the
        client named no shard."""
        assert self._cluster is not None
        for _attempt in range(_WRITE_MOVES_MAX):
            try:
                return await self._put_logs(call, project, logstore, target)
            except ShardElsewhere as moved:
                await self._cluster.placed(project, logstore, moved.shard_id)
                await self._cluster.moved(project, logstore, moved.shard_id)
                node = self._cluster.shard_node(project, logstore, moved.shard_id)
                if node is not None:
                    return await self._forward_shard_request(call, node, logstore, target)
            except ShardReadOnly:
                if asked != "lb":
                    raise
                await self._blocking(self.service.metadata.wait_for_writes)
                node, target = self._shard_node(call, project, logstore, asked)
                if node is not None:
                    return await self._forward_shard_request(call, node, logstore, target)
        raise ServerBusy(f"the shards of {logstore} kept moving; try again")

    async def _cluster_placed(self, project: str, logstore: str, target: str) -> None:
        """Waits until the shards a request may reach are placed (see ``placed``)."""
        assert self._cluster is not None
        if target.isdigit():
            await self._cluster.placed(project, logstore, int(target))
            return
        for shard in self.service.metadata.list_shards(project, logstore):
            if shard.status == "readwrite":
                await self._cluster.placed(project, logstore, shard.shard_id)

    def _shard_node(
        self, call: _Call, project: str, logstore: str, target: str
    ) -> tuple[NodeInfo | None, str]:
        """In a cluster: the node that serves a shard request (None: this one), and the
        target to serve it with here (a load-balanced write becomes one of this node's
        shards)."""
        cluster = self._cluster
        assert cluster is not None
        writes = call.method == "POST"
        if writes:
            cluster.check_alive()
        if writes and call.optional("action") is None and target in ("lb", "route"):
            shards = self.service.metadata.list_shards(project, logstore)
            writable = [s.shard_id for s in shards if s.status == "readwrite"]
            if target == "lb":
                local = cluster.local_writable(project, logstore, writable)
                if local:
                    return None, str(local[next(self._lb_turn) % len(local)])
                if not writable:
                    return None, target  # the service gives the error
                chosen = writable[next(self._lb_turn) % len(writable)]
                return cluster.shard_node(project, logstore, chosen), target
            shard = self.service.pick_shard(project, logstore, target, call.optional("key"))
            return cluster.shard_node(project, logstore, shard.shard_id), target
        return cluster.shard_node(project, logstore, parse_shard_id(target)), target

    async def _forward(self, call: _Call, node: NodeInfo) -> Response:
        assert self._cluster is not None
        assert call.request is not None  # no direct requests in a cluster (``direct_enabled``)
        scope = call.request.scope
        api = self._api(scope["method"], scope["path"], scope.get("query_string", b""))
        self.service.metrics.forwarded.labels(api).inc()
        return await self._cluster.forward(
            node,
            call.method,
            scope.get("raw_path", scope["path"].encode()).decode("latin-1").split("?")[0],
            scope.get("query_string", b""),
            scope["headers"],
            call.body,
            call.request_id,
        )

    async def _reshard(self, call: _Call, project: str, logstore: str, target: str) -> Response:
        shard_id = parse_shard_id(target)
        action = call.query.get("action")
        if action == "split":
            shards = await self._blocking(
                self.service.split_shard, project, logstore, shard_id, call.optional("key")
            )
        elif action == "merge":
            shards = await self._blocking(self.service.merge_shard, project, logstore, shard_id)
        elif action in ("seal", "unseal") and self._cluster is not None:
            # a node merging this node's shard with its own seals this log first
            if action == "seal":
                end_seq = await self._blocking(self.service.seal_log, project, logstore, shard_id)
                return _json({"endSeq": end_seq}, call.request_id)
            await self._blocking(self.service.unseal_log, project, logstore, shard_id)
            return _json({}, call.request_id)
        else:
            raise ParameterInvalid(f"action must be split or merge, not {action!r}")
        return _json([self.service.shard_json(s) for s in shards], call.request_id)

    async def _put_logs(self, call: _Call, project: str, logstore: str, target: str) -> Response:
        headers = call.headers
        raw_size_text = headers.get("x-log-bodyrawsize", "")
        raw_size = (
            parse_decimal(raw_size_text, "x-log-bodyrawsize", PostBodyInvalid)
            if raw_size_text.strip()
            else None
        )
        await self.service.put_logs_async(
            project,
            logstore,
            target,
            call.optional("key"),
            call.body,
            headers.get("x-log-compresstype"),
            raw_size,
            self._blocking,
            parse_producer_header(headers.get(PRODUCER_HEADER)),
        )
        return _empty(call.request_id)

    async def _pull_logs(self, call: _Call, project: str, logstore: str, shard_id: int) -> Response:
        count = _int_param(call, "count", 1000)
        # LogHub's own bound on the reply's raw bytes (the hosted service has none); the
        # reply echoes the bound applied, so a client knows the server honoured it.
        bytes_max = None
        if call.optional(PULL_BYTES_MAX_PARAM) is not None:
            bytes_max = _int_param(call, PULL_BYTES_MAX_PARAM)
        wait_ms = None
        if call.optional(PULL_WAIT_MS_PARAM) is not None:
            wait_ms = _int_param(call, PULL_WAIT_MS_PARAM)
            if wait_ms < 0:
                raise ParameterInvalid(f"{PULL_WAIT_MS_PARAM} must not be negative, not {wait_ms}")
            wait_ms = min(wait_ms, self.config.limits.pull_wait_ms_max)
        accept = choose_response_compression(call.headers.get("accept-encoding"))
        pull = partial(
            self._blocking,
            self.service.pull_logs,
            project,
            logstore,
            shard_id,
            call.query.get("cursor", ""),
            count,
            call.optional("end_cursor"),
            accept,
            bytes_max,
        )
        result = await pull()
        waited: WaitEnd | None = None
        if wait_ms and result.tail is not None:
            # at the end of a writable shard: wait for data rather than answer empty
            waited = await self.service.tail_waits.wait(result.tail, wait_ms / 1000)
            if waited is WaitEnd.DATA:
                result = await pull()
        if not result.count and waited in (None, WaitEnd.FULL, WaitEnd.SEALED):
            # empty without waiting (a read-only shard, end_cursor, the waiter bound): the
            # echo says so, and the client pauses before pulling again
            wait_ms = None if wait_ms is None else 0
        headers = {
            "x-log-cursor": result.next_cursor,
            "x-log-count": str(result.count),
            "x-log-bodyrawsize": str(result.raw_size),
            "x-log-requestid": call.request_id,
        }
        if bytes_max is not None:
            headers[PULL_BYTES_MAX_HEADER] = str(result.bytes_max)
        if wait_ms is not None:
            headers[PULL_WAIT_MS_HEADER] = str(wait_ms)
        if result.compress_type:
            headers["x-log-compresstype"] = result.compress_type
        return Response(result.body, media_type=_PROTOBUF, headers=headers)


_Endpoint = Callable[..., Awaitable[Response]]
_Routed = tuple[_Endpoint, dict[str, Any]]
# What a (method, path) was routed to is kept: matching walks every route's regex, which cost
# a PutLogs more than the rest of its routing. Paths hold names, so the cache is bounded.
_ROUTES_CACHED_MAX = 4096
_NO_ROUTE: _Routed = (LogHubApp._query_logs, {})  # a marker, never called


def _match_route(method: str, path: str) -> _Routed:
    """The endpoint and path parameters of the route that takes (method, path), or
    ``_NO_ROUTE``."""
    scope = {"type": "http", "path": path, "root_path": "", "method": method}
    for route in _ROUTES:
        match, child_scope = route.matches(scope)
        # a regex's ``$`` also matches before a final newline: only the whole path counts
        if match is Match.FULL and route.path_regex.fullmatch(path):
            return child_scope["endpoint"], child_scope["path_params"]
    return _NO_ROUTE


def _api(path: str, endpoint: _Endpoint, methods: tuple[str, ...] | None = None) -> Route:
    """A route to one of ``LogHubApp``'s endpoints, called with the parsed call and the path's
    parameters. With ``methods`` None the endpoint tells the methods apart itself, after the
    checks that come first (the project), as the hosted service orders them. Given methods
    are taken exactly: Starlette adds HEAD to a GET route, and the protocol has no HEAD."""
    route = Route(path, endpoint, methods=methods or ("GET",))
    route.methods = None if methods is None else set(methods)
    return route


# Starlette's routes match the paths, first match wins; the ``type`` and ``action`` query
# parameters that choose among the APIs of one path are read by the endpoints (see
# ``_refuse_selectors``). ``_route`` walks them itself, rather than through a ``Router``, so
# that a miss is a LogHub error (not Starlette's plain-text 404 or 405) and every response
# still passes the one place that counts it.
_ROUTES: tuple[Route, ...] = (
    _api("/", LogHubApp._project),
    _api("/logstores", LogHubApp._logstores),
    _api("/logstores/{name}", LogHubApp._logstore),
    _api("/logstores/{logstore}/logs", LogHubApp._query_logs, ("POST",)),
    _api("/logstores/{logstore}/index", LogHubApp._query_logs, ("GET",)),
    _api("/logstores/{logstore}/shards", LogHubApp._list_shards, ("GET",)),
    _api("/logstores/{logstore}/shards/{target}", LogHubApp._shard),
    _api("/logstores/{logstore}/consumergroups", LogHubApp._consumer_groups),
    _api("/logstores/{logstore}/consumergroups/{name}", LogHubApp._consumer_group),
)


def build_app(config: ServerConfig, clock: Clock | None = None) -> LogHubApp:
    return LogHubApp(LogHubService(config, clock or SystemClock()))
