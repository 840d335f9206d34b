"""What shard replication needs from the control plane, named once: the ``ClusterStore``.

Replication (followers fetching from a shard's leader, in Kafka's in-sync-replica shape; see
``docs/cluster.md``) rests on facts about each shard that every node must agree on, so they
live in the control plane (etcd in a cluster), beside the catalogue of ``MetadataStore``:

- who leads the shard, and in which **leader epoch**: a new leader takes a higher epoch, its
  shard log stamps every record with it (``ShardLog.set_leader_epoch``), and a follower cuts
  its log where its epochs leave the leader's;
- the **in-sync replicas** (ISR): the replicas holding every committed record. The next
  leader is chosen among them only, and the leader commits a record once all of them hold it;
- a **high watermark checkpoint**: where the committed records ended when it was last
  written, for monitoring and as a restarted node's first answer. Never for a safety
  decision: the high watermark itself lives with the leader (``ShardLog.high_watermark_seq``).

Every change names the version of the record it was decided on and fails with
``FencedError`` when another change came first (compare-and-swap), so a deposed leader that
acts on what it read before cannot change the ISR or take the shard back. Versions count
changes of one shard's record, from 0 for a shard never changed.

``SingleNodeClusterStore`` is the implementation for one server: every shard is led by the
one node in epoch 0 with itself as the only in-sync replica until changed, and the records
are kept in memory (a single server has nothing to agree on with anyone, and its shard logs
keep their epochs on disk). The etcd implementation comes with replication.

Thread-safety: ``SingleNodeClusterStore`` is thread-safe (one lock).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Protocol

from loghub.errors import FencedError

__all__ = ["ClusterStore", "ShardLeadership", "SingleNodeClusterStore"]

_EPOCH_MAX = 2**32 - 1  # a record header's leader_epoch is a u32


@dataclass(frozen=True)
class ShardLeadership:
    """One shard's leader, leader epoch and in-sync replicas, at one version."""

    leader: str  # the node id of the leader
    leader_epoch: int
    isr: tuple[str, ...]  # in-sync replicas, the leader among them
    version: int  # changes made to this record; the next change must name it

    def __post_init__(self) -> None:
        assert 0 <= self.leader_epoch <= _EPOCH_MAX and self.version >= 0
        assert self.leader in self.isr and len(set(self.isr)) == len(self.isr), self


class ClusterStore(Protocol):
    """The control plane's records of shard replication (see the module docstring).
    A shard is named as the metadata names it: project, logstore, shard id."""

    def leadership(self, project: str, logstore: str, shard_id: int) -> ShardLeadership:
        """The shard's current record."""
        ...

    def elect_leader(
        self, project: str, logstore: str, shard_id: int, leader: str, version: int
    ) -> ShardLeadership:
        """Makes ``leader`` (a member of the ISR) the leader in the next epoch, if the record
        is still at ``version``; raises FencedError otherwise."""
        ...

    def change_isr(
        self, project: str, logstore: str, shard_id: int, isr: tuple[str, ...], version: int
    ) -> ShardLeadership:
        """Replaces the ISR (it must keep the leader), if the record is still at
        ``version``; raises FencedError otherwise."""
        ...

    def high_watermark_checkpoint(self, project: str, logstore: str, shard_id: int) -> int:
        """The high watermark last checkpointed for the shard (0 when never)."""
        ...

    def checkpoint_high_watermark(
        self, project: str, logstore: str, shard_id: int, high_watermark_seq: int
    ) -> None:
        """Records the shard's high watermark; an older one than recorded is ignored (the
        high watermark never goes back)."""
        ...


class SingleNodeClusterStore:
    """The ``ClusterStore`` of a single server: ``node_id`` leads every shard."""

    def __init__(self, node_id: str = "local") -> None:
        self.node_id = node_id
        self._lock = threading.Lock()
        self._records: dict[tuple[str, str, int], ShardLeadership] = {}
        self._high_watermarks: dict[tuple[str, str, int], int] = {}

    def leadership(self, project: str, logstore: str, shard_id: int) -> ShardLeadership:
        with self._lock:
            return self._record((project, logstore, shard_id))

    def elect_leader(
        self, project: str, logstore: str, shard_id: int, leader: str, version: int
    ) -> ShardLeadership:
        key = (project, logstore, shard_id)
        with self._lock:
            current = self._checked(key, version)
            if leader not in current.isr:
                raise FencedError(f"{leader} is not in the in-sync replicas {current.isr}")
            if current.leader_epoch == _EPOCH_MAX:
                raise FencedError(f"shard {shard_id} has used every leader epoch")
            changed = replace(
                current, leader=leader, leader_epoch=current.leader_epoch + 1, version=version + 1
            )
            self._records[key] = changed
            return changed

    def change_isr(
        self, project: str, logstore: str, shard_id: int, isr: tuple[str, ...], version: int
    ) -> ShardLeadership:
        key = (project, logstore, shard_id)
        with self._lock:
            current = self._checked(key, version)
            if current.leader not in isr:
                raise FencedError(f"the in-sync replicas {isr} must keep the leader")
            changed = replace(current, isr=tuple(isr), version=version + 1)
            self._records[key] = changed
            return changed

    def high_watermark_checkpoint(self, project: str, logstore: str, shard_id: int) -> int:
        with self._lock:
            return self._high_watermarks.get((project, logstore, shard_id), 0)

    def checkpoint_high_watermark(
        self, project: str, logstore: str, shard_id: int, high_watermark_seq: int
    ) -> None:
        assert high_watermark_seq >= 0
        key = (project, logstore, shard_id)
        with self._lock:
            self._high_watermarks[key] = max(self._high_watermarks.get(key, 0), high_watermark_seq)

    def _record(self, key: tuple[str, str, int]) -> ShardLeadership:
        """The shard's record (lock held): this node, epoch 0, alone, when never changed."""
        found = self._records.get(key)
        return found or ShardLeadership(self.node_id, 0, (self.node_id,), 0)

    def _checked(self, key: tuple[str, str, int], version: int) -> ShardLeadership:
        current = self._record(key)
        if current.version != version:
            raise FencedError(
                f"shard {key[2]} of {key[0]}/{key[1]} changed: version {current.version}, "
                f"not {version}"
            )
        return current
