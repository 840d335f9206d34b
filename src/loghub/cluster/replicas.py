"""Each replicated shard's record in etcd: its replicas, its leader, the leader epoch and the
in-sync replicas (ISR).

One key per shard, ``/loghub/replicas/{project}/{logstore}/{shard_id}``, JSON::

    {"replicas": ["n1", "n2", "n3"], "leader": "n1", "epoch": 4, "isr": ["n1", "n3"]}

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
from dataclasses import dataclass

from loghub.cluster.etcd_store import EtcdStore, Fence
from loghub.metadata.cluster_store import ShardLeadership

__all__ = ["REPLICAS_PREFIX", "ReplicaRecord", "read_replica_records_at", "replica_key"]

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

    @property
    def key(self) -> ShardKey:
        return (self.project, self.logstore, self.shard_id)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "replicas": list(self.replicas),
                "leader": self.leader,
                "epoch": self.epoch,
                "isr": list(self.isr),
            },
            sort_keys=True,
        ).encode()

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
        )

    async def swap(
        self, store: EtcdStore, changed: ReplicaRecord, fence: Fence | None = None
    ) -> bool:
        """Writes ``changed`` in place of this record if the key is still at this record's
        mod revision (and, with ``fence``, the controller still holds its role); False
        when it moved on (read it again)."""
        key = replica_key(self.project, self.logstore, self.shard_id)
        return await store.compare_and_swap(key, changed.encode(), self.mod_revision, fence)


async def read_replica_records_at(store: EtcdStore) -> tuple[dict[ShardKey, ReplicaRecord], int]:
    """Every replica record, and the revision they were read at (a watch from the next
    revision misses no change)."""
    entries, revision = await store.read_prefix(REPLICAS_PREFIX)
    records = {}
    for entry in entries:
        record = ReplicaRecord.decode(entry.key, entry.value, entry.mod_revision)
        records[record.key] = record
    return records, revision
