"""A node's membership in the cluster, and the controller role, both held under etcd leases.

Membership: a node writes ``/loghub/nodes/{node_id}`` (its addresses and rack) under a lease of
``ttl_s`` seconds and refreshes it every ``ttl_s / 3``. If the node dies, or is paused or cut
off for longer than the TTL, etcd deletes the key and the controller sees the node leave. A
node that cannot refresh knows it too: ``NodeMembership.alive`` turns False once a TTL has
passed, on the node's own monotonic clock, since the last refresh etcd acknowledged; the node
then stops acting on what it owned (it fences itself), because the cluster may already have
given that to another. This costs nothing in safety, which rests on fenced writes, and keeps
a paused node's reads from going stale for longer than a TTL.

The controller: nodes campaign by creating ``/loghub/controller`` under their lease if it
does not exist. The winner's key has a create revision that no later holder can have (etcd's
revisions only grow), so it is the controller's epoch and its fence: every write the
controller makes carries ``Fence(key, create_revision)`` and etcd refuses it once the key has
been deleted and taken again, whatever the old controller believes.

Kafka broker ids: Kafka clients name brokers by an int32, so a node with a Kafka listener has
one derived from its id, the same on every start and on every node that computes it
(``kafka_broker_id``). Two live nodes with Kafka listeners may not share one: the second to
start refuses to (a hash collision between two node ids is rare, but would send clients to
the wrong node).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from loghub.cluster.etcd_store import EtcdStore, Fence, Lease
from loghub.errors import CoordinationError

__all__ = [
    "CONTROLLER_KEY",
    "DRAIN_PREFIX",
    "NODES_PREFIX",
    "ControllerRole",
    "NodeInfo",
    "NodeMembership",
    "kafka_broker_id",
    "read_nodes",
]

log = logging.getLogger("loghub.cluster")

NODES_PREFIX = "/loghub/nodes/"
# `loghub node drain N` writes DRAIN_PREFIX + N (no lease: a drain outlives restarts until
# `loghub node undrain N` deletes it); the controller moves no shard to a draining node and
# hands over every writable shard it has
DRAIN_PREFIX = "/loghub/drain/"
CONTROLLER_KEY = "/loghub/controller"


_BROKER_ID_MAX = 2**31 - 1
# the longest a starting node waits for its predecessor's lease to end (the lease's TTL is
# the predecessor's --node-ttl-s, which a restart may have changed)
join_wait_s_max = 60


def kafka_broker_id(node_id: str) -> int:
    """The node's Kafka broker id: the number itself for a node id that is a decimal number
    up to 2^31 - 1 (``--node-id 3`` is broker 3, as Kafka operators number brokers), else
    the CRC-32 of the id's UTF-8 bytes with the top bit cleared (broker ids are int32 and
    clients treat negative ones as "none")."""
    if node_id.isdigit() and node_id.isascii() and int(node_id) <= _BROKER_ID_MAX:
        return int(node_id)
    return zlib.crc32(node_id.encode()) & _BROKER_ID_MAX


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    advertise: str  # host:port of its REST listener
    rack: str = ""
    draining: bool = False
    kafka: str = ""  # host:port of its Kafka listener; "" without one

    @property
    def broker_id(self) -> int:
        return kafka_broker_id(self.node_id)

    def encode(self) -> bytes:
        body: dict[str, object] = {
            "advertise": self.advertise,
            "rack": self.rack,
            "draining": self.draining,
        }
        if self.kafka:
            body["kafka"] = self.kafka
        return json.dumps(body).encode()

    @classmethod
    def decode(cls, node_id: str, value: bytes) -> NodeInfo:
        """Records written before a field existed decode with its default."""
        body = json.loads(value)
        return cls(node_id, str(body["advertise"]), str(body.get("rack", "")),
                   bool(body.get("draining", False)), str(body.get("kafka", "")))  # fmt: skip


async def read_nodes(store: EtcdStore) -> dict[str, NodeInfo]:
    """The registered nodes (the ones whose lease is alive), by id, with their drain marks."""
    return (await read_nodes_at(store))[0]


async def read_nodes_at(store: EtcdStore) -> tuple[dict[str, NodeInfo], int]:
    """``read_nodes``, and a store revision no newer than either of its two reads (a watch
    of either prefix from the next revision misses no change made after them)."""
    drains, drains_revision = await store.read_prefix(DRAIN_PREFIX)
    draining = {e.key.removeprefix(DRAIN_PREFIX) for e in drains}
    registered, nodes_revision = await store.read_prefix(NODES_PREFIX)
    nodes = {}
    for entry in registered:
        node_id = entry.key.removeprefix(NODES_PREFIX)
        info = NodeInfo.decode(node_id, entry.value)
        if node_id in draining and not info.draining:
            info = replace(info, draining=True)
        nodes[node_id] = info
    return nodes, min(drains_revision, nodes_revision)


class NodeMembership:
    """Registers ``info`` under a lease and keeps it alive until ``stop``."""

    def __init__(
        self,
        store: EtcdStore,
        info: NodeInfo,
        ttl_s: int = 3,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s < 1:
            raise ValueError("ttl_s must be at least 1")
        self.store = store
        self.info = info
        self.ttl_s = ttl_s
        self._monotonic = monotonic
        self.lease: Lease | None = None
        self._refreshed_at = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self.lost = asyncio.Event()  # set once the lease is known or presumed gone

    @property
    def key(self) -> str:
        return NODES_PREFIX + self.info.node_id

    @property
    def alive(self) -> bool:
        """True while the last acknowledged refresh is less than a TTL old."""
        return not self.lost.is_set() and self._monotonic() - self._refreshed_at < self.ttl_s

    async def start(self) -> None:
        """Takes the node's key. CoordinationError when a live node already has this id, or
        its Kafka broker id."""
        # before registering, so that a node refused never shows up to the controller (which
        # would move shards to it); and again after, for two nodes starting at once
        await self._check_broker_id()
        await self._wait_for_predecessor()
        started = self._monotonic()
        self.lease = await self.store.grant_lease(self.ttl_s)
        entry = await self.store.create(self.key, self.info.encode(), self.lease)
        if entry is None:
            await self.store.revoke_lease(self.lease)
            raise CoordinationError(
                f"node id {self.info.node_id} is in use by a live node; pick another "
                f"--node-id or wait {self.ttl_s} s for the old one's lease to end"
            )
        self._refreshed_at = started
        self._task = asyncio.create_task(self._keep_alive(), name=f"loghub-lease {self.key}")
        try:
            await self._check_broker_id()
        except BaseException:
            await self.stop()
            raise

    async def _wait_for_predecessor(self) -> None:
        """A node started again soon after it died (a supervisor's restart) finds its id
        still registered under its old lease, which etcd ends only a TTL after the last
        refresh: it waits for that end, as long as the lease had left when first looked at
        (never longer than ``join_wait_s_max``), rather than exit. A live node with the same
        id keeps refreshing its lease, so the key is still there after the wait, and the
        start is refused then."""
        deadline: float | None = None
        while (holder := await self.store.get(self.key)) is not None:
            if deadline is None:
                left_s = await self.store.lease_ttl_left_s(holder.lease) if holder.lease else 0
                # etcd answers whole seconds, rounded down, and ends expired leases on a
                # check of its own every half second or so: a second more for each
                wait_s = min(max(left_s, 0) + 1.0, join_wait_s_max) + 1.0
                deadline = self._monotonic() + wait_s
                log.warning(
                    "node %s: its id is still registered (a lease with %d s left); waiting "
                    "for it to end", self.info.node_id, left_s,
                )  # fmt: skip
            if self._monotonic() >= deadline:
                return  # the create below refuses the start
            await asyncio.sleep(0.2)

    async def _check_broker_id(self) -> None:
        """Refuses a Kafka broker id that another live node with a Kafka listener has. Read
        after registering, of two nodes starting at once at least the later one sees the
        other."""
        if not self.info.kafka:
            return
        for other in (await read_nodes(self.store)).values():
            if (
                other.node_id != self.info.node_id
                and other.kafka
                and other.broker_id == self.info.broker_id
            ):
                raise CoordinationError(
                    f"node ids {self.info.node_id} and {other.node_id} (live) give the same "
                    f"Kafka broker id {self.info.broker_id}; pick another --node-id"
                )

    async def update(self, info: NodeInfo) -> None:
        """Rewrites the node's record (e.g. draining) under the same lease."""
        assert self.lease is not None and info.node_id == self.info.node_id
        await self.store.put(self.key, info.encode(), self.lease)
        self.info = info

    async def _keep_alive(self) -> None:
        assert self.lease is not None
        interval_s = self.ttl_s / 3
        while not self.lost.is_set():
            await asyncio.sleep(interval_s)
            sent = self._monotonic()
            try:
                ttl = await self.store.refresh_lease(self.lease)
            except Exception as exc:  # whatever the client raises, the loop goes on
                log.warning("node %s: lease refresh failed: %r", self.info.node_id, exc)
                if not self.alive:
                    self.lost.set()
                    return
                continue
            if ttl <= 0:
                log.error("node %s: its lease expired; leaving the cluster", self.info.node_id)
                self.lost.set()
                return
            # the lease runs from when etcd got the refresh, no earlier than when it was sent
            self._refreshed_at = sent
            if not self.alive:
                self.lost.set()

    async def stop(self) -> None:
        """Leaves at once: revoking the lease deletes the node's keys (a planned leave)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.lease is not None:
            await self.store.revoke_lease(self.lease)
        self.lost.set()


class ControllerRole:
    """Campaigns for the controller key under a node's lease; ``fence`` once won."""

    def __init__(self, membership: NodeMembership, poll_s: float = 0.2) -> None:
        self.membership = membership
        self.poll_s = poll_s
        self.fence: Fence | None = None

    @property
    def held(self) -> bool:
        return self.fence is not None and self.membership.alive

    async def campaign(self) -> Fence:
        """Returns once this node holds the controller key (waits while another does)."""
        store = self.membership.store
        while True:
            if self.membership.lost.is_set():
                raise CoordinationError("this node left the cluster; it cannot be controller")
            entry = await store.create(
                CONTROLLER_KEY, self.membership.info.node_id.encode(), self.membership.lease
            )
            if entry is not None:
                self.fence = Fence(CONTROLLER_KEY, entry.create_revision)
                log.info(
                    "node %s is the controller (epoch %d)",
                    self.membership.info.node_id,
                    entry.create_revision,
                )
                return self.fence
            await asyncio.sleep(self.poll_s)
