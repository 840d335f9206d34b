"""The HTTP face of the server: the LogHub REST API as an ASGI application.

Routing follows the protocol reference: the project comes from the first label of the `Host`
header (``<project>.<base host>``), never from the path, and one path often carries several
operations told apart by the method and the `type` or `action` query parameter. Absolute-form
request targets (``GET http://proj.127.0.0.1:8080/logstores HTTP/1.1``, what the SDK sends
through ``HTTP_PROXY``) reach here as plain paths: uvicorn's parser keeps only path and query.

Every failure becomes ``{"errorCode", "errorMessage", "requestId"}`` with the status from
``server/errors.py``; an unexpected exception is logged and answered with 500
InternalServerError (never with its text, which may hold internals).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response

from loghub._clock import Clock, SystemClock
from loghub.errors import (
    LogHubError,
    ParameterInvalid,
    PostBodyInvalid,
    PostBodyTooLarge,
    ProjectNotExist,
    StorageError,
)
from loghub.server.config import ServerConfig
from loghub.server.errors import http_status
from loghub.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from loghub.server.metrics import api_label
from loghub.server.service import LogHubService, parse_shard_id
from loghub.wire.compression import choose_response_compression
from loghub.wire.errors import error_body
from loghub.wire.logs import PULL_BYTES_MAX_HEADER, PULL_BYTES_MAX_PARAM
from loghub.wire.signing import verify

__all__ = ["LogHubApp", "build_app", "project_from_host"]

log = logging.getLogger("loghub.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
T = TypeVar("T")

_JSON = "application/json"
_PROTOBUF = "application/x-protobuf"


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


class _Call:
    """One request, parsed once: what every handler needs."""

    __slots__ = ("body", "method", "path", "parts", "project", "query", "request", "request_id")

    def __init__(self, request: Request, request_id: str, project: str | None) -> None:
        self.request = request
        self.request_id = request_id
        self.project = project
        self.method: str = request.method
        self.path: str = request.scope["path"]
        self.parts = [p for p in self.path.split("/") if p]
        raw_query: bytes = request.scope.get("query_string", b"")
        self.query = dict(parse_qsl(raw_query.decode("latin-1"), keep_blank_values=True))
        self.body = b""

    def need_project(self) -> str:
        if self.project is None:
            raise ProjectNotExist("the Host header names no project (<project>.<host>)")
        return self.project

    def json_body(self) -> Any:
        try:
            return json.loads(self.body) if self.body else None
        except ValueError as exc:
            raise PostBodyInvalid(f"the body is not valid JSON: {exc}") from exc

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


def _empty(request_id: str) -> Response:
    return Response(b"", headers={"x-log-requestid": request_id})


def _error(exc: LogHubError, request_id: str) -> Response:
    return Response(
        error_body(exc.code, exc.message, request_id),
        status_code=http_status(exc),
        media_type=_JSON,
        headers={"x-log-requestid": request_id},
    )


def _int_param(call: _Call, name: str, default: int | None = None) -> int:
    text = call.query.get(name)
    if text is None:
        if default is None:
            raise ParameterInvalid(f"the query parameter {name} is required")
        return default
    text = text.strip()
    if not text.lstrip("-").isdigit() or len(text) > 12:
        raise ParameterInvalid(f"{name} must be an integer, not {text!r}")
    return int(text)


class LogHubApp:
    def __init__(self, service: LogHubService) -> None:
        self.service = service
        self.config: ServerConfig = service.config
        self.clock: Clock = service.clock
        self._executor = ThreadPoolExecutor(
            self.config.storage_threads, thread_name_prefix="loghub-storage"
        )
        self._background: list[asyncio.Task[None]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        request_id = os.urandom(12).hex().upper()
        started = time.perf_counter()
        try:
            response = await self._handle(request, request_id)
        except StorageError as exc:
            # the server's own fault: the details (paths, positions) are for its log only
            log.error("request %s %s: %s", scope.get("method"), scope.get("path"), exc)
            response = _error(LogHubError("internal storage error"), request_id)
        except LogHubError as exc:
            response = _error(exc, request_id)
        except Exception:
            log.exception("request %s %s failed", scope.get("method"), scope.get("path"))
            response = _error(LogHubError("internal server error"), request_id)
        await response(scope, receive, send)
        self._count(request, response.status_code, time.perf_counter() - started)

    def _count(self, request: Request, status: int, elapsed_s: float) -> None:
        path: str = request.scope["path"]
        if path in ("/health", "/metrics"):
            return
        raw_query: bytes = request.scope.get("query_string", b"")
        query = dict(parse_qsl(raw_query.decode("latin-1")))
        api = api_label(request.method, [p for p in path.split("/") if p], query)
        metrics = self.service.metrics
        metrics.requests.labels(api, str(status)).inc()
        metrics.request_seconds.labels(api).observe(elapsed_s)

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
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

    async def close(self) -> None:
        for task in self._background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
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

    async def _read_body(self, request: Request) -> bytes:
        limit = self.config.limits.request_body_bytes_max
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise PostBodyTooLarge(f"the body is {declared} bytes; at most {limit} are allowed")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PostBodyTooLarge(f"the body is over {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _handle(self, request: Request, request_id: str) -> Response:
        if request.scope["path"] == "/health":
            return _json({"status": "ok", "pid": os.getpid()}, request_id)
        if request.scope["path"] == "/metrics":
            return Response(self.service.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)
        project = project_from_host(request.headers.get("host", ""), self.config.base_hosts)
        call = _Call(request, request_id, project)
        call.body = await self._read_body(request)
        if self.config.auth_enabled:
            self._authenticate(call)
        return await self._route(call)

    def _authenticate(self, call: _Call) -> None:
        headers = {k.lower(): v for k, v in call.request.headers.items()}
        verify(
            call.method,
            call.path,
            call.request.scope.get("query_string", b""),
            headers,
            call.body,
            self.config.keys.get,
            self.clock.wall_ms() / 1000,
            float(self.config.limits.clock_skew_s_max),
        )

    async def _route(self, call: _Call) -> Response:
        parts = call.parts
        if not parts:
            return await self._project(call)
        if parts[0] == "logstores":
            if len(parts) == 1:
                return await self._logstores(call)
            if len(parts) == 2:
                return await self._logstore(call, parts[1])
            if parts[2] == "shards" and len(parts) == 3 and call.method == "GET":
                return self._list_shards(call, parts[1])
            if parts[2] == "shards" and len(parts) == 4:
                return await self._shard(call, parts[1], parts[3])
            if parts[2] == "consumergroups" and len(parts) == 3:
                return await self._consumer_groups(call, parts[1])
            if parts[2] == "consumergroups" and len(parts) == 4:
                return await self._consumer_group(call, parts[1], parts[3])
        raise ParameterInvalid(f"unsupported API: {call.method} {call.path}")

    # -- projects ----------------------------------------------------------------------------

    async def _project(self, call: _Call) -> Response:
        meta = self.service.metadata
        if call.project is None:
            if call.method != "GET":
                raise ParameterInvalid(f"unsupported API: {call.method} / without a project")
            offset = _int_param(call, "offset", 0)
            size = _int_param(call, "size", 500)
            projects, total = meta.list_projects(offset, size, call.query.get("projectName", ""))
            return _json(
                {
                    "count": len(projects),
                    "total": total,
                    "projects": [p.to_json() for p in projects],
                },
                call.request_id,
            )
        if call.method == "POST":
            body = call.json_object()
            meta.create_project(call.project, str(body.get("description", "")))
            return _empty(call.request_id)
        if call.method == "GET":
            return _json(meta.get_project(call.project).to_json(), call.request_id)
        if call.method == "DELETE":
            await self._blocking(self.service.delete_project, call.project)
            return _empty(call.request_id)
        raise ParameterInvalid(f"unsupported API: {call.method} /")

    # -- logstores ---------------------------------------------------------------------------

    async def _logstores(self, call: _Call) -> Response:
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
        project = call.need_project()
        groups = self.service.groups
        if call.method == "POST":
            await self._blocking(groups.create, project, logstore, call.json_body())
            return _empty(call.request_id)
        if call.method == "GET":
            return _json(groups.list_groups(project, logstore), call.request_id)
        raise ParameterInvalid(f"unsupported API: {call.method} {call.path}")

    async def _consumer_group(self, call: _Call, logstore: str, name: str) -> Response:
        project = call.need_project()
        groups = self.service.groups
        kind = call.query.get("type")
        consumer = call.query.get("consumer", "")
        if call.method == "POST" and kind == "heartbeat":
            granted = await self._blocking(
                groups.heartbeat, project, logstore, name, consumer, call.json_body()
            )
            return _json(granted, call.request_id)
        if call.method == "POST" and kind == "checkpoint":
            force = call.query.get("forceSuccess", "true").lower() == "true"
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
            shard = call.query.get("shard")
            shard_id = None if shard is None else _int_param(call, "shard")
            if shard_id is not None and shard_id < 0:
                shard_id = None
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

    def _list_shards(self, call: _Call, logstore: str) -> Response:
        shards = self.service.metadata.list_shards(call.need_project(), logstore)
        return _json([self.service.shard_json(s) for s in shards], call.request_id)

    async def _shard(self, call: _Call, logstore: str, target: str) -> Response:
        project = call.need_project()
        if call.method == "POST" and "action" not in call.query:
            return await self._put_logs(call, project, logstore, target)
        if call.method == "POST":
            return await self._reshard(call, project, logstore, target)
        if call.method == "GET":
            shard_id = parse_shard_id(target)
            kind = call.query.get("type")
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

    async def _reshard(self, call: _Call, project: str, logstore: str, target: str) -> Response:
        shard_id = parse_shard_id(target)
        action = call.query.get("action")
        if action == "split":
            shards = await self._blocking(
                self.service.split_shard, project, logstore, shard_id, call.query.get("key")
            )
        elif action == "merge":
            shards = await self._blocking(self.service.merge_shard, project, logstore, shard_id)
        else:
            raise ParameterInvalid(f"action must be split or merge, not {action!r}")
        return _json([self.service.shard_json(s) for s in shards], call.request_id)

    async def _put_logs(self, call: _Call, project: str, logstore: str, target: str) -> Response:
        headers = call.request.headers
        raw_size_text = headers.get("x-log-bodyrawsize")
        raw_size = int(raw_size_text) if raw_size_text and raw_size_text.strip().isdigit() else None
        await self._blocking(
            self.service.put_logs,
            project,
            logstore,
            target,
            call.query.get("key"),
            call.body,
            headers.get("x-log-compresstype"),
            raw_size,
        )
        return _empty(call.request_id)

    async def _pull_logs(self, call: _Call, project: str, logstore: str, shard_id: int) -> Response:
        count = _int_param(call, "count", 1000)
        # LogHub's own bound on the reply's raw bytes (the hosted service has none); the
        # reply echoes the bound applied, so a client knows the server honoured it.
        bytes_max = None
        if PULL_BYTES_MAX_PARAM in call.query:
            bytes_max = _int_param(call, PULL_BYTES_MAX_PARAM)
        accept = choose_response_compression(call.request.headers.get("accept-encoding"))
        result = await self._blocking(
            self.service.pull_logs,
            project,
            logstore,
            shard_id,
            call.query.get("cursor", ""),
            count,
            call.query.get("end_cursor"),
            accept,
            bytes_max,
        )
        headers = {
            "x-log-cursor": result.next_cursor,
            "x-log-count": str(result.count),
            "x-log-bodyrawsize": str(result.raw_size),
            "x-log-requestid": call.request_id,
        }
        if bytes_max is not None:
            headers[PULL_BYTES_MAX_HEADER] = str(result.bytes_max)
        if result.compress_type:
            headers["x-log-compresstype"] = result.compress_type
        return Response(result.body, media_type=_PROTOBUF, headers=headers)


def build_app(config: ServerConfig, clock: Clock | None = None) -> LogHubApp:
    return LogHubApp(LogHubService(config, clock or SystemClock()))
