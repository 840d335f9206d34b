"""LogHubClient: the REST API of a LogHub server (or the hosted service) from Python.

Project addressing is explicit: the client connects to the endpoint it was given and names the
project in the `Host` header (``<project>.<endpoint host>``), as the protocol wants, without
needing DNS to resolve ``<project>.<host>``. Requests are signed (v1 by default, v4 on request)
when keys are given. Error replies raise the matching ``loghub.errors`` class, so
``except LogStoreNotExist`` works the same in and out of the server.

An ``https://`` endpoint speaks TLS and checks the server's certificate against the
system's trusted authorities, or only against ``ca_cert`` (a PEM bundle) when given, which
is how a private or self-signed certificate authority is trusted. Without ``ca_cert`` the
environment variable ``LOGHUB_CA_CERT`` names that bundle, so every tool built on this client
(the ``loghub`` commands, consumers, Spark jobs) can be pointed at a private CA the same way.
``verify=False`` turns checking off (for a quick test only: it lets anyone in the middle
read and change traffic).

Thread-safety: one client may be shared by threads (httpx.Client is thread-safe, and pulls
take connections of their own one request at a time, see ``loghub.client._pulls``).
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlencode, urlsplit

from loghub._clock import Clock, SystemClock
from loghub._httpx import httpx
from loghub._retry import RetryPolicy, retry_call
from loghub.client._pulls import PullConnections
from loghub.errors import ParameterInvalid, TransportError
from loghub.wire.compression import compress, decompress
from loghub.wire.errors import error_from_body
from loghub.wire.logs import (
    PULL_BYTES_MAX_HEADER,
    PULL_BYTES_MAX_PARAM,
    PULL_WAIT_MS_HEADER,
    PULL_WAIT_MS_PARAM,
    parse_pulled_log_group_list,
)
from loghub.wire.producer_ids import PRODUCER_HEADER, ProducerIds, WriteId
from loghub.wire.proto import LogGroup, LogGroupList
from loghub.wire.signing import Credentials, sign_v1, sign_v4

__all__ = ["LogHubClient", "PullResult", "PulledBody", "RawPullResult", "ShardInfo"]

API_VERSION = "0.6.0"
CA_CERT_ENV = "LOGHUB_CA_CERT"
_PULL_RAW_BYTES_MAX = 256 * 1024 * 1024


@dataclass(frozen=True)
class ShardInfo:
    """A shard as list_shards shows it, with its lineage when the server reports it (LogHub
    does; the hosted service does not, and then the lineage fields stay empty)."""

    shard_id: int
    status: str
    inclusive_begin_key: str
    exclusive_end_key: str
    create_time: int
    parents: tuple[int, ...] = ()
    children: tuple[int, ...] = ()
    close_time: int | None = None
    end_cursor: str | None = None  # a read-only shard's fixed end
    # in a LogHub cluster: the node holding the shard's log, and its host:port while alive
    node: str | None = None
    node_address: str | None = None

    @property
    def writable(self) -> bool:
        return self.status.lower() == "readwrite"

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ShardInfo:
        close_time = body.get("closeTime")
        end_cursor = body.get("endCursor")
        return cls(
            shard_id=int(body["shardID"]),
            status=str(body["status"]),
            inclusive_begin_key=str(body["inclusiveBeginKey"]),
            exclusive_end_key=str(body["exclusiveEndKey"]),
            create_time=int(body.get("createTime", 0)),
            parents=tuple(int(p) for p in body.get("parents", ())),
            children=tuple(int(c) for c in body.get("children", ())),
            close_time=None if close_time is None else int(close_time),
            end_cursor=None if end_cursor is None else str(end_cursor),
            node=None if body.get("node") is None else str(body["node"]),
            node_address=None if body.get("nodeAddress") is None else str(body["nodeAddress"]),
        )


@dataclass(frozen=True)
class PulledBody:
    """One pull's reply as it came over the wire, still compressed: the cheapest form to keep
    while it waits (lz4 makes logs several times smaller than their decoded messages), for
    callers that decompress and parse only when the groups are needed (the consumer)."""

    body: bytes
    compress_type: str | None
    next_cursor: str
    count: int
    raw_size: int  # the serialized LogGroupList's size
    bytes_max: int | None  # the raw-byte bound the server applied; None: it applied none
    # The longest the server would have waited for data at the end of the shard (long poll);
    # None: it knows no such wait (not LogHub, or not asked); 0: it did not wait this time.
    wait_ms: int | None = None

    def decompress(self) -> bytes:
        """The serialized ``LogGroupList``."""
        if not self.raw_size:
            return b""
        limit = max(self.raw_size, _PULL_RAW_BYTES_MAX)
        return decompress(self.compress_type, self.body, self.raw_size, limit)

    def parse(self) -> LogGroupList:
        return parse_pulled_log_group_list(self.decompress())


@dataclass(frozen=True)
class RawPullResult:
    data: bytes  # the serialized LogGroupList, decompressed
    next_cursor: str
    count: int
    raw_size: int
    bytes_max: int | None = None  # as in PulledBody


@dataclass(frozen=True)
class PullResult:
    log_group_list: LogGroupList
    next_cursor: str
    count: int
    raw_size: int
    bytes_max: int | None = None  # as in PulledBody

    @property
    def log_groups(self) -> Sequence[LogGroup]:
        return self.log_group_list.LogGroups  # type: ignore[no-any-return]


def _tls_verification(
    ca_cert: str | os.PathLike[str] | None, verify: bool = True
) -> ssl.SSLContext | bool:
    """What httpx's ``verify`` gets: the system's authorities (True), none (False), or a
    context trusting only ``ca_cert``. Built here because httpx no longer takes a path."""
    if not verify:
        return False
    if ca_cert is None:
        ca_cert = os.environ.get(CA_CERT_ENV) or None
    if ca_cert is None:
        return True
    try:
        return ssl.create_default_context(cafile=os.fspath(ca_cert))
    except (OSError, ssl.SSLError) as exc:
        raise TransportError(f"cannot load the CA bundle {os.fspath(ca_cert)}: {exc}") from exc


def _target(path: str, query: Sequence[tuple[str, str]]) -> str:
    """The request target: the path and its encoded query, as both HTTP ways send it."""
    return path + ("?" + urlencode(list(query)) if query else "")


class LogHubClient:
    def __init__(
        self,
        endpoint: str,
        access_key_id: str = "",
        access_key_secret: str = "",
        *,
        auth_version: Literal["v1", "v4"] = "v1",
        region: str = "",
        timeout_s: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        clock: Clock | None = None,
        ca_cert: str | os.PathLike[str] | None = None,
        verify: bool = True,
        idempotent: bool = False,
        write_retry: RetryPolicy | None = None,
    ) -> None:
        """``idempotent``: every ``put_log_group`` names its write (a producer id of this
        client and a sequence), retries it on a timeout, a lost connection or a 5xx
        (``write_retry``, by default 8 attempts over about 20 s), and the server stores it
        once however many attempts reach it, also across a failover of the shard's leader
        (docs/replication.md). Without it a write is sent once and a failure is raised."""
        if "://" not in endpoint:
            endpoint = "http://" + endpoint
        try:
            parts = urlsplit(endpoint)
            parts.port  # noqa: B018  # raises ValueError on a port that is not a number
        except ValueError as exc:
            raise ParameterInvalid(f"endpoint {endpoint!r} is not a URL: {exc}") from None
        if not parts.hostname:
            raise ParameterInvalid(f"endpoint {endpoint!r} names no host (host:port)")
        if parts.scheme not in ("http", "https"):
            raise ParameterInvalid(f"endpoint {endpoint!r}: the scheme must be http or https")
        self._base_url = f"{parts.scheme}://{parts.netloc}"
        self._host = parts.hostname
        self._credentials = (
            Credentials(access_key_id, access_key_secret)
            if access_key_id and access_key_secret
            else None
        )
        if auth_version not in ("v1", "v4"):
            raise ParameterInvalid(f"auth_version must be v1 or v4, not {auth_version!r}")
        if auth_version == "v4" and not region:
            raise ParameterInvalid("v4 signing needs a region")
        self._auth_version = auth_version
        self.producer_ids = ProducerIds() if idempotent else None
        self._write_retry = write_retry or RetryPolicy(8, 0.1, 5.0)
        self._region = region
        self._clock = clock or SystemClock()
        # pulls take a leaner way (see ``loghub.client._pulls``) unless a transport was given
        lean_pulls = transport is None
        verification = _tls_verification(ca_cert, verify)  # a bad bundle is refused here
        context: ssl.SSLContext | None = None
        if transport is None and parts.scheme == "http":
            # plain http speaks no TLS (and follows no redirect): no context to build from the
            # system's authorities, which costs 50 to 350 ms per client (a Spark task each)
            transport = httpx.HTTPTransport(verify=False)
        elif transport is None:  # one context for both ways (building one reads the CAs)
            context = httpx.create_ssl_context(verify=verification, trust_env=False)
        self._http = httpx.Client(
            timeout=timeout_s, transport=transport, trust_env=False, verify=context or False
        )
        self._pulls = (
            PullConnections(parts.scheme, parts.hostname, parts.port, timeout_s, context)
            if lean_pulls
            else None
        )

    def close(self) -> None:
        self._http.close()
        if self._pulls is not None:
            self._pulls.close()

    def __enter__(self) -> LogHubClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        project: str | None,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        all_headers = self._signed_headers(method, project, path, query, body, headers)
        url = self._base_url + _target(path, query)
        try:
            response = self._http.request(method, url, content=body, headers=all_headers)
        except httpx.HTTPError as exc:
            raise TransportError(f"{method} {path}: {exc}") from exc
        if response.status_code != 200:
            raise error_from_body(
                response.status_code, response.content, response.headers.get("x-log-requestid")
            )
        return response

    def _signed_headers(
        self,
        method: str,
        project: str | None,
        path: str,
        query: Sequence[tuple[str, str]],
        body: bytes,
        headers: Mapping[str, str] | None,
    ) -> dict[str, str]:
        all_headers = {
            "host": f"{project}.{self._host}" if project else self._host,
            "x-log-apiversion": API_VERSION,
            "x-log-bodyrawsize": str(len(body)),
        }
        all_headers.update({k.lower(): v for k, v in (headers or {}).items()})
        if self._credentials is not None:
            now_s = self._clock.wall_ms() / 1000
            if self._auth_version == "v4":
                sign_v4(
                    method, path, query, all_headers, body, self._credentials, self._region, now_s
                )
            else:
                # v1 does not sign Host; a LogHub server binds the signature to the project
                # through this signed header (the hosted service ignores unknown x-log-* ones)
                all_headers["x-log-project"] = project or ""
                sign_v1(method, path, query, all_headers, body, self._credentials, now_s)
        return all_headers

    def _get_whole(
        self, project: str, path: str, query: Sequence[tuple[str, str]], headers: dict[str, str]
    ) -> tuple[Callable[[str], str | None], bytes]:
        """A GET whose reply is read whole (pulls): its header lookup and body; an error
        reply raises its ``loghub.errors`` class, as ``_request`` does."""
        if self._pulls is None:
            response = self._request("GET", project, path, query, headers=headers)
            return response.headers.get, response.content
        all_headers = self._signed_headers("GET", project, path, query, b"", headers)
        reply = self._pulls.get(_target(path, query), all_headers)
        if reply.status != 200:
            raise error_from_body(reply.status, reply.body, reply.header("x-log-requestid"))
        return reply.header, reply.body

    def _json_request(
        self,
        method: str,
        project: str | None,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
    ) -> Any:
        payload = b"" if body is None else json.dumps(body).encode()
        response = self._request(
            method, project, path, query, payload, {"content-type": "application/json"}
        )
        return response.json() if response.content else None

    # -- projects ----------------------------------------------------------------------------

    def health(self) -> bool:
        try:
            return self._http.get(self._base_url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def create_project(self, project: str, description: str = "") -> None:
        self._json_request(
            "POST", project, "/", body={"projectName": project, "description": description}
        )

    def get_project(self, project: str) -> dict[str, Any]:
        return dict(self._json_request("GET", project, "/"))

    def list_projects(self, offset: int = 0, size: int = 500) -> list[dict[str, Any]]:
        reply = self._json_request("GET", None, "/", [("offset", str(offset)), ("size", str(size))])
        return list(reply["projects"])

    def delete_project(self, project: str) -> None:
        self._json_request("DELETE", project, "/")

    # -- logstores ---------------------------------------------------------------------------

    def create_logstore(
        self,
        project: str,
        logstore: str,
        *,
        shard_count: int = 2,
        ttl_days: int = 30,
        **fields: Any,
    ) -> None:
        body = {"logstoreName": logstore, "ttl": ttl_days, "shardCount": shard_count}
        body.update(fields)
        self._json_request("POST", project, "/logstores", body=body)

    def get_logstore(self, project: str, logstore: str) -> dict[str, Any]:
        return dict(self._json_request("GET", project, f"/logstores/{logstore}"))

    def describe_logstore(self, project: str, logstore: str) -> dict[str, Any]:
        """LogHub only: the logstore (as get_logstore), and per shard its size on disk,
        retained range and write rate, with totals. See docs/protocol.md."""
        reply = self._json_request("GET", project, f"/logstores/{logstore}", [("type", "describe")])
        return dict(reply)

    def list_logstores(self, project: str, offset: int = 0, size: int = 500) -> list[str]:
        reply = self._json_request(
            "GET", project, "/logstores", [("offset", str(offset)), ("size", str(size))]
        )
        return list(reply["logstores"])

    def update_logstore(self, project: str, logstore: str, **fields: Any) -> None:
        body = self.get_logstore(project, logstore)
        body.update(fields)
        self._json_request("PUT", project, f"/logstores/{logstore}", body=body)

    def delete_logstore(self, project: str, logstore: str) -> None:
        self._json_request("DELETE", project, f"/logstores/{logstore}")

    def list_shards(self, project: str, logstore: str) -> list[ShardInfo]:
        reply = self._json_request("GET", project, f"/logstores/{logstore}/shards")
        return [ShardInfo.from_json(s) for s in reply]

    def split_shard(
        self, project: str, logstore: str, shard_id: int, key: str | None = None
    ) -> list[ShardInfo]:
        """Splits a readwrite shard at `key` (32 hex digits; LogHub splits in the middle of
        the range when it is omitted); returns [parent, left child, right child]."""
        query = [("action", "split")] + ([("key", key)] if key else [])
        path = f"/logstores/{logstore}/shards/{shard_id}"
        return [ShardInfo.from_json(s) for s in self._json_request("POST", project, path, query)]

    def merge_shard(self, project: str, logstore: str, shard_id: int) -> list[ShardInfo]:
        """Merges a readwrite shard with its right-hand neighbour; returns [merged, left,
        right]."""
        path = f"/logstores/{logstore}/shards/{shard_id}"
        reply = self._json_request("POST", project, path, [("action", "merge")])
        return [ShardInfo.from_json(s) for s in reply]

    # -- consumer groups -----------------------------------------------------------------------

    def create_consumer_group(
        self, project: str, logstore: str, group: str, timeout_s: int, ordered: bool = False
    ) -> None:
        body = {"consumerGroup": group, "timeout": timeout_s, "order": ordered}
        self._json_request("POST", project, f"/logstores/{logstore}/consumergroups", body=body)

    def update_consumer_group(
        self,
        project: str,
        logstore: str,
        group: str,
        timeout_s: int | None = None,
        ordered: bool | None = None,
    ) -> None:
        body: dict[str, Any] = {}
        if timeout_s is not None:
            body["timeout"] = timeout_s
        if ordered is not None:
            body["order"] = ordered
        path = f"/logstores/{logstore}/consumergroups/{group}"
        self._json_request("PUT", project, path, body=body)

    def delete_consumer_group(self, project: str, logstore: str, group: str) -> None:
        self._json_request("DELETE", project, f"/logstores/{logstore}/consumergroups/{group}")

    def list_consumer_groups(self, project: str, logstore: str) -> list[dict[str, Any]]:
        reply = self._json_request("GET", project, f"/logstores/{logstore}/consumergroups")
        return list(reply)

    def heartbeat(
        self, project: str, logstore: str, group: str, consumer: str, held: Sequence[int]
    ) -> list[int]:
        """Reports the shards `consumer` holds; returns the shards it should hold."""
        path = f"/logstores/{logstore}/consumergroups/{group}"
        query = [("type", "heartbeat"), ("consumer", consumer)]
        return [int(s) for s in self._json_request("POST", project, path, query, list(held))]

    def update_checkpoint(
        self,
        project: str,
        logstore: str,
        group: str,
        shard_id: int,
        cursor: str,
        consumer: str = "",
        force: bool = True,
    ) -> None:
        """Saves a shard's checkpoint; with force=False only the shard's holder may (the
        server answers ConsumerNotMatch to anyone else)."""
        path = f"/logstores/{logstore}/consumergroups/{group}"
        query = [
            ("type", "checkpoint"),
            ("consumer", consumer),
            ("forceSuccess", "True" if force else "False"),
        ]
        body = {"shard": shard_id, "checkpoint": cursor}
        self._json_request("POST", project, path, query, body)

    def get_checkpoints(
        self, project: str, logstore: str, group: str, shard_id: int | None = None
    ) -> dict[int, str]:
        """Shard id -> checkpoint cursor ("" where none was saved)."""
        path = f"/logstores/{logstore}/consumergroups/{group}"
        query = [] if shard_id is None else [("shard", str(shard_id))]
        reply = self._json_request("GET", project, path, query)
        return {int(entry["shard"]): str(entry["checkpoint"]) for entry in reply}

    def describe_consumer_group(self, project: str, logstore: str, group: str) -> dict[str, Any]:
        """LogHub only (the hosted service has no such API): the group's live consumers and,
        per shard, its state, owner, checkpoint, end and lag (``lagGroups``, ``lagSeconds``),
        with the group's totals. See docs/protocol.md."""
        path = f"/logstores/{logstore}/consumergroups/{group}"
        reply = self._json_request("GET", project, path, [("type", "describe")])
        return dict(reply)

    # -- data --------------------------------------------------------------------------------

    def put_log_group(
        self,
        project: str,
        logstore: str,
        log_group: LogGroup | bytes,
        *,
        hash_key: str | None = None,
        shard_id: int | None = None,
        compress_type: str = "lz4",
        write_id: WriteId | None = None,
    ) -> None:
        """Writes one log group: to `shard_id`, to the shard covering `hash_key`, or to any
        readwrite shard (load-balanced). With ``write_id`` (or an ``idempotent`` client,
        which makes one per call and retries), the server stores it once however often it
        is sent with that id."""
        raw = log_group if isinstance(log_group, bytes) else log_group.SerializeToString()
        query: list[tuple[str, str]] = []
        if shard_id is not None:
            target = str(shard_id)
        elif hash_key is not None:
            target, query = "route", [("key", hash_key)]
        else:
            target = "lb"
        headers = {"content-type": "application/x-protobuf"}
        body = raw
        if compress_type:
            body = compress(compress_type, raw)
            headers["x-log-compresstype"] = compress_type
        headers["x-log-bodyrawsize"] = str(len(raw))
        path = f"/logstores/{logstore}/shards/{target}"
        if write_id is None and self.producer_ids is not None:
            write_id = self.producer_ids.next()
            headers[PRODUCER_HEADER] = write_id.header
            retry_call(
                lambda: self._request("POST", project, path, query, body, headers),
                self._write_retry,
            )
            return
        if write_id is not None:
            headers[PRODUCER_HEADER] = write_id.header
        self._request("POST", project, path, query, body, headers)

    def get_cursor(self, project: str, logstore: str, shard_id: int, position: str | int) -> str:
        """The cursor at `begin`, `end`, or the first group received at or after a unix time."""
        reply = self._json_request(
            "GET",
            project,
            f"/logstores/{logstore}/shards/{shard_id}",
            [("type", "cursor"), ("from", str(position))],
        )
        return str(reply["cursor"])

    def get_cursor_time(self, project: str, logstore: str, shard_id: int, cursor: str) -> int:
        reply = self._json_request(
            "GET",
            project,
            f"/logstores/{logstore}/shards/{shard_id}",
            [("type", "cursor_time"), ("cursor", cursor)],
        )
        return int(reply["cursor_time"])

    def pull_logs_body(
        self,
        project: str,
        logstore: str,
        shard_id: int,
        cursor: str,
        count: int = 1000,
        end_cursor: str | None = None,
        compress_type: str = "lz4",
        bytes_max: int | None = None,
        wait_ms: int | None = None,
    ) -> PulledBody:
        """One pull, its reply left compressed. ``bytes_max`` asks a LogHub server for at most
        that many raw bytes (or the first group, whatever its size); other servers ignore
        it, which ``PulledBody.bytes_max`` (None) tells. ``wait_ms`` asks a LogHub server to
        hold a pull at the end of the shard until data comes, at most that long (long poll;
        ``PulledBody.wait_ms`` tells what it applied). The HTTP timeout must exceed it."""
        query = [("type", "log"), ("cursor", cursor), ("count", str(count))]
        if end_cursor is not None:
            query.append(("end_cursor", end_cursor))
        if bytes_max is not None:
            query.append((PULL_BYTES_MAX_PARAM, str(bytes_max)))
        if wait_ms is not None:
            query.append((PULL_WAIT_MS_PARAM, str(wait_ms)))
        header, body = self._get_whole(
            project,
            f"/logstores/{logstore}/shards/{shard_id}",
            query,
            headers={"accept": "application/x-protobuf", "accept-encoding": compress_type},
        )
        applied = header(PULL_BYTES_MAX_HEADER)
        waited = header(PULL_WAIT_MS_HEADER)
        return PulledBody(
            body=body,
            compress_type=header("x-log-compresstype"),
            next_cursor=header("x-log-cursor") or cursor,
            count=int(header("x-log-count") or "0"),
            raw_size=int(header("x-log-bodyrawsize") or "0"),
            bytes_max=int(applied) if applied and applied.isdigit() else None,
            wait_ms=int(waited) if waited and waited.isdigit() else None,
        )

    def pull_logs_raw(
        self,
        project: str,
        logstore: str,
        shard_id: int,
        cursor: str,
        count: int = 1000,
        end_cursor: str | None = None,
        compress_type: str = "lz4",
        bytes_max: int | None = None,
    ) -> RawPullResult:
        """One pull, its groups left as the serialized (decompressed) ``LogGroupList``, for
        callers that decode it their own way (the Spark source)."""
        pulled = self.pull_logs_body(
            project, logstore, shard_id, cursor, count, end_cursor, compress_type, bytes_max
        )
        return RawPullResult(
            data=pulled.decompress(),
            next_cursor=pulled.next_cursor,
            count=pulled.count,
            raw_size=pulled.raw_size,
            bytes_max=pulled.bytes_max,
        )

    def pull_logs(
        self,
        project: str,
        logstore: str,
        shard_id: int,
        cursor: str,
        count: int = 1000,
        end_cursor: str | None = None,
        compress_type: str = "lz4",
        bytes_max: int | None = None,
    ) -> PullResult:
        raw = self.pull_logs_raw(
            project, logstore, shard_id, cursor, count, end_cursor, compress_type, bytes_max
        )
        return PullResult(
            log_group_list=parse_pulled_log_group_list(raw.data),
            next_cursor=raw.next_cursor,
            count=raw.count,
            raw_size=raw.raw_size,
            bytes_max=raw.bytes_max,
        )

    def iter_pull(
        self,
        project: str,
        logstore: str,
        shard_id: int,
        start_cursor: str,
        end_cursor: str | None = None,
        count: int = 1000,
    ) -> Iterator[PullResult]:
        """Pulls from `start_cursor` until `end_cursor` (exclusive), or until the shard's end
        as it was when the iteration reached it. Yields only non-empty results."""
        cursor = start_cursor
        while True:
            result = self.pull_logs(project, logstore, shard_id, cursor, count, end_cursor)
            if result.count:
                yield result
            if result.next_cursor == end_cursor or result.count == 0:
                return
            cursor = result.next_cursor
