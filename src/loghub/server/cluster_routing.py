"""Any node answers any request: the REST front end's part in a cluster.

In cluster mode (``loghub serve --cluster ...``) each shard's log lives on one node, the one
its placement record names (``loghub.cluster.controller``), and consumer groups are
coordinated by one node, the controller. A request that reaches another node is forwarded to
that one as it came, headers and body unchanged (so its signature, made for the Host the
client used, verifies there), and its answer goes back unchanged. A forwarded request
carries ``x-loghub-forwarded``; a node never forwards such a request again, so a stale view
costs a 503 the client retries, not a loop.

Writes by hash (``shards/route``) go to the owner of the shard whose range holds the key;
load-balanced writes (``shards/lb``) stay on this node when it owns a writable shard of the
logstore, so they cost no hop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping

import httpx
from starlette.responses import Response

from loghub.cluster.etcd_store import EtcdStore
from loghub.cluster.membership import NodeInfo
from loghub.cluster.node import LocalLogs, NodeAgent
from loghub.errors import LogHubError, ServerBusy, error_class_for_code
from loghub.wire.signing import Credentials, sign_v1

__all__ = ["FORWARDED_HEADER", "ClusterRouting"]

log = logging.getLogger("loghub.server")

FORWARDED_HEADER = "x-loghub-forwarded"
# hop-by-hop headers (RFC 9110 7.6.1) and the ones the HTTP client sets itself
_NOT_FORWARDED = {
    "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
    "upgrade", "content-length",
}  # fmt: skip
_NOT_RETURNED = _NOT_FORWARDED | {"date", "server"}
# how long a request for a shard not placed yet waits for the controller to place it
placement_wait_s = 3.0


class ClusterRouting:
    """The node agent, and forwarding to the node that serves a request."""

    def __init__(
        self,
        url: str,
        info: NodeInfo,
        catalog: object,
        local: LocalLogs,
        ttl_s: int,
        keys: Mapping[str, str] | None = None,
        forward_timeout_s: float = 60.0,
    ) -> None:
        # the key the node signs its own calls to other nodes with (a merge's remote seal)
        self._credentials = Credentials(*next(iter(sorted(keys.items())))) if keys else None
        self._url = url
        self._info = info
        self._catalog = catalog
        self._local = local
        self._ttl_s = ttl_s
        self._forward_timeout_s = forward_timeout_s
        self.store: EtcdStore | None = None
        self.agent: NodeAgent | None = None
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.store = EtcdStore(self._url)
        await self.store.__aenter__()
        self.agent = NodeAgent(
            self.store,
            self._info,
            self._catalog,  # type: ignore[arg-type]
            self._local,
            ttl_s=self._ttl_s,
        )
        await self.agent.start()
        self._client = httpx.AsyncClient(
            timeout=self._forward_timeout_s,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            trust_env=False,
        )

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self.agent is not None:
            await self.agent.stop()
        if self.store is not None:
            await self.store.close()

    @property
    def node_id(self) -> str:
        return self._info.node_id

    def check_alive(self) -> None:
        """Refuses to act while this node's lease is not known to be alive."""
        assert self.agent is not None
        if not self.agent.alive:
            raise ServerBusy(
                f"node {self.node_id} lost contact with the cluster's control plane; "
                "try another node"
            )

    def shard_node(self, project: str, logstore: str, shard_id: int) -> NodeInfo | None:
        """The node to serve a shard: None for this one. ServerBusy when the shard's node
        is not alive (with one replica its data waits for that node)."""
        assert self.agent is not None
        owner = self.agent.owner_id(project, logstore, shard_id)
        if owner == self.node_id:
            return None
        if owner is None:
            raise ServerBusy(f"shard {shard_id} of {logstore} is not placed yet; try again")
        node = self.agent.nodes.get(owner)
        if node is None:
            raise ServerBusy(
                f"shard {shard_id} of {logstore} is on node {owner}, which is not reachable"
                " now; its logs are readable again when the node returns"
            )
        return node

    def shard_location(self, project: str, logstore: str, shard_id: int) -> dict[str, str]:
        """What ListShards adds to a shard in a cluster: the id of the node that holds its
        log (``node``) and, while that node is alive, its ``host:port`` (``nodeAddress``);
        nothing for a shard not placed yet. A hint for readers, never a promise: the
        shard may move after the answer, and its owner then refuses owner-only requests."""
        assert self.agent is not None
        owner = self.agent.owner_id(project, logstore, shard_id)
        if owner is None:
            return {}
        node = self.agent.nodes.get(owner)
        if node is None:
            return {"node": owner}
        return {"node": owner, "nodeAddress": node.advertise}

    async def placed(self, project: str, logstore: str, shard_id: int) -> None:
        """Waits, up to ``placement_wait_s``, until a shard has an owner: a logstore just
        created, or a split's children, are placed by the controller within milliseconds,
        and a client should not see the moment in between."""
        assert self.agent is not None
        deadline = time.monotonic() + placement_wait_s
        while (
            self.agent.owner_id(project, logstore, shard_id) is None and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.01)

    def local_writable(self, project: str, logstore: str, writable: list[int]) -> list[int]:
        """The shards among ``writable`` that this node owns."""
        assert self.agent is not None
        return [s for s in writable if self.agent.owner_id(project, logstore, s) == self.node_id]

    def coordinator(self) -> NodeInfo | None:
        """The node coordinating consumer groups (the controller): None for this one."""
        assert self.agent is not None
        if self.agent.is_controller:
            return None
        node = self.agent.controller_node()
        if node is None:
            raise ServerBusy("no controller is elected right now; try again")
        return node

    async def forward(
        self,
        node: NodeInfo,
        method: str,
        raw_path: str,
        query_string: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        request_id: str,
    ) -> Response:
        """Sends the request to ``node`` as it came and returns its answer as it came."""
        assert self._client is not None
        if any(name.lower() == FORWARDED_HEADER.encode() for name, _ in headers):
            raise ServerBusy(
                f"this request was forwarded to node {self.node_id}, which does not serve it"
                " any more (a shard or group moved); try again"
            )
        sent = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in headers
            if name.decode("latin-1").lower() not in _NOT_FORWARDED
        ]
        sent.append((FORWARDED_HEADER, self.node_id))
        url = f"http://{node.advertise}{raw_path}"
        if query_string:
            url += "?" + query_string.decode("latin-1")
        try:
            reply = await self._client.request(method, url, headers=sent, content=body)
        except httpx.HTTPError as exc:
            log.warning("forwarding %s %s to node %s failed: %r", method, raw_path,
                        node.node_id, exc)  # fmt: skip
            raise ServerBusy(
                f"node {node.node_id}, which serves this request, did not answer; try again"
            ) from exc
        returned = {
            name: value
            for name, value in reply.headers.items()
            if name.lower() not in _NOT_RETURNED
        }
        returned.setdefault("x-log-requestid", request_id)
        return Response(reply.content, status_code=reply.status_code, headers=returned)

    # --- shard logs on other nodes (``service.RemoteLogs``; called from storage threads) ---

    def is_local(self, project: str, logstore: str, shard_id: int) -> bool:
        assert self.agent is not None
        return self.agent.owner_id(project, logstore, shard_id) in (None, self.node_id)

    def seal(self, project: str, logstore: str, shard_id: int) -> int:
        return self._remote_action(project, logstore, shard_id, "seal")

    def unseal(self, project: str, logstore: str, shard_id: int) -> None:
        self._remote_action(project, logstore, shard_id, "unseal")

    def _remote_action(self, project: str, logstore: str, shard_id: int, action: str) -> int:
        node = self.shard_node(project, logstore, shard_id)
        assert node is not None, "a local shard is sealed here"
        path = f"/logstores/{logstore}/shards/{shard_id}"
        call = self._signed_post(node, project, path, [("action", action)], b"", {}, action)
        body = asyncio.run_coroutine_threadsafe(call, self._loop).result(self._forward_timeout_s)
        return int(str(body.get("endSeq", 0)))

    def put_log_group(
        self, node: NodeInfo, project: str, logstore: str, shard_id: int, raw: bytes
    ) -> None:
        """A PutLogs of one serialized LogGroup to a shard ``node`` holds, signed by this
        node; returns once that node has made it durable. For the Kafka front end, whose
        writes to a read-only partition go to a writable shard that may be elsewhere.
        Blocking: call from a thread."""
        headers = {
            "content-type": "application/x-protobuf",
            "x-log-bodyrawsize": str(len(raw)),
        }
        path = f"/logstores/{logstore}/shards/{shard_id}"
        call = self._signed_post(node, project, path, [], raw, headers, "PutLogs")
        asyncio.run_coroutine_threadsafe(call, self._loop).result(self._forward_timeout_s)

    async def _signed_post(
        self,
        node: NodeInfo,
        project: str,
        path: str,
        query: list[tuple[str, str]],
        body: bytes,
        extra_headers: dict[str, str],
        what: str,
    ) -> dict[str, object]:
        """A POST to another node, marked as forwarded (it is never forwarded again) and
        signed with this node's key; the answer's JSON body, or its error raised as the
        LogHub error it names."""
        assert self._client is not None
        headers = {
            "host": f"{project}.{node.advertise}",
            "x-log-apiversion": "0.6.0",
            "x-log-bodyrawsize": "0",
            **extra_headers,
            FORWARDED_HEADER: self.node_id,
        }
        if self._credentials is not None:
            sign_v1("POST", path, query, headers, body, self._credentials,
                    time.time())  # fmt: skip
        url = f"http://{node.advertise}{path}"
        if query:
            url += "?" + "&".join(f"{k}={v}" for k, v in query)
        try:
            reply = await self._client.post(url, headers=headers, content=body)
        except httpx.HTTPError as exc:
            raise ServerBusy(f"node {node.node_id} did not answer a {what}; try again") from exc
        answer = json.loads(reply.content or b"{}")
        if reply.status_code != 200:
            error = error_class_for_code(str(answer.get("errorCode", ""))) or LogHubError
            raise error(f"node {node.node_id}: {answer.get('errorMessage', reply.status_code)}")
        return answer if isinstance(answer, dict) else {}
