"""Any node answers any request: the REST front end's part in a cluster.

In cluster mode (``loghub serve --cluster ...``) each shard's log lives on one node, the one
its placement record names (``loghub.cluster.controller``), and each consumer group is
coordinated by one node, the holder of the group's coordinator key
(``loghub.cluster.group_coordinators``). A request that reaches another node is forwarded to
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
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from starlette.responses import Response

from loghub._httpx import httpx
from loghub.cluster.etcd_store import EtcdStore, Fence
from loghub.cluster.group_coordinators import GroupCoordinators, GroupKey
from loghub.cluster.keys import watch_keys
from loghub.cluster.membership import NodeInfo
from loghub.cluster.node import LocalLogs, NodeAgent
from loghub.cluster.replicas import ShardKey
from loghub.cluster.replication import (
    FetchAnswer,
    ReplicaManager,
    ReplicationSettings,
)
from loghub.coordination.placement import NodeSlot, group_coordinator
from loghub.coordination.replica import EpochEndOffset, FetchRequest
from loghub.errors import (
    ControlPlaneError,
    FencedError,
    LogHubError,
    ServerBusy,
    error_class_for_code,
)
from loghub.server.config import KeyGrant, KeyRing, parse_keys_document, split_keys
from loghub.server.service import NodeUnreachable, NotServedHere
from loghub.wire.producer_ids import PRODUCER_HEADER
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
# how often a forward that waits for its answer looks whether its node is still in the cluster
_FORWARD_NODE_CHECK_S = 0.25
# how often a node checks whether it was drained (and then hands its groups over)
_DRAIN_CHECK_S = 0.5
# the longest a group operation waits for etcd (the store's own retry budget is 6 s)
_GROUP_CALL_TIMEOUT_S = 10.0

_T = TypeVar("_T")
_PRODUCER = PRODUCER_HEADER.encode()


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
        key_grants: Mapping[str, KeyGrant] | None = None,
        replication: ReplicationSettings | None = None,
    ) -> None:
        # the node signs its own calls to other nodes (a merge's remote seal) with the first
        # of the keys in force; in a cluster they follow etcd (``loghub.cluster.keys``)
        self._keys = keys
        self._key_grants = key_grants
        self._keys_task: asyncio.Task[None] | None = None
        self._url = url
        self._info = info
        self._catalog = catalog
        self._local = local
        self._ttl_s = ttl_s
        self._forward_timeout_s = forward_timeout_s
        self._replication_settings = replication or ReplicationSettings()
        self.replication: ReplicaManager | None = None
        self.store: EtcdStore | None = None
        self.agent: NodeAgent | None = None
        self.coordinators: GroupCoordinators | None = None
        # told of a group this node stopped coordinating (its state in memory is stale)
        self.on_group_lost: Callable[[GroupKey], None] | None = None
        self._client: httpx.AsyncClient | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.store = EtcdStore(self._url)
        await self.store.__aenter__()
        self._client = httpx.AsyncClient(
            timeout=self._forward_timeout_s,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            trust_env=False,
        )
        if self._replication_settings.replicated:
            self.replication = ReplicaManager(
                self.node_id,
                self._replication_settings,
                self._local,  # type: ignore[arg-type]
                self,
                self.store,
                lambda: {} if self.agent is None else self.agent.nodes,
            )
        self.agent = NodeAgent(
            self.store,
            self._info,
            self._catalog,  # type: ignore[arg-type]
            self._local,
            ttl_s=self._ttl_s,
            replication=self.replication,
        )
        await self.agent.start()
        agent = self.agent
        self.coordinators = GroupCoordinators(
            self.store, lambda: agent.membership, on_lost=self._group_lost
        )
        await self.coordinators.start()
        self._drain_task = asyncio.create_task(self._hand_over_groups_when_drained())
        self._keys_task = asyncio.create_task(watch_keys(self.store, self._apply_keys))

    @property
    def _credentials(self) -> Credentials | None:
        keys = self._keys
        return Credentials(*min(keys.items())) if keys else None

    def _apply_keys(self, document: dict[str, Any]) -> None:
        """The cluster's keys changed in etcd: the node accepts the new ones from now on."""
        if not isinstance(self._keys, KeyRing) or not isinstance(self._key_grants, KeyRing):
            return
        entries = parse_keys_document(document, "the cluster's keys in etcd")
        if not entries:
            log.error("the cluster's keys in etcd are empty; the keys in force are kept")
            return
        keys, grants = split_keys(entries)
        if keys == dict(self._keys) and grants == dict(self._key_grants):
            return
        self._key_grants.replace(grants)
        self._keys.replace(keys)
        log.info("the cluster's access keys changed: %d keys in force", len(keys))

    async def stop(self) -> None:
        if self._keys_task is not None:
            self._keys_task.cancel()
        if self._drain_task is not None:
            self._drain_task.cancel()
        if self.coordinators is not None:
            await self.coordinators.stop()
        if self.agent is not None:
            await self.agent.stop()
        if self._client is not None:
            await self._client.aclose()
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
        agent = self.agent
        assert agent is not None
        await _until(lambda: agent.owner_id(project, logstore, shard_id) is not None,
                     placement_wait_s, 0.01)  # fmt: skip

    async def rerouted(
        self, project: str, logstore: str, shard_id: int, away_from: str, wait_s: float = 1.5
    ) -> bool:
        """Waits, up to ``wait_s``, for this node's view to stop naming ``away_from`` as the
        shard's node (a leader that handed the shard over and stopped, or died: the watch
        brings the change); whether it did."""
        agent = self.agent
        assert agent is not None
        return await _until(
            lambda: agent.owner_id(project, logstore, shard_id) != away_from, wait_s, 0.01
        )

    async def moved(self, project: str, logstore: str, shard_id: int) -> None:
        """Waits, up to ``placement_wait_s``, while the view says this node serves a shard
        it does not take writes for: a leader handing the shard over (it waits for its
        followers, then writes the successor's election, which the watch brings here)."""
        agent = self.agent
        assert agent is not None
        await _until(
            lambda: (
                agent.owner_id(project, logstore, shard_id) != self.node_id
                or self.holds(project, logstore, shard_id)
            ),
            placement_wait_s,
            0.005,
        )

    def local_writable(self, project: str, logstore: str, writable: list[int]) -> list[int]:
        """The shards among ``writable`` that this node owns."""
        assert self.agent is not None
        return [s for s in writable if self.agent.owner_id(project, logstore, s) == self.node_id]

    # --- consumer groups -----------------------------------------------------------------

    def coordinator(self, project: str, logstore: str, group: str) -> NodeInfo | None:
        """The node coordinating a consumer group (None: this one): the holder of the
        group's coordinator key while its node is alive, else the node that should take it
        (``placement.group_coordinator``). ServerBusy when this node has lost its lease or
        no node can coordinate."""
        assert self.agent is not None and self.coordinators is not None
        self.check_alive()
        key = (project, logstore, group)
        holder = self.coordinators.holders.get(key)
        me = self.agent.nodes.get(self.node_id)
        if holder == self.node_id and me is not None and me.draining:
            # a drained node serves the groups it still holds until it gives them up, and
            # takes none: a view that still names it after it gave one up is stale
            holder = holder if self.coordinators.holds(key) else None
        if holder is None or holder not in self.agent.nodes:
            slots = [NodeSlot(n.node_id, n.rack, n.draining) for n in self.agent.nodes.values()]
            holder = group_coordinator(f"{project}/{logstore}/{group}", slots)
        if holder is None:
            raise ServerBusy(
                f"no node can coordinate consumer group {group} right now (no live node that"
                " is not draining); try again"
            )
        if holder == self.node_id:
            return None
        node = self.agent.nodes.get(holder)
        if node is None:
            raise ServerBusy(f"node {holder}, which coordinates group {group}, is gone; try again")
        return node

    async def coordinate(self, project: str, logstore: str, group: str) -> NodeInfo | None:
        """Before serving a group request: the node to forward it to, or None once this
        node holds the group's coordinator key (taking it if nobody holds it)."""
        assert self.coordinators is not None
        node = self.coordinator(project, logstore, group)
        if node is not None:
            return node
        try:
            fence = await self.coordinators.take((project, logstore, group))
        except ControlPlaneError as exc:
            raise ServerBusy(f"the control plane did not answer ({exc}); try again") from exc
        if fence is not None:
            return None
        node = self.coordinator(project, logstore, group)  # another node took it first
        if node is None:
            raise ServerBusy(f"consumer group {group} is changing coordinator; try again")
        return node

    def _group_lost(self, group: GroupKey) -> None:
        if self.on_group_lost is not None:
            self.on_group_lost(group)

    async def _hand_over_groups_when_drained(self) -> None:
        """A drained node gives its groups up, so they move to the nodes that are not
        draining (each on its next request); a drain is a planned leave."""
        assert self.agent is not None and self.coordinators is not None
        while True:
            await asyncio.sleep(_DRAIN_CHECK_S)
            me = self.agent.nodes.get(self.node_id)
            if me is None or not me.draining:
                continue
            for group in self.coordinators.held():
                try:
                    await self.coordinators.release(group)
                except ControlPlaneError as exc:
                    log.warning("handing group %s over failed: %s", group, exc)

    # --- what the group service asks (from its threads; run on the node's loop) ------------

    def _on_loop(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(_GROUP_CALL_TIMEOUT_S)

    def load_assignment(self, group: GroupKey) -> Mapping[int, str]:
        assert self.coordinators is not None
        try:
            saved = self._on_loop(self.coordinators.load_assignment(group))
        except ControlPlaneError as exc:
            raise ServerBusy(f"the control plane did not answer ({exc}); try again") from exc
        return saved.owners

    def save_assignment(self, group: GroupKey, owners: Mapping[int, str]) -> None:
        """Saves a group's assignment; ServerBusy when it cannot be saved (the reply that
        depends on it must not go out), with the group forgotten here when fenced."""
        assert self.coordinators is not None
        try:
            self._on_loop(self.coordinators.save_assignment(group, owners))
        except FencedError as exc:
            self._group_lost(group)
            raise ServerBusy(
                f"node {self.node_id} no longer coordinates group {group[2]} ({exc}); try again"
            ) from exc
        except ControlPlaneError as exc:
            raise ServerBusy(f"the control plane did not answer ({exc}); try again") from exc

    def checkpoint_fence(self, group: GroupKey) -> Fence:
        assert self.coordinators is not None
        coordinators = self.coordinators

        async def fence() -> Fence | None:
            return coordinators.fence(group)

        held = self._on_loop(fence())
        if held is None:
            raise ServerBusy(f"node {self.node_id} no longer coordinates group {group[2]}; "
                             "try again")  # fmt: skip
        return held

    def delete_group(self, group: GroupKey) -> None:
        assert self.coordinators is not None
        try:
            self._on_loop(self.coordinators.delete_group(group))
        except ControlPlaneError as exc:
            log.warning("forgetting the assignment of deleted group %s failed: %s", group, exc)

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
            raise NotServedHere(
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
            reply = await self._while_node_lives(
                node, self._client.request(method, url, headers=sent, content=body)
            )
        except httpx.HTTPError as exc:
            log.warning("forwarding %s %s to node %s failed: %r", method, raw_path,
                        node.node_id, exc)  # fmt: skip
            idempotent = any(name.lower() == _PRODUCER for name, _ in headers)
            if isinstance(exc, httpx.ConnectError) or (
                idempotent
                and isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError)
            ):
                # nothing was sent, or the write names its id (a second copy would be
                # answered as stored): the caller may route the request again
                raise NodeUnreachable(
                    f"node {node.node_id}, which serves this request, refused the connection;"
                    " try again"
                ) from exc
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

    async def _while_node_lives(
        self, node: NodeInfo, call: Coroutine[Any, Any, httpx.Response]
    ) -> httpx.Response:
        """The answer of a call to ``node``, or ServerBusy once the node has left the
        cluster's view (its lease ended: killed, paused or cut off for a TTL). A connection
        to a paused node is accepted by its kernel and never answered, so without this a
        forwarded request would wait for the forward timeout (a minute), and its client
        with it, although the cluster moved on after the TTL."""
        assert self.agent is not None
        agent = self.agent
        task = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=_FORWARD_NODE_CHECK_S)
                if done:
                    return task.result()
                if node.node_id not in agent.nodes:
                    raise ServerBusy(
                        f"node {node.node_id}, which serves this request, left the cluster "
                        "while it waited for the answer; try again"
                    )
        finally:
            task.cancel()

    # --- shard logs on other nodes (``service.RemoteLogs``; called from storage threads) ---

    def holds(self, project: str, logstore: str, shard_id: int) -> bool:
        """Whether this node holds the shard's log by the placements it has seen (leads
        it, when replicated): the only shards it appends to
        (``LogHubService.holds_shard``)."""
        assert self.agent is not None
        if self.replication is not None:
            return self.replication.leads((project, logstore, shard_id))
        return self.agent.owner_id(project, logstore, shard_id) == self.node_id

    # --- replication: the fetch of a follower (``replication.ReplicaTransport``) ----------

    async def fetch(
        self, node: NodeInfo, key: ShardKey, request: FetchRequest, wait_ms: int, bytes_max: int
    ) -> FetchAnswer:
        """A follower's fetch sent to the leader on ``node``: a signed GET of the shard
        with ``type=replica``; the records come as the body, the rest as headers.

        A fetch not answered within its wait plus the replica lag bound is given up and
        sent again on a new connection: by then the follower has left the ISR anyway, and a
        connection whose packets a partition dropped would otherwise wait for TCP's
        retransmission backoff, seconds after the network healed, while writes to the
        shard are refused for want of in-sync replicas."""
        project, logstore, shard_id = key
        path = f"/logstores/{logstore}/shards/{shard_id}"
        query = [
            ("type", "replica"),
            ("replica", request.replica_id),
            ("leaderEpoch", str(request.leader_epoch)),
            ("offset", str(request.fetch_offset)),
            ("lastEpoch", str(request.last_fetched_epoch)),
            ("fsyncedEnd", str(request.fsynced_end_offset)),
            ("waitMs", str(wait_ms)),
            ("bytesMax", str(bytes_max)),
        ]
        reply = await self._signed_call(
            "GET",
            node,
            project,
            path,
            query,
            b"",
            {},
            "fetch",
            timeout_s=self._fetch_timeout_s(wait_ms),
        )
        found = reply.headers
        diverging = None
        if "x-loghub-diverging-epoch" in found:
            diverging = EpochEndOffset(
                int(found["x-loghub-diverging-epoch"]), int(found["x-loghub-diverging-end"])
            )
        return FetchAnswer(
            int(found["x-loghub-leader-epoch"]),
            int(found["x-loghub-high-watermark"]),
            diverging,
            reply.content,
        )

    def _fetch_timeout_s(self, wait_ms: int) -> float:
        assert self.replication is not None
        return (wait_ms + self.replication.settings.replica_lag_ms) / 1000

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
        """A POST to another node (``_signed_call``); the answer's JSON body."""
        reply = await self._signed_call("POST", node, project, path, query, body,
                                        extra_headers, what)  # fmt: skip
        answer = json.loads(reply.content or b"{}")
        return answer if isinstance(answer, dict) else {}

    async def _signed_call(
        self,
        method: str,
        node: NodeInfo,
        project: str,
        path: str,
        query: list[tuple[str, str]],
        body: bytes,
        extra_headers: dict[str, str],
        what: str,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        """This node's own call to another node (a merge's remote seal, a Kafka write's
        PutLogs, a follower's fetch), marked as forwarded (it is never forwarded again) and
        signed with this node's key; its answer, or its error raised as the LogHub error it
        names (ServerBusy when the node did not answer)."""
        assert self._client is not None
        headers = {
            "host": f"{project}.{node.advertise}",
            "x-log-apiversion": "0.6.0",
            "x-log-bodyrawsize": "0",
            **extra_headers,
            FORWARDED_HEADER: self.node_id,
        }
        if self._credentials is not None:
            sign_v1(method, path, query, headers, body, self._credentials, time.time())
        url = f"http://{node.advertise}{path}"
        if query:
            url += "?" + "&".join(f"{k}={v}" for k, v in query)
        timeout = self._client.timeout if timeout_s is None else httpx.Timeout(timeout_s)
        try:
            reply = await self._client.request(
                method, url, headers=headers, content=body, timeout=timeout
            )
        except httpx.HTTPError as exc:
            raise ServerBusy(f"node {node.node_id} did not answer a {what}; try again") from exc
        if reply.status_code != 200:
            answer = json.loads(reply.content or b"{}")
            error = error_class_for_code(str(answer.get("errorCode", ""))) or LogHubError
            raise error(f"node {node.node_id}: {answer.get('errorMessage', reply.status_code)}")
        return reply


async def _until(done: Callable[[], bool], wait_s: float, poll_s: float) -> bool:
    """Polls ``done`` (a look at this node's view, which its watches update) every
    ``poll_s`` for up to ``wait_s``; whether it came true."""
    deadline = time.monotonic() + wait_s
    while not done():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_s)
    return True
