"""The web console at ``/console``: a page that shows the server's logstores, shards and
consumer groups, and refreshes itself.

The page and its script and style sheet are plain files in ``server/static/`` shipped in the
package: no build step, nothing fetched from the internet, so the console works on a machine
without access to it. The script reads one LogHub-only JSON document,
``GET /console/api/overview``, every two seconds, and computes ingest rates (and the chart)
from the differences of the ingest totals between two reads: the server keeps no history.

Access follows ``/metrics``: when keys are set, a signed request or HTTP Basic credentials
(key id and secret) of any known key. A refused request gets ``WWW-Authenticate: Basic`` with
the 401, so that a browser asks for the key and then sends it with every later request.

The overview costs one pass over the metadata and every shard's statistics (and one per
group over its checkpoints); it runs in a storage thread, never on the event loop.

Thread-safety: ``Console.handle`` runs on the event loop; ``overview`` may run in any thread.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from loghub.errors import AuthError, NotFoundError, ParameterInvalid
from loghub.metadata import Logstore, Shard, format_hash_key
from loghub.server.auth import Authenticator
from loghub.server.errors import protocol_error
from loghub.server.service import LogHubService
from loghub.wire.errors import error_body

__all__ = ["Console", "is_console_path", "overview"]

_PREFIX = "/console"
_OVERVIEW_PATH = "/console/api/overview"
_ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
# Everything the page loads comes from this server; no inline script, no framing.
_PAGE_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}

Blocking = Callable[..., Awaitable[Any]]


def is_console_path(path: str) -> bool:
    return path == _PREFIX or path.startswith(_PREFIX + "/")


def _read_static(name: str) -> bytes:
    return resources.files("loghub.server").joinpath("static", name).read_bytes()


class Console:
    def __init__(self, service: LogHubService, auth: Authenticator, blocking: Blocking) -> None:
        self._service = service
        self._auth = auth
        self._blocking = blocking
        # read once: the files are small and fixed for the life of the installed package
        self._page = _read_static("console.html")
        self._assets = {name: _read_static(name) for name in _ASSETS}

    async def handle(
        self, request: Request, headers: Mapping[str, str], request_id: str
    ) -> Response:
        path: str = request.scope["path"]
        if self._service.config.auth_enabled:
            try:
                self._auth.authenticate_metrics(
                    request.method,
                    path,
                    request.scope.get("query_string", b""),
                    headers,
                    self._service.clock.wall_ms() / 1000,
                )
            except AuthError as exc:
                return _refused(exc, request_id)
        if request.method != "GET":
            raise ParameterInvalid(f"unsupported API: {request.method} {path}")
        if path in (_PREFIX, _PREFIX + "/"):
            return Response(
                self._page, media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS
            )
        if path == _OVERVIEW_PATH:
            body = await self._blocking(overview, self._service)
            return Response(
                json.dumps(body, separators=(",", ":")),
                media_type="application/json",
                headers={"x-log-requestid": request_id, "cache-control": "no-store"},
            )
        name = path.removeprefix(_PREFIX + "/static/")
        if name in _ASSETS:
            return Response(self._assets[name], media_type=_ASSETS[name], headers=_PAGE_HEADERS)
        raise ParameterInvalid(f"unsupported API: GET {path[:200]}")


def _refused(exc: AuthError, request_id: str) -> Response:
    reply = protocol_error(exc)
    return Response(
        error_body(reply.code, reply.message, request_id),
        status_code=reply.status,
        media_type="application/json",
        headers={
            "x-log-requestid": request_id,
            "www-authenticate": 'Basic realm="LogHub console", charset="UTF-8"',
        },
    )


def overview(service: LogHubService) -> dict[str, Any]:
    """Every logstore with its size, ingest totals, shards and consumer groups."""
    totals = service.metrics.ingest_totals()
    logstores = []
    for project, store in service.logstores():
        try:
            shards = service.metadata.list_shards(project, store.name)
            shard_rows = [_shard_row(service, store, shard) for shard in shards]
            groups = [
                _group_row(service, project, store.name, str(group["name"]), group)
                for group in service.groups.list_groups(project, store.name)
            ]
        except NotFoundError:  # deleted between two reads
            continue
        logs, raw_bytes = totals.get((project, store.name), (0.0, 0.0))
        logstores.append(
            {
                "project": project,
                "name": store.name,
                "ttlDays": store.ttl_days,
                "sizeBytes": sum(row["sizeBytes"] for row in shard_rows),
                "ingestLogsTotal": logs,
                "ingestBytesTotal": raw_bytes,
                "shards": shard_rows,
                "groups": groups,
            }
        )
    return {
        "timeMs": service.clock.wall_ms(),
        "diskFreeBytes": service.disk_free_bytes(),
        "logstores": logstores,
    }


def _shard_row(service: LogHubService, store: Logstore, shard: Shard) -> dict[str, Any]:
    statistics = service.shard_statistics(store, shard)
    return {
        "shardId": shard.shard_id,
        "status": shard.status,
        "beginKey": format_hash_key(shard.begin_key),
        "endKey": format_hash_key(shard.end_key),
        "parents": list(shard.parents),
        "children": list(shard.children),
        "beginSeq": statistics.begin_seq,
        "endSeq": statistics.end_seq,
        "sizeBytes": statistics.size_bytes,
    }


def _group_row(
    service: LogHubService, project: str, logstore: str, name: str, definition: dict[str, object]
) -> dict[str, Any]:
    statuses = service.groups.shard_status(project, logstore, name)
    return {
        "name": name,
        "timeout": definition.get("timeout"),
        "order": definition.get("order"),
        "lagLogGroups": sum(status.lag_log_groups for status in statuses),
        "lagSeconds": max((status.lag_s for status in statuses), default=0.0),
        "shards": [
            {
                "shardId": status.shard_id,
                "state": status.state,
                "owner": status.owner,
                "checkpoint": status.checkpoint,
                "checkpointSeq": status.checkpoint_seq,
                "endSeq": status.end_seq,
                "lagLogGroups": status.lag_log_groups,
                "lagSeconds": status.lag_s,
            }
            for status in statuses
        ],
    }
