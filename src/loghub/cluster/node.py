"""A node's part in the cluster: its lease, its view of who owns what, its hand-overs.

``NodeAgent`` runs inside ``loghub serve --cluster``. It

- keeps the node's membership lease (``membership.NodeMembership``) and campaigns for the
  controller role, running ``controller.Controller`` while it holds it;
- keeps a view of the live nodes and of every logstore's placement record, from a watch on
  etcd, so routing a request to a shard's owner costs a dictionary lookup;
- carries out the hand-overs the controller asks of it: seals its log of the shard, commits
  the succession in the catalog with the log's end, and records the child's new owner;
- seals, when it starts, the logs of its shards that the controller succeeded while the node
  was gone, and records their ends, so those shards' data is readable again and finished.

While the node's lease is not known to be alive (``alive`` False), the node must not accept
writes: the controller may already have given its shards' ranges to other nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from loghub.cluster.controller import (
    PLACEMENT_PREFIX,
    Catalog,
    Controller,
    PlacementRecord,
    placement_key,
    read_placements_at,
)
from loghub.cluster.etcd_store import EtcdStore, end_if_cancelled
from loghub.cluster.membership import (
    CONTROLLER_KEY,
    DRAIN_PREFIX,
    NODES_PREFIX,
    ControllerRole,
    NodeInfo,
    NodeMembership,
    read_nodes_at,
)
from loghub.cluster.replicas import REPLICAS_PREFIX, read_replica_records_at
from loghub.cluster.replication import ReplicaManager
from loghub.cluster.status import summarize
from loghub.errors import ControlPlaneError, LogHubError

__all__ = ["LocalLogs", "NodeAgent"]

log = logging.getLogger("loghub.cluster")

_STOP_WAIT_S = 3.0
# how often a node looks for data of deleted logstores on its disk
_DROP_INTERVAL_S = 2.0
# how often a node reads the nodes and placements again whatever its watches said: a net
# under the watches, which start at the revision of the read before them and so miss nothing
# etcd delivers, should a watch ever stall without breaking
_RESYNC_INTERVAL_S = 5.0


class LocalLogs(Protocol):
    """What the agent needs of the node's own storage (blocking; run in a thread)."""

    def seal_log(self, project: str, logstore: str, shard_id: int) -> int:
        """Seals the node's log of a shard for good; returns its end sequence."""
        ...

    def drop_deleted_logs(self) -> list[str]:
        """Removes the node's data of logstores deleted in the cluster; returns their keys."""
        ...


class NodeAgent:
    def __init__(
        self,
        store: EtcdStore,
        info: NodeInfo,
        catalog: Catalog,
        local: LocalLogs,
        ttl_s: int = 3,
        round_interval_s: float = 1.0,
        replication: ReplicaManager | None = None,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.local = local
        self.ttl_s = ttl_s
        self.round_interval_s = round_interval_s
        self.membership = NodeMembership(store, info, ttl_s=ttl_s)
        self.role = ControllerRole(self.membership)
        # replicated shards (``--replication-factor`` above 1): their records, leaders and
        # followers; None with one replica per shard (placement records and hand-overs)
        self.replication = replication
        self.replication_factor = replication.settings.replication_factor if replication else 1
        self.controller = self._new_controller()
        self._stopping = False
        self.nodes: dict[str, NodeInfo] = {}
        self.placements: dict[tuple[str, str], PlacementRecord] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._handing_over: set[tuple[str, str, int]] = set()
        self.on_change: Callable[[], None] | None = None

    def _new_controller(self) -> Controller:
        return Controller(self.store, self.role, self.catalog, self.round_interval_s,
                          self.replication_factor)  # fmt: skip

    @property
    def node_id(self) -> str:
        return self.membership.info.node_id

    @property
    def alive(self) -> bool:
        return self.membership.alive

    @property
    def is_controller(self) -> bool:
        return self.role.held

    async def start(self) -> None:
        await self.membership.start()
        nodes_revision = await self._reload_nodes()
        self.placements, placements_revision = await read_placements_at(self.store)
        replicas_task = []
        if self.replication is not None:
            await self.replication.start()
            replicas_revision = await self._reload_replicas()
            replicas_task = [
                asyncio.create_task(
                    self._watch(REPLICAS_PREFIX, self._reload_replicas, replicas_revision)
                )
            ]
        # each watch starts right after the read its view came from: a change in between
        # (the controller placing shards on a node that has just registered) is delivered
        self._tasks = [
            asyncio.create_task(self._watch(NODES_PREFIX, self._reload_nodes, nodes_revision)),
            # a drain mark changes where groups go (``placement.group_coordinator``)
            asyncio.create_task(self._watch(DRAIN_PREFIX, self._reload_nodes, nodes_revision)),
            asyncio.create_task(self._watch(CONTROLLER_KEY, self._reload_nodes, nodes_revision)),
            asyncio.create_task(
                self._watch(PLACEMENT_PREFIX, self._reload_placements, placements_revision)
            ),
            asyncio.create_task(self._resync()),
            asyncio.create_task(self._run_controller()),
            asyncio.create_task(self._stay_member()),
            asyncio.create_task(self._drop_deleted_logs()),
            *replicas_task,
        ]
        await self._act_on_placements()

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # a task stuck in the etcd client (a watch being torn down) must not hold the
            # node's shutdown: it is left behind after a bound
            await asyncio.wait(self._tasks, timeout=_STOP_WAIT_S)
        if self.replication is not None:
            await self.replication.stop()
        await asyncio.wait_for(self.membership.stop(), _STOP_WAIT_S)

    # --- the view -----------------------------------------------------------------------

    def owner(self, project: str, logstore: str, shard_id: int) -> NodeInfo | None:
        """The node holding a shard's log, if it is placed and its node is alive."""
        node_id = self.owner_id(project, logstore, shard_id)
        return self.nodes.get(node_id) if node_id is not None else None

    def owner_id(self, project: str, logstore: str, shard_id: int) -> str | None:
        """The node that serves a shard: its leader when it is replicated."""
        if self.replication is not None:
            return self.replication.leader_of((project, logstore, shard_id))
        record = self.placements.get((project, logstore))
        return record.owners.get(shard_id) if record else None

    def controller_node(self) -> NodeInfo | None:
        """The controller (the coordinator of consumer groups), from the last view."""
        for node in self.nodes.values():
            if node.node_id == self._controller_id:
                return node
        return None

    _controller_id: str | None = None
    _controller_epoch: int | None = None

    def status(self) -> dict[str, Any]:
        """``loghub cluster status`` as this node sees the cluster now (its last view of
        etcd's nodes, controller and placements), for its ``/metrics``."""
        drains = sorted(n.node_id for n in self.nodes.values() if n.draining)
        return summarize(
            self.nodes,
            self._controller_id,
            self._controller_epoch,
            self.placements,
            drains,
            self.replication.records if self.replication is not None else None,
        )

    async def _watch(
        self, prefix: str, reload: Callable[[], Awaitable[int]], revision: int
    ) -> None:
        """Reloads the view on every change under ``prefix`` after ``revision`` (the read
        the view came from). A broken watch (etcd's leader changed, the history it asked
        for was compacted) reads again and watches on from that read."""
        while not self._stopping:
            try:
                async for _event in self.store.watch_prefix(prefix, start_revision=revision + 1):
                    await reload()
            except ControlPlaneError as exc:
                end_if_cancelled()
                log.warning("watch of %s broke (%s); reading again", prefix, exc)
            await asyncio.sleep(0.2)
            with contextlib.suppress(ControlPlaneError):
                revision = await reload()

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(_RESYNC_INTERVAL_S)
            with contextlib.suppress(ControlPlaneError):
                await self._reload_nodes()
                await self._reload_placements()
                if self.replication is not None:
                    await self._reload_replicas()

    async def _reload_nodes(self) -> int:
        """Reads the live nodes and the controller; returns a store revision the view is at
        least as new as."""
        self.nodes, nodes_revision = await read_nodes_at(self.store)
        controllers, controller_revision = await self.store.read_prefix(CONTROLLER_KEY)
        current = next((e for e in controllers if e.key == CONTROLLER_KEY), None)
        self._controller_id = current.value.decode() if current else None
        self._controller_epoch = current.create_revision if current else None
        me = self.nodes.get(self.node_id)
        if self.replication is not None and me is not None:
            self.replication.draining = me.draining
        if self.on_change:
            self.on_change()
        return min(nodes_revision, controller_revision)

    async def _reload_placements(self) -> int:
        """Reads every placement record and acts on it; returns the revision read at."""
        self.placements, revision = await read_placements_at(self.store)
        if self.on_change:
            self.on_change()
        await self._act_on_placements()
        return revision

    async def _reload_replicas(self) -> int:
        """Reads every replica record and takes the roles they give this node."""
        assert self.replication is not None
        records, revision = await read_replica_records_at(self.store)
        await self.replication.reconcile(records, revision)
        if self.on_change:
            self.on_change()
        return revision

    async def _run_controller(self) -> None:
        while True:
            if not self.membership.lost.is_set():
                try:
                    await self.controller.run()
                except (ControlPlaneError, LogHubError) as exc:
                    log.warning("controller stopped: %s", exc)
            await asyncio.sleep(0.5)

    async def _stay_member(self) -> None:
        """A node whose lease ended while it ran (a pause, a cut to etcd) joins again with a
        new lease, as a node that returns: the cluster succeeded its writable shards
        meanwhile, and it seals those logs and records their ends."""
        while True:
            await self.membership.lost.wait()
            if self._stopping:
                return
            log.error("node %s: lost its lease; joining the cluster again", self.node_id)
            while True:
                membership = NodeMembership(self.store, self.membership.info, ttl_s=self.ttl_s)
                try:
                    await membership.start()
                    break
                except (ControlPlaneError, LogHubError) as exc:
                    log.warning("node %s: joining again failed: %s", self.node_id, exc)
                    await asyncio.sleep(self.ttl_s / 3)
            self.membership = membership
            self.role = ControllerRole(membership)
            self.controller = self._new_controller()
            await self._act_on_placements()

    async def _drop_deleted_logs(self) -> None:
        """A deleted logstore's data lies on every node that owned one of its shards; each
        removes its own, at start (a node that was down when the delete happened) and then
        every few rounds."""
        while True:
            try:
                await asyncio.to_thread(self.local.drop_deleted_logs)
            except (OSError, LogHubError) as exc:
                log.warning("removing the data of deleted logstores failed: %s", exc)
            await asyncio.sleep(_DROP_INTERVAL_S)

    # --- hand-overs ---------------------------------------------------------------------

    async def _act_on_placements(self) -> None:
        if not self.alive:
            return  # the cluster may have moved on without this node: it acts on nothing
        for (project, logstore), record in list(self.placements.items()):
            await self._record_ends(project, logstore, record)
            for shard_id, target in record.handover.items():
                if record.owners.get(shard_id) != self.node_id:
                    continue
                key = (project, logstore, shard_id)
                if key in self._handing_over:
                    continue
                self._handing_over.add(key)
                try:
                    await self._hand_over(project, logstore, shard_id, target)
                except (ControlPlaneError, LogHubError) as exc:
                    log.warning("hand-over of %s failed (%s); the next change retries", key, exc)
                finally:
                    self._handing_over.discard(key)

    async def _record_ends(self, project: str, logstore: str, record: PlacementRecord) -> None:
        """Seals this node's logs of shards the controller succeeded while the node was gone
        (read-only, end unknown) and records their ends, so their data reads again."""
        mine = {k for k, v in record.owners.items() if v == self.node_id}
        if not mine:
            return
        try:
            shards = await asyncio.to_thread(self.catalog.list_shards, project, logstore)
        except LogHubError:
            return  # deleted meanwhile
        for shard in shards:
            if shard.shard_id in mine and shard.status == "readonly" and shard.end_seq is None:
                end_seq = await asyncio.to_thread(
                    self.local.seal_log, project, logstore, shard.shard_id
                )
                await asyncio.to_thread(
                    self.catalog.record_end, project, logstore, shard.shard_id, end_seq
                )
                log.info("%s/%s shard %d: sealed at %d on return", project, logstore,
                         shard.shard_id, end_seq)  # fmt: skip

    async def _hand_over(self, project: str, logstore: str, shard_id: int, target: str) -> None:
        end_seq = await asyncio.to_thread(self.local.seal_log, project, logstore, shard_id)
        child = await asyncio.to_thread(
            self.catalog.succeed_shard, project, logstore, shard_id, end_seq
        )
        log.info(
            "%s/%s shard %d sealed at %d; shard %d takes its range on %s",
            project, logstore, shard_id, end_seq, child.shard_id, target,
        )  # fmt: skip
        key = placement_key(project, logstore)
        while True:
            entry = await self.store.get(key)
            if entry is None:
                return
            record = PlacementRecord.decode(project, logstore, entry.value, entry.mod_revision)
            owners = {**record.owners, child.shard_id: target}
            handover = {k: v for k, v in record.handover.items() if k != shard_id}
            updated = PlacementRecord(project, logstore, owners, handover, entry.mod_revision)
            if await self.store.compare_and_swap(key, updated.encode(), entry.mod_revision):
                return
