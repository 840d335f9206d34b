"""The controller: places writable shards on nodes and hands shards over, fenced.

One node at a time is the controller (``membership.ControllerRole``). It keeps no state of
its own: each round it reads the live nodes and every logstore's placement record from etcd
and the shards from the metadata catalog, runs ``coordination.placement.place``, and writes
what changed. Every write carries the controller's fence, so a controller that was paused or
cut off past its lease cannot undo what its successor decided.

A placement record, one per logstore, at ``/loghub/placement/{project}/{logstore}``:

    {"owners": {"0": "node-a", "1": "node-b", ...},      shard id -> the node with its log
     "handover": {"1": "node-c"}}                        shard id -> the node to take over

With one replica a shard's log lives on one node's disk and never moves; a shard "moves" by
succession, the way a split works: the old shard turns read-only at its end, and a new
shard with the same hash range (its child) is created on the new node. How that starts:

- the owner is alive (a node joined, or the owner drains): the controller writes a
  ``handover`` entry; the owner seals its log (no write lands there after), commits the
  succession in the catalog with the log's end, and records the child's owner. The order
  per hash key holds, as with a split: every write acknowledged by the parent comes before
  every write to the child.
- the owner's lease expired: the owner stopped taking writes before etcd dropped its lease
  (a node fences itself a TTL after its last acknowledged refresh, on its own clock), so the
  controller commits the succession itself, with the parent's end unknown. The parent's data
  is unavailable until its node returns; that node then seals the log and records the end
  (``node.NodeAgent``). Consumers read the child at once; ordered groups wait for the parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from loghub.cluster.etcd_store import EtcdStore, Fence, end_if_cancelled
from loghub.cluster.membership import DRAIN_PREFIX, NODES_PREFIX, ControllerRole, read_nodes
from loghub.cluster.replicas import ReplicaRecord, read_replica_records_at, replica_key
from loghub.coordination.placement import NodeSlot, ShardRef, place, place_replicas
from loghub.coordination.replica import clean_election
from loghub.errors import ControlPlaneError, FencedError, LogHubError
from loghub.metadata.models import Shard

__all__ = [
    "PLACEMENT_PREFIX",
    "Catalog",
    "Controller",
    "PlacementRecord",
    "placement_key",
    "read_placements",
    "read_placements_at",
]

log = logging.getLogger("loghub.cluster")

PLACEMENT_PREFIX = "/loghub/placement/"
LOGSTORES_PREFIX = "/loghub/meta/logstores/"  # the etcd metadata store's logstore records


def placement_key(project: str, logstore: str) -> str:
    return f"{PLACEMENT_PREFIX}{project}/{logstore}"


@dataclass(frozen=True)
class PlacementRecord:
    project: str
    logstore: str
    owners: Mapping[int, str] = field(default_factory=dict)
    handover: Mapping[int, str] = field(default_factory=dict)
    mod_revision: int = 0  # 0: not written yet

    def encode(self) -> bytes:
        return json.dumps(
            {
                "owners": {str(k): v for k, v in sorted(self.owners.items())},
                "handover": {str(k): v for k, v in sorted(self.handover.items())},
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(
        cls, project: str, logstore: str, value: bytes, mod_revision: int
    ) -> PlacementRecord:
        body = json.loads(value)
        return cls(
            project,
            logstore,
            {int(k): str(v) for k, v in body.get("owners", {}).items()},
            {int(k): str(v) for k, v in body.get("handover", {}).items()},
            mod_revision,
        )


async def read_placements(store: EtcdStore) -> dict[tuple[str, str], PlacementRecord]:
    return (await read_placements_at(store))[0]


async def read_placements_at(
    store: EtcdStore,
) -> tuple[dict[tuple[str, str], PlacementRecord], int]:
    """Every placement record, and the store's revision they were read at (a watch from the
    next revision misses no change made after the read)."""
    entries, revision = await store.read_prefix(PLACEMENT_PREFIX)
    records = {}
    for entry in entries:
        project, _, logstore = entry.key.removeprefix(PLACEMENT_PREFIX).partition("/")
        records[(project, logstore)] = PlacementRecord.decode(
            project, logstore, entry.value, entry.mod_revision
        )
    return records, revision


class Catalog(Protocol):
    """What the controller needs of the metadata store (blocking calls; run in a thread)."""

    def all_logstores(self) -> list[tuple[str, str]]: ...

    def list_shards(self, project: str, logstore: str) -> list[Shard]: ...

    def succeed_shard(
        self, project: str, logstore: str, shard_id: int, end_seq: int | None
    ) -> Shard:
        """Turns a read-write shard read-only at ``end_seq`` (None: not known yet) and
        creates its child with the same hash range; returns the child."""
        ...

    def record_end(self, project: str, logstore: str, shard_id: int, end_seq: int) -> None:
        """Sets the end of a read-only shard whose end was not known."""
        ...


class Controller:
    """Runs placement rounds while this node holds the controller role."""

    def __init__(
        self,
        store: EtcdStore,
        role: ControllerRole,
        catalog: Catalog,
        round_interval_s: float = 1.0,
        replication_factor: int = 1,
    ) -> None:
        self.store = store
        self.role = role
        self.catalog = catalog
        self.round_interval_s = round_interval_s
        self.replication_factor = replication_factor
        self._wake = asyncio.Event()
        self.rounds = 0

    def wake(self) -> None:
        """Runs a round now (a node joined or left, a logstore was created or resharded)."""
        self._wake.set()

    async def run(self) -> None:
        """Campaigns, then runs rounds until the role is lost (FencedError ends it)."""
        fence = await self.role.campaign()
        watcher = asyncio.create_task(self._watch_nodes())
        try:
            while self.role.held:
                try:
                    await self.run_round(fence)
                except FencedError:
                    log.warning("controller: fenced; another node took over")
                    return
                except (ControlPlaneError, LogHubError) as exc:
                    log.warning("controller round failed: %s", exc)
                self.rounds += 1
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.round_interval_s)
        finally:
            watcher.cancel()

    async def _watch_nodes(self) -> None:
        """Wakes a round on a node's join, leave or drain, and on any change of a logstore
        (created, split, merged: new shards to place at once)."""
        await asyncio.gather(
            self._watch(NODES_PREFIX),
            self._watch(DRAIN_PREFIX),
            self._watch(LOGSTORES_PREFIX),
        )

    async def _watch(self, prefix: str) -> None:
        while True:
            try:
                async for _event in self.store.watch_prefix(prefix):
                    self.wake()
            except ControlPlaneError:
                end_if_cancelled()
            await asyncio.sleep(0.2)

    async def run_round(self, fence: Fence) -> None:
        nodes = await read_nodes(self.store)
        slots = [NodeSlot(n.node_id, n.rack, n.draining) for n in nodes.values()]
        if self.replication_factor > 1:
            await self._replicate(fence, slots)
            return
        records = await read_placements(self.store)
        logstores = await asyncio.to_thread(self.catalog.all_logstores)
        for project, logstore in logstores:
            shards = await asyncio.to_thread(self.catalog.list_shards, project, logstore)
            record = records.get((project, logstore), PlacementRecord(project, logstore))
            updated = await self._place_logstore(record, shards, nodes.keys(), slots)
            if updated != record:
                written = await self.store.compare_and_swap(
                    placement_key(project, logstore),
                    updated.encode(),
                    record.mod_revision,
                    fence=fence,
                )
                if not written:
                    self.wake()  # a node recorded a handover meanwhile: read again

    async def _place_logstore(
        self,
        record: PlacementRecord,
        shards: list[Shard],
        live: object,
        slots: list[NodeSlot],
    ) -> PlacementRecord:
        live_ids = set(live)  # type: ignore[call-overload]
        project, logstore = record.project, record.logstore
        owners = dict(record.owners)
        handover = dict(record.handover)
        writable = {s.shard_id for s in shards if s.status == "readwrite"}
        known = {s.shard_id for s in shards}
        # forget shards that no longer exist (the logstore was deleted and made again)
        owners = {k: v for k, v in owners.items() if k in known}
        handover = {k: v for k, v in handover.items() if k in writable}
        current: dict[ShardRef, str] = {
            (project, logstore, k): owners[k] for k in writable if k in owners
        }
        target = place([(project, logstore, k) for k in writable], slots, current)
        for (_p, _l, shard_id), new_owner in sorted(target.items()):
            old_owner = owners.get(shard_id)
            if old_owner is None:
                owners[shard_id] = new_owner
            elif old_owner == new_owner:
                handover.pop(shard_id, None)
            elif old_owner in live_ids:
                handover[shard_id] = new_owner  # the owner seals and hands over
            else:
                child = await asyncio.to_thread(
                    self.catalog.succeed_shard, project, logstore, shard_id, None
                )
                handover.pop(shard_id, None)
                owners[child.shard_id] = new_owner
                log.info(
                    "controller: %s/%s shard %d was on %s (gone); shard %d takes its range on %s",
                    project, logstore, shard_id, old_owner, child.shard_id, new_owner,
                )  # fmt: skip
        return PlacementRecord(project, logstore, owners, handover, record.mod_revision)

    # --- replicated shards (``--replication-factor`` above 1) ------------------------------

    async def _replicate(self, fence: Fence, slots: list[NodeSlot]) -> None:
        """Gives every writable shard without replicas its replica set (the preferred
        leader leads epoch 1, every replica in sync), and elects a new leader, from the ISR
        only, for every shard whose leader is gone. Planned moves (drains, the preferred
        leader's return) are made by the leaders themselves (``replication.ReplicaManager``),
        which can wait for their ISR to catch up first."""
        records, _revision = await read_replica_records_at(self.store)
        live = {slot.node_id for slot in slots}
        ready = [slot.node_id for slot in slots if not slot.draining]
        current = {key: record.replicas for key, record in records.items()}
        missing: list[ShardRef] = []
        for project, logstore in await asyncio.to_thread(self.catalog.all_logstores):
            shards = await asyncio.to_thread(self.catalog.list_shards, project, logstore)
            missing += [
                (project, logstore, s.shard_id)
                for s in shards
                if s.status == "readwrite" and (project, logstore, s.shard_id) not in records
            ]
        placed = place_replicas(missing, slots, current, self.replication_factor)
        for (project, logstore, shard_id), replicas in sorted(placed.items()):
            record = ReplicaRecord(project, logstore, shard_id, replicas, replicas[0], 1,
                                   replicas)  # fmt: skip
            key = replica_key(project, logstore, shard_id)
            if await self.store.compare_and_swap(key, record.encode(), 0, fence=fence):
                log.info("controller: %s/%s shard %d on %s", project, logstore, shard_id,
                         list(replicas))  # fmt: skip
        for record in records.values():
            if record.leader in live:
                continue
            # the live replicas, those not draining first, in the record's preference order
            order = [r for r in record.replicas if r in ready]
            order += [r for r in record.replicas if r in live and r not in ready]
            election = clean_election(record.leadership(), order)
            if election is None:
                log.warning(
                    "controller: %s/%s shard %d waits: no in-sync replica of %s is alive",
                    record.project, record.logstore, record.shard_id, list(record.isr),
                )  # fmt: skip
                continue
            if await record.swap(self.store, record.with_leadership(election), fence):
                log.info(
                    "controller: %s/%s shard %d: %s leads epoch %d (was %s)",
                    record.project, record.logstore, record.shard_id, election.leader,
                    election.leader_epoch, record.leader,
                )  # fmt: skip
