"""Consumer-group coordinators: one node per group, chosen by a lease key, fenced in etcd.

Each consumer group is coordinated by one node, the holder of its coordinator key

    /loghub/coordinators/{project}/{logstore}/{group}    value: the holder's node id

created under the holder node's lease (so it ends with the node) by a create-if-absent
transaction. Its create revision is the coordinator's epoch and fence: no later holder can
have it. The coordinator keeps the group's heartbeats in memory and saves the group's
assignment, before any reply that depends on it, to

    /loghub/assignments/{project}/{logstore}/{group}
        {"owners": {"0": "consumer-a", ...}, "generation": 7, "coordinator": "n1", "epoch": 1234}

by a compare-and-swap on the record's revision (the generation it last wrote or loaded) that
also requires the coordinator key to still have the epoch's create revision. A coordinator
that was paused or cut off while another took the key fails with ``FencedError``, however
sure its clock is; so does one whose record was overwritten by another.

Who takes a group that has no coordinator: ``coordination.placement.group_coordinator``, a
rendezvous hash over the live, not draining nodes; a live holder keeps its groups (sticky).
A node that is drained releases its keys, so its groups move to the hashed nodes; a node
whose lease ends loses its keys with it.

Thread-safety: an instance belongs to one event loop; the node calls it from that loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from loghub.cluster.etcd_store import Compare, EtcdStore, Fence, Put
from loghub.cluster.membership import NodeMembership
from loghub.errors import ControlPlaneError, FencedError

__all__ = [
    "ASSIGNMENTS_PREFIX",
    "COORDINATORS_PREFIX",
    "GroupAssignment",
    "GroupCoordinators",
    "GroupKey",
    "assignment_key",
    "coordinator_key",
]

log = logging.getLogger("loghub.cluster")

COORDINATORS_PREFIX = "/loghub/coordinators/"
ASSIGNMENTS_PREFIX = "/loghub/assignments/"

GroupKey = tuple[str, str, str]  # (project, logstore, group)


def coordinator_key(group: GroupKey) -> str:
    return COORDINATORS_PREFIX + "/".join(group)


def assignment_key(group: GroupKey) -> str:
    return ASSIGNMENTS_PREFIX + "/".join(group)


def _group_of(key: str, prefix: str) -> GroupKey | None:
    parts = key.removeprefix(prefix).split("/")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


@dataclass(frozen=True)
class GroupAssignment:
    """A group's saved assignment: who holds each shard, and who saved it when."""

    owners: Mapping[int, str] = field(default_factory=dict)
    generation: int = 0  # how many times it was saved; 0: never
    coordinator: str = ""
    epoch: int = 0  # the create revision of the coordinator key it was saved under
    mod_revision: int = 0  # 0: not in etcd

    def encode(self) -> bytes:
        return json.dumps(
            {
                "owners": {str(k): v for k, v in sorted(self.owners.items())},
                "generation": self.generation,
                "coordinator": self.coordinator,
                "epoch": self.epoch,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, value: bytes, mod_revision: int) -> GroupAssignment:
        body = json.loads(value)
        return cls(
            {int(k): str(v) for k, v in body.get("owners", {}).items()},
            int(body.get("generation", 0)),
            str(body.get("coordinator", "")),
            int(body.get("epoch", 0)),
            mod_revision,
        )


class GroupCoordinators:
    """This node's view of who coordinates which group, and the groups it coordinates.

    ``membership`` returns the node's current membership (it changes when the node joins
    again after losing its lease); ``on_lost`` is told of every group this node stopped
    coordinating, so that its in-memory state is dropped and reloaded when it comes back."""

    def __init__(
        self,
        store: EtcdStore,
        membership: Callable[[], NodeMembership],
        on_lost: Callable[[GroupKey], None] | None = None,
    ) -> None:
        self.store = store
        self._membership = membership
        self.on_lost = on_lost
        self.holders: dict[GroupKey, str] = {}  # the view: group -> node id
        self._held: dict[GroupKey, tuple[Fence, int]] = {}  # group -> (fence, lease id)
        self._saved: dict[GroupKey, GroupAssignment] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def node_id(self) -> str:
        return self._membership().info.node_id

    async def start(self) -> None:
        revision = await self.reload()
        self._task = asyncio.create_task(self._watch(revision), name="loghub-group-coordinators")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=3.0)

    async def _watch(self, revision: int) -> None:
        """Reloads on every change after ``revision`` (that of the read the view came from,
        so a key taken in between is not missed)."""
        while not self._stopping:
            try:
                async for _event in self.store.watch_prefix(COORDINATORS_PREFIX, revision + 1):
                    await self.reload()
            except ControlPlaneError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError from None
                log.warning("watch of %s broke (%s); reading again", COORDINATORS_PREFIX, exc)
            await asyncio.sleep(0.2)
            with contextlib.suppress(ControlPlaneError):
                revision = await self.reload()

    async def reload(self) -> int:
        """Reads every coordinator key; a group this node held whose key is gone or was
        taken again (its lease ended) is lost. Returns the store revision read at."""
        holders: dict[GroupKey, str] = {}
        revisions: dict[GroupKey, int] = {}
        entries, read_revision = await self.store.read_prefix(COORDINATORS_PREFIX)
        for entry in entries:
            group = _group_of(entry.key, COORDINATORS_PREFIX)
            if group is not None:
                holders[group] = entry.value.decode()
                revisions[group] = entry.create_revision
        self.holders = holders
        for group, (fence, _lease) in list(self._held.items()):
            if revisions.get(group) != fence.create_revision:
                self._lose(group)
        return read_revision

    # --- holding groups -----------------------------------------------------------------

    def fence(self, group: GroupKey) -> Fence | None:
        """This node's fence for ``group`` while it coordinates it (its key is held under
        the node's current, live lease); None otherwise."""
        held = self._held.get(group)
        membership = self._membership()
        if held is None:
            return None
        fence, lease_id = held
        if membership.lease is None or membership.lease.lease_id != lease_id:
            self._lose(group)  # the lease it was held under is gone, and the key with it
            return None
        return fence if membership.alive else None

    def held(self) -> list[GroupKey]:
        return sorted(self._held)

    def holds(self, group: GroupKey) -> bool:
        return group in self._held

    async def take(self, group: GroupKey) -> Fence | None:
        """Creates the group's coordinator key under this node's lease if nobody holds it;
        the fence when this node holds it now, None when another node does."""
        fence = self.fence(group)
        if fence is not None:
            return fence
        membership = self._membership()
        if membership.lease is None or not membership.alive:
            return None
        entry = await self.store.create(
            coordinator_key(group), self.node_id.encode(), membership.lease
        )
        if entry is None:
            holder = await self.store.get(coordinator_key(group))
            if holder is not None:
                self.holders[group] = holder.value.decode()
            else:
                self.holders.pop(group, None)
            return None
        fence = Fence(entry.key, entry.create_revision)
        self._held[group] = (fence, membership.lease.lease_id)
        self.holders[group] = self.node_id
        self._saved.pop(group, None)
        log.info("node %s coordinates group %s (epoch %d)", self.node_id, "/".join(group),
                 entry.create_revision)  # fmt: skip
        return fence

    async def release(self, group: GroupKey) -> None:
        """Gives a group up (a drain): deletes its key while this node still holds it."""
        held = self._held.get(group)
        if held is None:
            return
        self._lose(group)
        if self.holders.get(group) == self.node_id:
            del self.holders[group]  # not named as the holder again before the watch says
        with contextlib.suppress(FencedError):
            await self.store.delete(coordinator_key(group), fence=held[0])

    def _lose(self, group: GroupKey) -> None:
        if self._held.pop(group, None) is None:
            return
        self._saved.pop(group, None)
        log.info("node %s no longer coordinates group %s", self.node_id, "/".join(group))
        if self.on_lost is not None:
            self.on_lost(group)

    # --- assignments --------------------------------------------------------------------

    async def load_assignment(self, group: GroupKey) -> GroupAssignment:
        """The group's saved assignment (an empty one when none was saved), read when this
        node starts coordinating the group; the next save builds on it."""
        entry = await self.store.get(assignment_key(group))
        saved = (
            GroupAssignment.decode(entry.value, entry.mod_revision)
            if entry is not None
            else GroupAssignment()
        )
        self._saved[group] = saved
        return saved

    async def save_assignment(self, group: GroupKey, owners: Mapping[int, str]) -> int:
        """Saves the group's assignment as the next generation; returns that generation.

        FencedError when this node does not coordinate the group any more, or when the
        record changed since this node loaded or saved it (another coordinator wrote it)."""
        fence = self.fence(group)
        if fence is None:
            raise FencedError(f"node {self.node_id} does not coordinate group {group}")
        before = self._saved.get(group)
        if before is None:
            before = await self.load_assignment(group)
        after = GroupAssignment(
            dict(owners), before.generation + 1, self.node_id, fence.create_revision
        )
        key = assignment_key(group)
        written = await self.store.transact(
            [
                Compare(key, "mod", "==", before.mod_revision),
                Compare(fence.key, "create", "==", fence.create_revision),
            ],
            [Put(key, after.encode())],
        )
        if written is None:
            self._saved.pop(group, None)
            holder = await self.store.get(fence.key)
            if holder is None or holder.create_revision != fence.create_revision:
                self._lose(group)
                raise FencedError(f"{fence.key} is held by another since {fence} was taken")
            raise FencedError(
                f"the assignment of group {group} changed under its coordinator"
                f" {self.node_id} (generation {before.generation})"
            )
        self._saved[group] = GroupAssignment(
            after.owners, after.generation, after.coordinator, after.epoch, written
        )
        return after.generation

    async def delete_group(self, group: GroupKey) -> None:
        """Forgets a deleted group: its assignment and its coordinator key."""
        fence = self.fence(group)
        with contextlib.suppress(FencedError):
            await self.store.delete(assignment_key(group), fence=fence)
        await self.release(group)
