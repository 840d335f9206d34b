"""Each replicated shard's record in etcd: its replicas, its leader, the leader epoch and the
in-sync replicas (ISR).

One key per shard, ``/loghub/replicas/{project}/{logstore}/{shard_id}``, JSON::

    {"replicas": ["n1", "n2", "n3"], "leader": "n1", "epoch": 4, "isr": ["n1", "n3"]}

and, while a reassignment moves the shard to other nodes, ``"target"``: the replica set it
moves to. Kafka's order: ``replicas`` is first the full set (the target's nodes first, then
the old ones), the new replicas catch up and join the ISR, and only then ``replicas``
becomes the target and the ISR drops the others (``replication.ReplicaManager`` makes that
last step, handing leadership to a target node first when the leader leaves).

Written by compare-and-swap only, on the key's mod revision, which plays the part of the
``ShardLeadership`` version in ``loghub.coordination.replica``: the controller writes a new
record (a shard placed) and elections (a new leader, a new epoch); the leader writes ISR
changes; a leader that hands over (a drain) writes the election of its successor. Every one
of those moves the mod revision, so a change decided on an older record (a deposed leader's
ISR change, a stale controller's election) fails.

One key per shard rather than one per logstore, as the placement record is, because the
leaders change their shards' ISR on their own: on a shared key, every ISR change of one
shard would fail the compare-and-swap of every other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from loghub.cluster.etcd_store import EtcdStore, Fence
from loghub.metadata.cluster_store import ShardLeadership

__all__ = [
    "REPLICAS_PREFIX",
    "ReplicaRecord",
    "completed",
    "read_replica_records_at",
    "reassign",
    "reassigned",
    "replica_key",
]

REPLICAS_PREFIX = "/loghub/replicas/"

ShardKey = tuple[str, str, int]


def replica_key(project: str, logstore: str, shard_id: int) -> str:
    return f"{REPLICAS_PREFIX}{project}/{logstore}/{shard_id}"


@dataclass(frozen=True)
class ReplicaRecord:
    """One shard's replicas (the preferred leader first), leader, epoch and ISR, as read at
    ``mod_revision`` (0: not written yet)."""

    project: str
    logstore: str
    shard_id: int
    replicas: tuple[str, ...]
    leader: str
    epoch: int
    isr: tuple[str, ...]
    mod_revision: int = 0
    target: tuple[str, ...] = ()  # the replica set a reassignment moves to (empty: none)

    @property
    def key(self) -> ShardKey:
        return (self.project, self.logstore, self.shard_id)

    def encode(self) -> bytes:
        body: dict[str, object] = {
            "replicas": list(self.replicas),
            "leader": self.leader,
            "epoch": self.epoch,
            "isr": list(self.isr),
        }
        if self.target:
            body["target"] = list(self.target)
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, key: str, value: bytes, mod_revision: int) -> ReplicaRecord:
        project, logstore, shard = key.removeprefix(REPLICAS_PREFIX).split("/")
        body = json.loads(value)
        return cls(
            project,
            logstore,
            int(shard),
            tuple(str(r) for r in body["replicas"]),
            str(body["leader"]),
            int(body["epoch"]),
            tuple(str(r) for r in body["isr"]),
            mod_revision,
            tuple(str(r) for r in body.get("target", ())),
        )

    def leadership(self) -> ShardLeadership:
        """The record as the replica rules take it: its version is the mod revision."""
        return ShardLeadership(self.leader, self.epoch, self.isr, self.mod_revision)

    def with_leadership(self, leadership: ShardLeadership) -> ReplicaRecord:
        """This record with the leader, epoch and ISR a rule decided (same mod revision:
        the write is conditioned on it)."""
        return ReplicaRecord(
            self.project,
            self.logstore,
            self.shard_id,
            self.replicas,
            leadership.leader,
            leadership.leader_epoch,
            leadership.isr,
            self.mod_revision,
            self.target,
        )

    async def swap(
        self, store: EtcdStore, changed: ReplicaRecord, fence: Fence | None = None
    ) -> bool:
        """Writes ``changed`` in place of this record if the key is still at this record's
        mod revision (and, with ``fence``, the controller still holds its role); False
        when it moved on (read it again)."""
        return await self.swap_written(store, changed, fence) is not None

    async def swap_written(
        self, store: EtcdStore, changed: ReplicaRecord, fence: Fence | None = None
    ) -> ReplicaRecord | None:
        """``swap`` that gives ``changed`` as written (at its new mod revision), or None."""
        key = replica_key(self.project, self.logstore, self.shard_id)
        revision = await store.swap_revision(key, changed.encode(), self.mod_revision, fence)
        return None if revision is None else replace(changed, mod_revision=revision)


async def read_replica_records_at(store: EtcdStore) -> tuple[dict[ShardKey, ReplicaRecord], int]:
    """Every replica record, and the revision they were read at (a watch from the next
    revision misses no change)."""
    entries, revision = await store.read_prefix(REPLICAS_PREFIX)
    records = {}
    for entry in entries:
        record = ReplicaRecord.decode(entry.key, entry.value, entry.mod_revision)
        records[record.key] = record
    return records, revision


def reassigned(record: ReplicaRecord, target: tuple[str, ...]) -> ReplicaRecord:
    """The record that starts moving the shard to ``target`` (the first of it becomes the
    preferred leader): the full set first, the ISR as it is."""
    assert target and len(set(target)) == len(target), target
    full = (*target, *(r for r in record.replicas if r not in target))
    return ReplicaRecord(record.project, record.logstore, record.shard_id, full, record.leader,
                         record.epoch, record.isr, record.mod_revision, target)  # fmt: skip


def completed(record: ReplicaRecord) -> ReplicaRecord | None:
    """The record that ends a reassignment once every target replica is in sync and the
    leader is one of them: the target set, the ISR without the others. None before."""
    if not record.target or not set(record.target) <= set(record.isr):
        return None
    if record.leader not in record.target:
        return None
    isr = tuple(r for r in record.isr if r in record.target)
    return ReplicaRecord(record.project, record.logstore, record.shard_id, record.target,
                         record.leader, record.epoch, isr, record.mod_revision)  # fmt: skip


async def reassign(store: EtcdStore, key: ShardKey, target: tuple[str, ...]) -> ReplicaRecord:
    """Starts moving a shard's replicas to ``target`` (``loghub cluster reassign``)."""
    while True:
        entry = await store.get(replica_key(*key))
        if entry is None:
            raise LookupError(f"shard {key[2]} of {key[0]}/{key[1]} has no replica record")
        record = ReplicaRecord.decode(entry.key, entry.value, entry.mod_revision)
        changed = reassigned(record, target)
        if await record.swap(store, changed):
            return changed
