"""The data plane of replication on one node: leading shards, following shards, acks.

For every shard whose replica record (``loghub.cluster.replicas``) names this node, the
``ReplicaManager`` runs one of two roles, by the rules of ``loghub.coordination.replica``
(the same functions the seeded simulation drives, applied to the real shard log):

- **Leader** (the record names this node leader in epoch E): stamps appends with E, answers
  followers' fetches with byte ranges of its log (``handle_fetch``, a long poll at the log
  end), raises the high watermark to the least fsynced end over the ISR, acknowledges a
  write once the high watermark passed it (``committed``), and shrinks or grows the ISR by
  compare-and-swap on the record. Writes are refused while the ISR is smaller than
  ``min_insync_replicas``.
- **Follower**: fetches from the leader at its log end, appends and fsyncs what comes
  (``ShardLog.append_raw``), fetches again; its next fetch offset tells the leader what it
  holds durably. On a diverging-epoch answer it cuts its log where the lineages part
  (``lineage_cut``), never at its high watermark.

A planned move of leadership (a drain, or the preferred replica back in the ISR) is made by
the leader itself, with no write refused: it stops taking writes, waits until the high
watermark reaches its log end (every ISR member holds everything), then writes the election
of the successor by compare-and-swap. Writes that arrived meanwhile go to the successor.

What a record change does here (``reconcile``, on every change the node's watch delivers):
a new epoch for this node makes it leader (after its follower task has stopped, so no fetch
appends under the leader); any other change of leader or epoch makes it a follower of the
new leader and fails the acks still waiting on it (``ServerBusy``: the write may be kept or
not, as after any timeout; the idempotent client's retry is de-duplicated). A record that
no longer names this node once a reassignment ended deletes its copy of the shard, after a
grace period (``_remove_copy``): the target replicas hold everything it held.

Thread-safety: everything runs on the node's event loop; shard log I/O goes to threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from loghub.cluster.etcd_store import EtcdStore
from loghub.cluster.membership import NodeInfo
from loghub.cluster.replicas import ReplicaRecord, ShardKey, completed
from loghub.coordination.replica import (
    EpochCache,
    EpochEndOffset,
    FetchRequest,
    LeaderState,
    check_fetch_epoch,
    diverging_epoch,
    follower_progress,
    isr_change,
    isr_high_watermark,
    lineage_cut,
)
from loghub.errors import (
    ControlPlaneError,
    FencedError,
    LogHubError,
    NotEnoughReplicasError,
    ParameterInvalid,
    ServerBusy,
)
from loghub.metadata.cluster_store import ShardLeadership
from loghub.storage import ShardLog

__all__ = [
    "FetchAnswer",
    "LogSnapshot",
    "ReplicaLogs",
    "ReplicaManager",
    "ReplicaTransport",
    "ReplicationSettings",
    "snapshot",
]

log = logging.getLogger("loghub.cluster")

# how long a node keeps its copy of a shard a reassignment moved away before deleting it:
# requests that reached it while it still led or followed the shard finish first
REMOVED_COPY_GRACE_S = 5.0
# how long a deposed leadership's writes may take to finish appending before this node
# follows the shard (or deletes its copy) regardless
DEPOSED_WRITES_WAIT_S = 60.0


@dataclass(frozen=True)
class ReplicationSettings:
    """``loghub serve --cluster --replication-factor N``: the same on every node (checked
    where the flags are read, ``server.config.ClusterConfig``)."""

    replication_factor: int = 1
    min_insync_replicas: int = 2
    # a follower not caught up for this long leaves the ISR (writes wait for it until then)
    replica_lag_ms: int = 3000
    # how long a follower's fetch waits at the leader's log end for new records
    fetch_wait_ms: int = 500
    fetch_bytes_max: int = 8 * 1024 * 1024
    # the longest a write waits for the ISR to hold it before it is answered ServerBusy
    commit_timeout_s: float = 30.0

    @property
    def replicated(self) -> bool:
        return self.replication_factor > 1


@dataclass(frozen=True)
class LogSnapshot:
    """A shard log's position as the replica rules read it (``replica.LogPosition``).
    LogHub acknowledges appends after their fdatasync, so the fsynced end is the end."""

    log_end_offset: int
    fsynced_end_offset: int
    high_watermark: int
    epochs: EpochCache


def snapshot(shard_log: ShardLog, leader_epoch: int | None = None, start: int = 0) -> LogSnapshot:
    """``shard_log``'s position; with ``leader_epoch``, the epoch a leader took over at
    ``start`` is in its epochs even before its first record (as ``become_leader`` has it)."""
    end = shard_log.end_seq
    epochs = EpochCache(tuple(shard_log.leader_epochs()))
    if leader_epoch is not None and epochs.latest_epoch != leader_epoch:
        epochs = epochs.assign(leader_epoch, start)
    return LogSnapshot(end, end, shard_log.high_watermark_seq, epochs)


@dataclass(frozen=True)
class FetchAnswer:
    """The leader's answer to a fetch: ``diverging`` (cut and ask again) or the framed
    records from the fetch offset (``ShardLog.read_raw``), with its high watermark."""

    leader_epoch: int
    high_watermark: int
    diverging: EpochEndOffset | None
    records: bytes


class ReplicaTransport(Protocol):
    async def fetch(
        self, node: NodeInfo, key: ShardKey, request: FetchRequest, wait_ms: int, bytes_max: int
    ) -> FetchAnswer:
        """The fetch sent to the leader on ``node``; errors as LogHub errors."""
        ...


class ReplicaLogs(Protocol):
    def replica_log(self, project: str, logstore: str, shard_id: int) -> ShardLog:
        """The node's log of a shard, opened (and recovered) but never sealed on open: a
        follower of a read-only shard still copies its tail. Blocking."""
        ...

    def drop_replica_log(self, project: str, logstore: str, shard_id: int) -> bool:
        """Deletes the node's copy of a shard it no longer replicates; False when it had
        none. Blocking."""
        ...


class _Leading:
    """A leader's state for one shard in one epoch."""

    def __init__(self, record: ReplicaRecord, shard_log: ShardLog, node_id: str) -> None:
        self.record = record
        self.shard_log = shard_log
        start = shard_log.end_seq
        self.state = LeaderState(node_id, record.leadership(), start, _now_ms())
        self.waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.appended = asyncio.Event()
        self.handing_over = False
        self.deposed = False
        # writes between their leadership check and their answer: a hand-over waits for
        # them, or one appended after its last look at the log end would be deposed
        self.inflight = 0

    def snapshot(self) -> LogSnapshot:
        return snapshot(self.shard_log, self.state.leader_epoch, self.state.epoch_start_offset)

    def advance(self) -> None:
        """Raises the high watermark to what the ISR holds and resolves the acks it passed."""
        high_watermark = isr_high_watermark(self.state, self.shard_log.end_seq)
        if high_watermark is not None:
            self.shard_log.advance_high_watermark(high_watermark)
        committed = self.shard_log.high_watermark_seq
        if not self.waiters:
            return
        waiting = []
        for end, future in self.waiters:
            if end <= committed:
                if not future.done():
                    future.set_result(None)
            else:
                waiting.append((end, future))
        self.waiters = waiting

    def fail_waiters(self, why: str) -> None:
        for _end, future in self.waiters:
            if not future.done():
                future.set_exception(ServerBusy(why))
        self.waiters = []


class ReplicaManager:
    """Leads and follows this node's replicas of replicated shards (module docstring)."""

    def __init__(
        self,
        node_id: str,
        settings: ReplicationSettings,
        logs: ReplicaLogs,
        transport: ReplicaTransport,
        store: EtcdStore | None,
        nodes: Callable[[], Mapping[str, NodeInfo]],
    ) -> None:
        self.node_id = node_id
        self.settings = settings
        self._logs = logs
        self._transport = transport
        self._store = store
        self._nodes = nodes
        self.records: dict[ShardKey, ReplicaRecord] = {}
        self._leading: dict[ShardKey, _Leading] = {}
        self._following: dict[ShardKey, tuple[ReplicaRecord, asyncio.Task[None]]] = {}
        self._isr_task: asyncio.Task[None] | None = None
        self._reconciling = asyncio.Lock()
        self._closed = False
        # the node is stopping (SIGTERM): it hands its shards over and follows none, since
        # a follower that rejoined an ISR and then stopped would hold writes for the lag
        self._leaving = False
        # shards whose leadership this node is handing over (drain, preferred leader)
        self._moving: set[ShardKey] = set()
        # deposed leaderships whose writes may still be appending: a follower of the shard
        # starts fetching only once they are done, so no leader append lands among the
        # records it copies (Kafka takes the partition's leader-ISR lock for the same)
        self._deposed: dict[ShardKey, _Leading] = {}
        self.draining = False
        # copies of shards moved off this node, deleted after REMOVED_COPY_GRACE_S; the
        # first reconcile looks at every record, later ones at the shards it held a role on
        self._removals: dict[ShardKey, asyncio.Task[None]] = {}
        self._looked_for_removed = False

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._isr_task = asyncio.create_task(self._maintain())

    async def hand_over_all(self, wait_s: float = 3.0) -> None:
        """Hands each shard this node leads to an in-sync replica (Kafka's controlled
        shutdown), so that a node stopped on purpose costs its clients no failover; called
        while the node still serves requests. A shard that cannot move within ``wait_s``
        is left to the election that follows the node's lease."""
        self._leaving = True
        for _record, task in self._following.values():
            task.cancel()
        moves = []
        for key, leading in list(self._leading.items()):
            successor = self._successor(leading, leaving=True)
            if successor is not None and self._store is not None:
                moves.append(self.hand_over(key, successor, wait_s, leaving=True))
        if moves:
            done: list[object] = []
            with contextlib.suppress(TimeoutError):
                done = await asyncio.wait_for(
                    asyncio.gather(*moves, return_exceptions=True), wait_s + 1
                )
            if any(moved is True for moved in done):
                # the other nodes learn of the new leaders a watch event later: until then
                # this one still answers them (it passes their writes on), rather than have
                # them meet a closed port
                await asyncio.sleep(0.3)

    async def stop(self) -> None:
        self._closed = True
        tasks = [task for _record, task in self._following.values()]
        tasks += self._removals.values()
        if self._isr_task is not None:
            tasks.append(self._isr_task)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=3.0)
        for leading in self._leading.values():
            leading.fail_waiters("the node is shutting down; the write may or may not be kept")

    # --- the view ------------------------------------------------------------------------

    def leader_of(self, key: ShardKey) -> str | None:
        record = self.records.get(key)
        return None if record is None else record.leader

    def leads(self, key: ShardKey) -> bool:
        """Whether this node takes writes for the shard now: it leads the record's epoch
        and is not handing the shard over."""
        leading = self._leading.get(key)
        return leading is not None and not leading.handing_over and not leading.deposed

    def under_replicated(self) -> list[ShardKey]:
        """Shards this node leads whose ISR is smaller than their replica set."""
        return [
            key
            for key, leading in self._leading.items()
            if len(leading.state.record.isr) < len(leading.record.replicas)
        ]

    async def reconcile(
        self, records: Mapping[ShardKey, ReplicaRecord], revision: int | None = None
    ) -> None:
        """Takes the roles ``records`` (read at store revision ``revision``) give this node
        (see the module docstring). A read can be older than a change the watch already
        brought (a resync that started before it): a record older than the one known is
        ignored, and a record missing from the read drops the known one only if the read is
        newer than it, so a stale read never deposes a leader."""
        async with self._reconciling:
            merged: dict[ShardKey, ReplicaRecord] = {}
            for key in set(records) | set(self.records):
                new, known = records.get(key), self.records.get(key)
                if new is not None and (known is None or new.mod_revision >= known.mod_revision):
                    merged[key] = new
                elif known is not None and (
                    new is not None or revision is None or revision < known.mod_revision
                ):
                    merged[key] = known
            records = merged
            self.records = dict(records)
            for key in list(self._leading):
                record = records.get(key)
                leading = self._leading[key]
                if (
                    record is None
                    or record.leader != self.node_id
                    or record.epoch != leading.state.leader_epoch
                ):
                    self._depose(key, record)
                elif record.mod_revision > leading.state.record.version:
                    # our own ISR change (or another's made while we lead: none may be)
                    leading.record = record
                    leading.state = replace(leading.state, record=record.leadership())
                    leading.advance()
            held = set(self._following) | set(self._deposed)
            if not self._looked_for_removed:
                held |= set(records)
                self._looked_for_removed = True
            for key, (followed, task) in list(self._following.items()):
                record = records.get(key)
                if (
                    record is None
                    or self.node_id not in record.replicas
                    or record.leader == self.node_id
                    or (record.leader, record.epoch) != (followed.leader, followed.epoch)
                ):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                    del self._following[key]
            for key in held:
                record = records.get(key)
                if (
                    record is not None
                    and self.node_id not in record.replicas
                    and not record.target
                    and key not in self._removals
                    and not self._closed
                ):
                    self._removals[key] = asyncio.create_task(self._remove_copy(key))
            for key, record in records.items():
                if self.node_id not in record.replicas or self._closed or self._leaving:
                    continue
                if record.leader == self.node_id:
                    if key not in self._leading:
                        await self._lead(record)
                elif key not in self._following:
                    self._following[key] = (record, asyncio.create_task(self._follow(key)))

    async def _remove_copy(self, key: ShardKey) -> None:
        """Deletes this node's copy of a shard a reassignment moved away, as Kafka's
        StopReplica with delete does: once the move has ended (its target replicas were in
        sync and the record names them alone), after a grace period for the requests that
        reached this node while it still led or followed the shard, and only if the record
        still leaves this node out. A record that is missing (etcd answered nothing) never
        deletes anything."""
        try:
            await asyncio.sleep(REMOVED_COPY_GRACE_S)
            async with self._reconciling:
                record = self.records.get(key)
                if (
                    self._closed
                    or record is None
                    or self.node_id in record.replicas
                    or record.target
                    or key in self._following
                    or key in self._leading
                ):
                    return
                if not await self._deposed_writes_done(key):
                    return  # a write still appending: the next start looks again
                if await asyncio.to_thread(self._logs.drop_replica_log, *key):
                    log.info(
                        "%s/%s shard %d: deleted this node's copy (the shard's replicas are "
                        "now %s)", key[0], key[1], key[2], list(record.replicas),
                    )  # fmt: skip
        except (LogHubError, OSError) as exc:
            log.warning("%s: could not delete the copy of a shard moved away: %s", key, exc)
        finally:
            self._removals.pop(key, None)

    async def _deposed_writes_done(self, key: ShardKey) -> bool:
        """Waits (up to DEPOSED_WRITES_WAIT_S) until the writes of this node's deposed
        leadership of the shard, if any, are done appending; whether they are."""
        deposed = self._deposed.pop(key, None)
        if deposed is None:
            return True
        deadline = time.monotonic() + DEPOSED_WRITES_WAIT_S
        while deposed.inflight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return deposed.inflight == 0

    def _depose(self, key: ShardKey, record: ReplicaRecord | None) -> None:
        leading = self._leading.pop(key)
        leading.deposed = True
        self._deposed[key] = leading
        leading.appended.set()
        leading.fail_waiters(
            f"shard {key[2]} of {key[1]}: the leader changed while the write waited for its "
            "replicas; it may or may not be kept; retry"
        )
        log.info(
            "%s/%s shard %d: %s no longer leads epoch %d (now %s)",
            key[0], key[1], key[2], self.node_id, leading.state.leader_epoch,
            None if record is None else f"{record.leader} in epoch {record.epoch}",
        )  # fmt: skip

    async def _lead(self, record: ReplicaRecord) -> None:
        try:
            shard_log = await asyncio.to_thread(self._logs.replica_log, *record.key)
        except LogHubError as exc:
            log.warning("%s: cannot open the log to lead it: %s", record.key, exc)
            return
        if shard_log.leader_epoch > record.epoch:
            log.error("%s: the log has epoch %d, above the record's %d", record.key,
                      shard_log.leader_epoch, record.epoch)  # fmt: skip
            return
        if any(epoch == record.epoch for epoch, _start in shard_log.leader_epochs()):
            # this node led the epoch before it restarted: a replica that restarts comes
            # back as a follower (KIP-966), so leading again takes a new election, of itself
            # with the same ISR (clean: it is in the ISR), in the next epoch
            if self._store is not None:
                election = ShardLeadership(
                    record.leader, record.epoch + 1, record.isr, record.mod_revision + 1
                )
                await record.swap(self._store, record.with_leadership(election))
            return
        shard_log.set_leader_epoch(record.epoch)
        self._leading[record.key] = _Leading(record, shard_log, self.node_id)
        log.info(
            "%s/%s shard %d: %s leads epoch %d from %d, ISR %s",
            record.project, record.logstore, record.shard_id, self.node_id, record.epoch,
            shard_log.end_seq, list(record.isr),
        )  # fmt: skip

    # --- the leader's side ---------------------------------------------------------------

    def check_writable(self, key: ShardKey) -> object | None:
        """Before an append: ``NotEnoughReplicasError`` when the ISR is too small for the
        write ever to be acknowledged (leadership is checked by ``leads``). Returns a token
        for ``write_done``, which the caller must call once the write is answered."""
        leading = self._leading.get(key)
        if leading is None:
            return None
        isr = leading.state.record.isr
        if len(isr) < self.settings.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"shard {key[2]} of {key[1]} has {len(isr)} in-sync replicas {list(isr)}, "
                f"fewer than min_insync_replicas={self.settings.min_insync_replicas}; try again"
            )
        leading.inflight += 1
        return leading

    def write_done(self, token: object | None) -> None:
        if isinstance(token, _Leading):
            token.inflight -= 1

    async def committed(self, key: ShardKey, end_seq: int) -> None:
        """Returns once the records before ``end_seq`` are held by every ISR member (the
        high watermark passed them) and the ISR is large enough; the write's ack."""
        leading = self._leading.get(key)
        if leading is None:
            raise ServerBusy(
                f"shard {key[2]} of {key[1]}: the leader changed while the write was appended;"
                " it may or may not be kept; retry"
            )
        leading.appended.set()
        leading.advance()
        if leading.shard_log.high_watermark_seq < end_seq:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            leading.waiters.append((end_seq, future))
            try:
                await asyncio.wait_for(future, self.settings.commit_timeout_s)
            except TimeoutError:
                raise ServerBusy(
                    f"shard {key[2]} of {key[1]}: the in-sync replicas did not confirm the write "
                    f"within {self.settings.commit_timeout_s:g} s; it may or may not be kept"
                ) from None
        if len(leading.state.record.isr) < self.settings.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"shard {key[2]} of {key[1]}: the in-sync replicas shrank below "
                f"min_insync_replicas={self.settings.min_insync_replicas} after the append; "
                "it may or may not be kept; retry"
            )

    def committed_blocking(self, key: ShardKey, end_seq: int) -> None:
        """``committed`` for a caller on a thread (the Kafka front end's writes)."""
        call = asyncio.run_coroutine_threadsafe(self.committed(key, end_seq), self._loop)
        call.result(self.settings.commit_timeout_s + 5)

    async def handle_fetch(
        self, key: ShardKey, request: FetchRequest, wait_ms: int, bytes_max: int
    ) -> FetchAnswer:
        """A follower's fetch (see the module docstring); ``ServerBusy`` when this node does
        not lead the epoch the follower names."""
        leading = self._leading.get(key)
        if leading is None or leading.deposed:
            raise ServerBusy(f"node {self.node_id} does not lead shard {key[2]} of {key[1]}")
        try:
            check_fetch_epoch(leading.state, request)
        except FencedError as exc:
            raise ServerBusy(str(exc)) from None
        if request.replica_id not in leading.record.replicas or request.replica_id == self.node_id:
            # a client's mistake, not a state that passes: 400, not a retryable 503
            raise ParameterInvalid(
                f"{request.replica_id!r} is not a follower of shard {key[2]} of {key[1]}"
            )
        view = leading.snapshot()
        diverging = diverging_epoch(view, request)
        if diverging is not None:
            return FetchAnswer(leading.state.leader_epoch, view.high_watermark, diverging, b"")
        progress = follower_progress(leading.state, view, request, _now_ms())
        leading.state = replace(
            leading.state, followers={**leading.state.followers, request.replica_id: progress}
        )
        leading.advance()
        if request.fetch_offset >= leading.shard_log.end_seq and wait_ms > 0:
            leading.appended.clear()
            if request.fetch_offset >= leading.shard_log.end_seq:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(leading.appended.wait(), wait_ms / 1000)
        records = b""
        if request.fetch_offset < leading.shard_log.end_seq and not leading.deposed:
            records = await asyncio.to_thread(
                leading.shard_log.read_raw, request.fetch_offset, bytes_max
            )
        return FetchAnswer(
            leading.state.leader_epoch, leading.shard_log.high_watermark_seq, None, records
        )

    async def _maintain(self) -> None:
        """The leaders' ISR changes, and planned moves of leadership, every quarter of the
        lag bound."""
        interval = max(0.05, self.settings.replica_lag_ms / 4000)
        while not self._closed:
            await asyncio.sleep(interval)
            for key, leading in list(self._leading.items()):
                try:
                    await self._check_isr(key, leading)
                    await self._complete_reassignment(leading)
                    await self._move_if_damaged(key, leading)
                    await self._move_if_wanted(key, leading)
                except (ControlPlaneError, LogHubError) as exc:
                    log.warning("%s: ISR or leadership change failed: %s", key, exc)

    async def _check_isr(self, key: ShardKey, leading: _Leading) -> None:
        if leading.deposed or self._store is None:
            return
        view = leading.snapshot()
        wanted = isr_change(view, leading.state, _now_ms(), self.settings.replica_lag_ms)
        if wanted is None:
            return
        changed = leading.record.with_leadership(replace(leading.state.record, isr=wanted))
        fresh = await leading.record.swap_written(self._store, changed)
        if fresh is None:
            return  # the record moved on: the watch brings it (and maybe a new leader)
        if leading.deposed or fresh.mod_revision <= leading.state.record.version:
            return  # the watch was faster and applied it (or what came after it)
        # applied the moment the store answers, without a second read: a client that sees
        # the new ISR in the store then finds this leader already counting it
        leading.record = fresh
        leading.state = replace(leading.state, record=fresh.leadership())
        leading.advance()
        log.info("%s/%s shard %d: ISR now %s", key[0], key[1], key[2], list(wanted))

    async def _complete_reassignment(self, leading: _Leading) -> None:
        """Ends a reassignment whose target replicas are all in sync (the leader is one of
        them; if not, ``_successor`` hands the shard to one first)."""
        current = leading.record.with_leadership(leading.state.record)
        done = completed(current)
        if done is None or leading.deposed or self._store is None:
            return
        if await current.swap(self._store, done):
            log.info("%s/%s shard %d: reassigned to %s", current.project, current.logstore,
                     current.shard_id, list(done.replicas))  # fmt: skip

    def _successor(self, leading: _Leading, leaving: bool = False) -> str | None:
        """Whom to hand the shard over to: on a drain or when leaving, the first live ISR
        member that is not draining; else the preferred replica when it is in the ISR and
        this node is not it."""
        nodes = self._nodes()
        isr = leading.state.record.isr
        preferred = leading.record.replicas[0]
        target = leading.record.target
        if target and self.node_id not in target:
            # a reassignment takes this node out: once every target replica is in sync,
            # leadership goes to the first of them (who then ends the reassignment)
            if set(target) <= set(isr):
                return target[0]
            return None
        if self.draining or leaving:
            for member in (*leading.record.replicas,):
                node = nodes.get(member)
                if member != self.node_id and member in isr and node and not node.draining:
                    return member
            return None
        node = nodes.get(preferred)
        if preferred != self.node_id and preferred in isr and node and not node.draining:
            # only once it has fetched in this epoch and is caught up
            progress = leading.state.followers.get(preferred)
            if progress is not None and _now_ms() - progress.caught_up_ms <= 500:
                return preferred
        return None

    async def _move_if_damaged(self, key: ShardKey, leading: _Leading) -> None:
        """A leader whose copy lost records to a damaged disk hands the shard to an in-sync
        replica, then repairs its copy as a follower (``_follow``); alone in the ISR, it
        keeps the shard (the records are lost; reads skip them with DataCorrupted)."""
        if leading.deposed or _first_damage(leading.shard_log) is None:
            return
        successor = self._successor(leading, leaving=True)
        if successor is not None:
            log.warning("%s: this copy lost records to damage; handing the shard to %s",
                        key, successor)  # fmt: skip
            await self.hand_over(key, successor)

    async def _move_if_wanted(self, key: ShardKey, leading: _Leading) -> None:
        successor = self._successor(leading)
        if successor is None or leading.deposed or self._store is None:
            return
        reassigning = bool(leading.record.target) and self.node_id not in leading.record.target
        if not self.draining and not reassigning and _now_ms() - leading.state.since_ms < 5000:
            return  # a leader keeps the shard a while before giving it back
        await self.hand_over(key, successor)

    async def hand_over(
        self, key: ShardKey, successor: str, wait_s: float = 5.0, leaving: bool = False
    ) -> bool:
        """A planned move of leadership to ``successor`` (an ISR member), refusing no
        write: new writes wait, the ISR catches up with the log end, then the successor's
        election is written (the next epoch). False when it did not happen (the ISR did not
        catch up in ``wait_s``, or the record changed)."""
        leading = self._leading.get(key)
        if leading is None or key in self._moving or self._store is None:
            return False
        self._moving.add(key)
        leading.handing_over = True
        try:
            deadline = time.monotonic() + wait_s
            while (
                leading.inflight > 0
                or leading.shard_log.high_watermark_seq < leading.shard_log.end_seq
            ):
                if leading.deposed or time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.002)
            record = leading.record.with_leadership(leading.state.record)
            # a node that leaves (SIGTERM) leaves the ISR too: the new leader must not wait
            # ``replica_lag_ms`` for a replica that will not fetch
            others = [
                m for m in record.isr if m != successor and not (leaving and m == self.node_id)
            ]
            election = ShardLeadership(
                successor, record.epoch + 1, (successor, *others), record.mod_revision + 1
            )
            if not await record.swap(self._store, record.with_leadership(election)):
                return False
            # the record names the successor now: this node takes nothing more, even before
            # its watch brings the change
            leading.deposed = True
            log.info("%s/%s shard %d: leadership handed to %s (epoch %d)", key[0], key[1],
                     key[2], successor, election.leader_epoch)  # fmt: skip
            return True
        finally:
            leading.handing_over = False
            self._moving.discard(key)

    # --- the follower's side -------------------------------------------------------------

    async def _follow(self, key: ShardKey) -> None:
        await self._deposed_writes_done(key)
        backoff = 0.05
        shard_log: ShardLog | None = None
        while not self._closed and not self._leaving:
            record = self.records.get(key)
            if record is None or record.leader == self.node_id:
                return
            try:
                if shard_log is None:
                    shard_log = await asyncio.to_thread(self._logs.replica_log, *key)
                damaged = _first_damage(shard_log)
                if damaged is not None:
                    # records this copy lost to a damaged disk: cut the log there and fetch
                    # them (and what follows) again from the leader, as Kafka's recovery
                    # truncates at the first corrupt batch
                    log.warning(
                        "%s: records from %d were lost to damage; cutting there and copying "
                        "them again from %s", key, damaged, record.leader,
                    )  # fmt: skip
                    await _uncancellable(shard_log.truncate_to, damaged)
                    continue
                node = self._nodes().get(record.leader)
                if node is None:
                    raise ServerBusy(f"leader {record.leader} is not alive")
                view = snapshot(shard_log)
                request = FetchRequest(
                    self.node_id,
                    record.epoch,
                    view.log_end_offset,
                    view.epochs.latest_epoch,
                    view.fsynced_end_offset,
                )
                answer = await self._transport.fetch(
                    node, key, request, self.settings.fetch_wait_ms, self.settings.fetch_bytes_max
                )
                if answer.diverging is not None:
                    cut = lineage_cut(view, answer.diverging)
                    log.info("%s: cutting the log at %d (diverging epoch %s)", key, cut,
                             answer.diverging)  # fmt: skip
                    await _uncancellable(shard_log.truncate_to, cut)
                    continue
                if answer.records:
                    await _uncancellable(shard_log.append_raw, answer.records)
                shard_log.advance_high_watermark(min(answer.high_watermark, shard_log.end_seq))
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except (LogHubError, OSError) as exc:
                log.debug("%s: fetch from %s failed: %s", key, record.leader, exc)
                await asyncio.sleep(backoff)
                backoff = min(0.5, backoff * 2)


def _first_damage(shard_log: ShardLog) -> int | None:
    """Where the first range lost to damage begins, if below the log end."""
    lost = shard_log.lost_ranges()
    if lost and lost[0][0] < shard_log.end_seq:
        return lost[0][0]
    return None


async def _uncancellable(function: Callable[..., object], *args: object) -> None:
    """Runs blocking ``function`` in a thread to its end even when the caller is cancelled
    (a log write must not go on after its task is thought stopped), then re-raises."""
    work = asyncio.ensure_future(asyncio.to_thread(function, *args))
    try:
        await asyncio.shield(work)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await work
        raise


def _now_ms() -> int:
    return int(time.monotonic() * 1000)
