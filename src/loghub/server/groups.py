"""Consumer groups on the server: the REST operations over the pure ``ConsumerGroup`` logic.

Definitions and checkpoints are durable in the metadata database; who holds which shard lives
in memory, in one ``ConsumerGroup`` per group, fed by heartbeats. On a single server, after a
restart the groups that existed before start in recovery (``recovering=True``): for one
timeout they only adopt what consumers report and grant nothing new, so no shard can go to
two consumers.

In a cluster (``persistence`` set) each group's coordinator also saves the group's
assignment (shard -> holder) in etcd whenever it changes, before the heartbeat's reply goes
out, and fenced (``loghub.cluster.group_coordinators``); a node that becomes a group's
coordinator restores the saved assignment, so consumers keep their shards across a change
of coordinator. Checkpoint commits carry the coordinator's fence.

What the pure logic cannot see is computed here on each heartbeat: for every shard, whether
it is *finished* for this group: read-only and nothing left after the group's checkpoint
(its checkpoint is at or past the shard's end, or the shard holds no data from where the
checkpoint points, which includes an empty shard that never got a checkpoint).

Thread-safety: every method may be called from any thread; one lock per group serialises
the group's heartbeats and checkpoint checks (the pure logic is not thread-safe).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from loghub._clock import Clock
from loghub.coordination.group import ConsumerGroup, ShardView
from loghub.errors import (
    ConsumerNotMatch,
    FencedError,
    InvalidCursor,
    InvalidShardCheckPoint,
    ParameterInvalid,
    RecordsLostError,
    ServerBusy,
)
from loghub.metadata import Checkpoint, ConsumerGroupDef, MetadataStore, Shard

if TYPE_CHECKING:  # the etcd client loads only in cluster mode
    from loghub.cluster.etcd_metadata import EtcdMetadataStore
    from loghub.cluster.etcd_store import Fence
from loghub.storage import ShardLog, ShardStore
from loghub.wire.cursor import decode_cursor, encode_cursor
from loghub.wire.values import json_bool, json_int

__all__ = ["GroupPersistence", "GroupService", "GroupShardStatus", "HeartbeatObserver"]

GroupKey = tuple[str, str, str]

# A consumer silent this long is dead. A day is longer than any sane heartbeat interval; the
# bound keeps `timeout * 1000` a millisecond count that every clock can add.
group_timeout_s_max = 86_400
# Shard ids are 31-bit; a heartbeat's list is at most one entry per shard of a logstore.
_SHARD_ID_MAX = 2**31 - 1
_HELD_SHARDS_MAX = 4096


@dataclass
class _LiveGroup:
    lock: threading.Lock
    group: ConsumerGroup
    # the last consumer each shard was granted to, kept through a hand-off (when the group
    # grants the shard to nobody for a while): what tells a hand-off from a first grant
    holders: dict[int, str] = field(default_factory=dict)
    # the group's assignments at ``assignments_version`` (``ConsumerGroup.version``)
    assignments: dict[str, list[int]] = field(default_factory=dict)
    assignments_version: int = -1
    # the shard views of the last heartbeat and the metadata shards they were built from:
    # while those are the same objects, the views are reused (see ``_shard_views``)
    shards: list[Shard] = field(default_factory=list)
    views: tuple[ShardView, ...] = ()
    readonly: list[tuple[int, Shard]] = field(default_factory=list)  # (index in views, shard)
    # in a cluster: the owners last saved in etcd, and the group version they were read at
    saved_owners: dict[int, str] = field(default_factory=dict)
    saved_version: int = -1


# Told of every heartbeat: the group, whether its assignment changed, how many shards went
# from one consumer to another. Called under the group's lock: it must be quick.
HeartbeatObserver = Callable[[GroupKey, bool, int], None]


class GroupPersistence(Protocol):
    """Where a cluster keeps its groups' assignments (``ClusterRouting``). Each call blocks;
    each raises ServerBusy when it cannot be done now (the control plane does not answer,
    or this node no longer coordinates the group)."""

    def load_assignment(self, group: GroupKey) -> Mapping[int, str]: ...

    def save_assignment(self, group: GroupKey, owners: Mapping[int, str]) -> None: ...

    def checkpoint_fence(self, group: GroupKey) -> Fence: ...

    def delete_group(self, group: GroupKey) -> None: ...


@dataclass(frozen=True)
class GroupShardStatus:
    """One shard as one consumer group sees it: for the console and the lag metrics."""

    shard_id: int
    state: str  # the server-side state (not_alloc, already_alloc, transfer, wait, over)
    owner: str  # the consumer holding it ("" for none); during a hand-off the old holder
    checkpoint: str  # the saved cursor ("" for none)
    checkpoint_seq: int  # where the group resumes (the shard's begin without a checkpoint)
    end_seq: int
    lag_log_groups: int
    lag_s: float  # newest data's arrival minus that of the last consumed group (_lag_s)
    begin_seq: int  # the oldest retained group
    status: str  # the shard's own: readwrite or readonly
    update_time_us: int  # when the checkpoint was written (0 for none)


@dataclass(frozen=True)
class _LiveView:
    """What a group's live state says right now, silent consumers expired."""

    owners: dict[int, str]  # during a hand-off, still the old holder
    states: dict[int, str]
    consumers: list[str]


class GroupService:
    def __init__(
        self, metadata: MetadataStore | EtcdMetadataStore, storage: ShardStore, clock: Clock
    ) -> None:
        self._metadata = metadata
        self._storage = storage
        self._clock = clock
        # In a cluster: whether a shard's log lives on another node (set by the front end)
        self.is_remote: Callable[[str, str, int], bool] | None = None
        # In a cluster: where assignments are saved and restored (set by the front end)
        self.persistence: GroupPersistence | None = None
        self._lock = threading.Lock()
        self._live: dict[GroupKey, _LiveGroup] = {}
        # groups defined before this process started lost their assignments with it
        self._from_before: set[GroupKey] = set()
        self.heartbeat_observer: HeartbeatObserver | None = None
        for project in metadata.list_projects(0, 1_000_000)[0]:
            for logstore in metadata.list_logstores(project.name, 0, 1_000_000)[0]:
                catalog = metadata.consumer_groups(project.name, logstore)
                for group in catalog.list_groups(project.name, logstore):
                    self._from_before.add((project.name, logstore, group.name))

    # -- definitions --------------------------------------------------------------------------

    def create(self, project: str, logstore: str, body: Any) -> None:
        if not isinstance(body, dict):
            raise ParameterInvalid("the body must be a JSON object")
        name = body.get("consumerGroup")
        if not isinstance(name, str):
            raise ParameterInvalid("consumerGroup (a string) is required")
        ordered = json_bool(body.get("order", False), "order", ParameterInvalid)
        timeout_s = body.get("timeout")
        catalog = self._metadata.consumer_groups(project, logstore)
        catalog.create(project, logstore, ConsumerGroupDef(name, _timeout(timeout_s), ordered))

    def update(self, project: str, logstore: str, name: str, body: Any) -> None:
        if not isinstance(body, dict):
            raise ParameterInvalid("the body must be a JSON object")
        order = body.get("order")
        ordered = None if order is None else json_bool(order, "order", ParameterInvalid)
        timeout_s = None if body.get("timeout") is None else _timeout(body["timeout"])
        catalog = self._metadata.consumer_groups(project, logstore)
        definition = catalog.update(project, logstore, name, timeout_s, ordered)
        live = self._live.get((project, logstore, name))
        if live is not None:
            with live.lock:
                live.group.update(
                    self._clock.monotonic_ms(),
                    timeout_ms=definition.timeout_s * 1000,
                    ordered=definition.ordered,
                )

    def delete(self, project: str, logstore: str, name: str) -> None:
        self._metadata.consumer_groups(project, logstore).delete(project, logstore, name)
        self.forget((project, logstore, name))
        if self.persistence is not None:
            self.persistence.delete_group((project, logstore, name))

    def forget(self, group: GroupKey) -> None:
        """Drops a group's state in memory: the group was deleted, or in a cluster this node
        stopped coordinating it (the next node to coordinate it restores it from etcd)."""
        with self._lock:
            self._live.pop(group, None)

    def list_groups(self, project: str, logstore: str) -> list[dict[str, object]]:
        catalog = self._metadata.consumer_groups(project, logstore)
        return [group.to_json() for group in catalog.list_groups(project, logstore)]

    # -- heartbeats and checkpoints -------------------------------------------------------------

    def heartbeat(
        self, project: str, logstore: str, name: str, consumer: str, held: Any
    ) -> list[int]:
        held = _held_shards(consumer, held)
        live = self._live_group(project, logstore, name)
        with live.lock:
            views = self._shard_views(project, logstore, name, live)
            return self._heartbeat_locked(project, logstore, name, consumer, held, live, views)

    def heartbeat_in_memory(
        self, project: str, logstore: str, name: str, consumer: str, held: Any
    ) -> list[int] | None:
        """``heartbeat`` when it can be answered from memory at once, else None (call
        ``heartbeat`` off the event loop then). The server answers most heartbeats this
        way on its event loop: a hop to a storage thread and back cost a heartbeat more
        than the round itself (two thread wake-ups for a few microseconds of work), about
        a quarter of its server CPU at 100 consumers x 1,000 shards (0.82 -> 0.61 ms, see
        ``docs/decisions.md``).

        Memory only means: a single server (a cluster saves assignments in etcd and reads
        shards of other nodes), a group already live (restoring one reads its saved state),
        the same shard list as its last heartbeat with no read-only shard in it (whether
        one is finished reads its log), and the group's lock free now (its holder may be
        doing any of those)."""
        if self.persistence is not None or self.is_remote is not None:
            return None
        held = _held_shards(consumer, held)
        # raises as ``heartbeat`` would for a group or logstore that no longer exists
        self._metadata.consumer_groups(project, logstore).get(project, logstore, name)
        with self._lock:
            live = self._live.get((project, logstore, name))
        if live is None or not live.lock.acquire(blocking=False):
            return None
        try:
            if live.readonly or self._metadata.list_shards(project, logstore) != live.shards:
                return None
            # the same shards and none read-only: the views of the last heartbeat hold as
            # they are (what ``_shard_views`` would hand out again, without listing anew)
            return self._heartbeat_locked(project, logstore, name, consumer, held, live, live.views)
        finally:
            live.lock.release()

    def _heartbeat_locked(
        self,
        project: str,
        logstore: str,
        name: str,
        consumer: str,
        held: list[int],
        live: _LiveGroup,
        views: tuple[ShardView, ...],
    ) -> list[int]:
        version_before = live.group.version
        if live.assignments_version != version_before:
            live.assignments = live.group.assignments()
            live.assignments_version = version_before
        granted = live.group.heartbeat(consumer, held, views, self._clock.monotonic_ms())
        self._observe(project, logstore, name, live)
        if self.persistence is not None:
            self._save(project, logstore, name, live)
        return granted

    def _save(self, project: str, logstore: str, name: str, live: _LiveGroup) -> None:
        """Saves the group's owners when they changed, before the reply goes out: a reply
        never tells a consumer of a grant that a new coordinator would not restore."""
        assert self.persistence is not None
        if live.saved_version == live.group.version:
            return
        owners = live.group.owners()
        if owners != live.saved_owners:
            self.persistence.save_assignment((project, logstore, name), owners)
            live.saved_owners = owners
        live.saved_version = live.group.version

    def update_checkpoint(
        self,
        project: str,
        logstore: str,
        name: str,
        consumer: str,
        force: bool,
        body: Any,
    ) -> None:
        if not isinstance(body, dict):
            raise ParameterInvalid("the body must be a JSON object")
        if body.get("shard") is None:
            raise ParameterInvalid("shard (the shard id the checkpoint is for) is required")
        shard_id = json_int(body["shard"], "shard", ParameterInvalid, low=0, high=_SHARD_ID_MAX)
        cursor = body.get("checkpoint")
        if not isinstance(cursor, str):
            raise InvalidShardCheckPoint("checkpoint (a cursor string) is required")
        shard = self._metadata.get_shard(project, logstore, shard_id)
        try:
            position = decode_cursor(cursor)
        except InvalidCursor as exc:
            raise InvalidShardCheckPoint(f"checkpoint {cursor!r} is not a cursor") from exc
        local = self._local(project, logstore, shard)
        if local is not None and position > local.high_watermark_seq:
            raise InvalidShardCheckPoint(f"checkpoint {cursor!r} is past the end of the shard")
        live = self._live_group(project, logstore, name)
        if not force:
            with live.lock:
                if not live.group.can_checkpoint(consumer, shard_id):
                    raise ConsumerNotMatch(f"consumer {consumer!r} does not hold shard {shard_id}")
        checkpoint = Checkpoint(shard_id, cursor.strip(), consumer, self._clock.wall_ms() * 1000)
        catalog = self._metadata.consumer_groups(project, logstore)
        if self.persistence is None:
            catalog.save_checkpoint(project, logstore, name, checkpoint)
            return
        fence = self.persistence.checkpoint_fence((project, logstore, name))
        try:
            catalog.save_checkpoint(  # type: ignore[call-arg]
                project, logstore, name, checkpoint, fence=fence
            )
        except FencedError as exc:
            self.forget((project, logstore, name))
            raise ServerBusy(f"this node no longer coordinates group {name}; try again") from exc

    def get_checkpoints(
        self, project: str, logstore: str, name: str, shard_id: int | None
    ) -> list[dict[str, object]]:
        """One entry per shard (an empty checkpoint where none was saved), or for one shard;
        an unknown shard gives an empty list, as the SDK expects. "consumer" names the
        shard's owner now (empty when nobody holds it), as on the hosted service, not the
        last consumer that wrote the checkpoint."""
        catalog = self._metadata.consumer_groups(project, logstore)
        saved = catalog.checkpoints(project, logstore, name)
        owners = self._live_view(project, logstore, name, restore=True).owners
        shard_ids: Iterable[int] = [
            s.shard_id for s in self._metadata.list_shards(project, logstore)
        ]
        if shard_id is not None:
            shard_ids = [shard_id] if shard_id in shard_ids else []
        return [
            replace(saved.get(s, Checkpoint(s, "", "", 0)), consumer=owners.get(s, "")).to_json()
            for s in shard_ids
        ]

    def _live_view(
        self, project: str, logstore: str, name: str, restore: bool = False
    ) -> _LiveView:
        """Owners, states and consumers after expiring the silent (as the next heartbeat
        would), so a crashed consumer shows as nobody; empty before any heartbeat (in a
        cluster, with ``restore`` on the group's coordinator: what the saved assignment
        says)."""
        if restore and self.persistence is not None:
            self._live_group(project, logstore, name)
        with self._lock:
            live = self._live.get((project, logstore, name))
        if live is None:
            return _LiveView({}, {}, [])
        with live.lock:
            live.group.expire(self._clock.monotonic_ms())
            return _LiveView(
                live.group.owners(),
                {shard_id: state.value for shard_id, state in live.group.shard_states().items()},
                sorted(live.group.assignments()),
            )

    # -- status for the console and the metrics ---------------------------------------------------

    def shard_status(self, project: str, logstore: str, name: str) -> list[GroupShardStatus]:
        """Each shard's state, owner, checkpoint and lag for one group (``_live_view``)."""
        return self._shard_status(project, logstore, name, self._live_view(project, logstore, name))

    def _shard_status(
        self, project: str, logstore: str, name: str, view: _LiveView
    ) -> list[GroupShardStatus]:
        saved = self._metadata.consumer_groups(project, logstore).checkpoints(
            project, logstore, name
        )
        result = []
        for shard in self._metadata.list_shards(project, logstore):
            checkpoint = saved.get(shard.shard_id)
            cursor = checkpoint.cursor if checkpoint is not None else ""
            shard_log = self._local(project, logstore, shard)
            if shard_log is not None:
                begin_seq, end_seq = shard_log.begin_seq, shard_log.high_watermark_seq
            else:  # on another node of a cluster: what the metadata knows
                begin_seq = 0
                end_seq = shard.end_seq if shard.end_seq is not None else 0
            position = max(begin_seq, decode_cursor(cursor)) if cursor else begin_seq
            end_seq = max(end_seq, position)
            lag = max(0, end_seq - position)
            result.append(
                GroupShardStatus(
                    shard.shard_id,
                    view.states.get(shard.shard_id, "not_alloc"),
                    view.owners.get(shard.shard_id, ""),
                    cursor,
                    position,
                    end_seq,
                    lag,
                    _lag_s(shard_log, position, end_seq) if lag and shard_log else 0.0,
                    begin_seq,
                    shard.status,
                    checkpoint.update_time_us if checkpoint is not None else 0,
                )
            )
        return result

    def describe(self, project: str, logstore: str, name: str) -> dict[str, object]:
        """What an operator asks of a group (LogHub only): its live consumers, and per shard
        its status, state, owner, checkpoint, end and lag (as ``shard_status`` counts them:
        in log groups, the unit of storage, where ``end - checkpoint`` is exact and free, and
        in seconds, the newest group's arrival minus the last consumed one's). The hosted
        service has no such API; owner and state live only in this server's memory."""
        definition = self._metadata.consumer_groups(project, logstore).get(project, logstore, name)
        view = self._live_view(project, logstore, name, restore=True)
        statuses = self._shard_status(project, logstore, name, view)
        entries: list[dict[str, object]] = []
        for status in statuses:
            entries.append(
                {
                    "shard": status.shard_id,
                    "status": status.status,
                    "state": status.state,
                    "owner": status.owner,
                    "checkpoint": status.checkpoint,
                    "checkpointSeq": status.checkpoint_seq if status.checkpoint else None,
                    "updateTime": status.update_time_us,
                    "beginSeq": status.begin_seq,
                    "end": encode_cursor(status.end_seq),
                    "endSeq": status.end_seq,
                    "lagGroups": status.lag_log_groups,
                    "lagSeconds": status.lag_s,
                }
            )
        return {
            "consumerGroup": name,
            "timeout": definition.timeout_s,
            "order": definition.ordered,
            "consumers": view.consumers,
            "shards": entries,
            "lagGroups": sum(s.lag_log_groups for s in statuses),
            "lagSeconds": max((s.lag_s for s in statuses), default=0.0),
        }

    def _observe(self, project: str, logstore: str, name: str, live: _LiveGroup) -> None:
        """Tells the observer whether the heartbeat changed the assignments and how many
        shards changed hands; ``live.assignments`` holds them from before the heartbeat.
        A quiet heartbeat leaves the group's version alone, and then nothing is compared."""
        before = live.assignments
        handoffs = 0
        changed = live.assignments_version != live.group.version
        if changed:
            after = live.group.assignments()
            for consumer, shard_ids in after.items():
                for shard_id in shard_ids:
                    previous = live.holders.get(shard_id)
                    handoffs += previous is not None and previous != consumer
                    live.holders[shard_id] = consumer
            changed = after != before
            live.assignments, live.assignments_version = after, live.group.version
        if self.heartbeat_observer is not None:
            self.heartbeat_observer((project, logstore, name), changed, handoffs)

    # -- internals ------------------------------------------------------------------------------

    def _live_group(self, project: str, logstore: str, name: str) -> _LiveGroup:
        definition = self._metadata.consumer_groups(project, logstore).get(project, logstore, name)
        key = (project, logstore, name)
        with self._lock:
            live = self._live.get(key)
        if live is not None:
            return live
        saved: Mapping[int, str] | None = None
        if self.persistence is not None:
            saved = self.persistence.load_assignment(key)  # read outside the lock: etcd
        with self._lock:
            live = self._live.get(key)
            if live is not None:
                return live
            now_ms = self._clock.monotonic_ms()
            group = ConsumerGroup(
                name,
                definition.timeout_s * 1000,
                definition.ordered,
                now_ms,
                # a saved assignment is complete: every grant was saved before its reply
                recovering=saved is None and key in self._from_before,
            )
            live = _LiveGroup(threading.Lock(), group)
            if saved:
                group.restore(saved, self._shard_views(project, logstore, name, live), now_ms)
                live.saved_owners = dict(saved)
            self._live[key] = live
            return live

    def _shard_log(self, project: str, logstore: str, shard: Shard) -> ShardLog:
        store = self._metadata.get_logstore(project, logstore)
        return self._storage.shard(store.storage_key, shard.shard_id)

    def _local(self, project: str, logstore: str, shard: Shard) -> ShardLog | None:
        """The shard's log, or None when it lives on another node of a cluster (whose
        group coordinator this node is): its end and retention are that node's to know."""
        if self.is_remote is not None and self.is_remote(project, logstore, shard.shard_id):
            return None
        return self._shard_log(project, logstore, shard)

    def _shard_views(
        self, project: str, logstore: str, name: str, live: _LiveGroup
    ) -> tuple[ShardView, ...]:
        """Every shard as the group sees it. The views of the last heartbeat are kept and
        handed out again, the same tuple, while the shard list is the same: only read-only
        shards can become finished (by a checkpoint or by retention), so only they are
        looked at again. At 1,000 shards this is what keeps a heartbeat from costing a
        thousand objects."""
        shards = self._metadata.list_shards(project, logstore)
        if shards != live.shards:  # equal while the metadata holds the same Shard objects
            live.views = tuple(ShardView(s.shard_id, s.parents, False) for s in shards)
            live.shards = shards
            live.readonly = [
                (index, shard)
                for index, shard in enumerate(shards)
                if shard.status == "readonly" and shard.end_seq is not None
            ]
        if not live.readonly:
            return live.views
        saved = self._metadata.consumer_groups(project, logstore).checkpoints(
            project, logstore, name
        )
        views = list(live.views)
        for index, shard in live.readonly:
            assert shard.end_seq is not None
            local = self._local(project, logstore, shard)
            begin_seq = local.begin_seq if local is not None else 0
            checkpoint = saved.get(shard.shard_id)
            position = begin_seq
            if checkpoint is not None and checkpoint.cursor:
                position = max(begin_seq, decode_cursor(checkpoint.cursor))
            finished = position >= shard.end_seq
            if views[index].finished != finished:
                views[index] = ShardView(shard.shard_id, shard.parents, finished)
        if views != list(live.views):
            live.views = tuple(views)
        return live.views


def _held_shards(consumer: str, held: Any) -> list[int]:
    """A heartbeat's body (the shard ids its consumer holds), checked."""
    if not isinstance(held, list) or len(held) > _HELD_SHARDS_MAX:
        raise ParameterInvalid("a heartbeat body is a JSON array of shard ids")
    if held and set(map(type, held)) == {int} and min(held) >= 0 and max(held) <= _SHARD_ID_MAX:
        shard_ids = held  # what every SDK sends: plain ids, checked without a call per id
    else:
        shard_ids = [
            json_int(s, "a held shard id", ParameterInvalid, low=0, high=_SHARD_ID_MAX)
            for s in held
        ]
    if not consumer:
        raise ParameterInvalid("the query parameter consumer is required")
    return shard_ids


def _lag_s(shard_log: ShardLog, position: int, end_seq: int) -> float:
    """How far behind in time a reader at ``position`` is: the newest group's arrival minus
    that of the last group it consumed (the one before ``position``; the first unread one
    when nothing before it is retained), so one unread group written a second after the
    last consumed one is a second of lag. 0 when a damaged range hides either (the lag in
    groups still tells)."""
    read = position - 1 if position > shard_log.begin_seq else position
    try:
        newest_ms = shard_log.receive_time_ms(end_seq - 1)
        read_ms = shard_log.receive_time_ms(read)
    except RecordsLostError:
        return 0.0
    return max(0, newest_ms - read_ms) / 1000


def _timeout(value: Any) -> int:
    """A group timeout in seconds. The official SDK sends ``heartbeat_interval * 2``, a float
    such as 4.0; a fractional one is rounded up (a longer timeout is the safe side)."""
    if value is None:
        raise ParameterInvalid("timeout (integer seconds) is required")
    return json_int(
        value, "timeout", ParameterInvalid, low=1, high=group_timeout_s_max, round_up=True
    )
