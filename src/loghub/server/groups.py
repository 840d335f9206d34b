"""Consumer groups on the server: the REST operations over the pure ``ConsumerGroup`` logic.

Definitions and checkpoints are durable in the metadata database; who holds which shard lives
only in memory, in one ``ConsumerGroup`` per group, fed by heartbeats. After a restart the
groups that existed before start in recovery (``recovering=True``): for one timeout they only
adopt what consumers report and grant nothing new, so no shard can go to two consumers.

What the pure logic cannot see is computed here on each heartbeat: for every shard, whether
it is *finished* for this group: read-only and nothing left after the group's checkpoint
(its checkpoint is at or past the shard's end, or the shard holds no data from where the
checkpoint points, which includes an empty shard that never got a checkpoint).

Thread-safety: every method may be called from any thread; one lock per group serialises
the group's heartbeats and checkpoint checks (the pure logic is not thread-safe).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from loghub._clock import Clock
from loghub.coordination.group import ConsumerGroup, ShardView
from loghub.errors import (
    ConsumerNotMatch,
    InvalidCursor,
    InvalidShardCheckPoint,
    ParameterInvalid,
)
from loghub.metadata import Checkpoint, ConsumerGroupDef, MetadataStore, Shard
from loghub.storage import ShardLog, ShardStore
from loghub.wire.cursor import decode_cursor
from loghub.wire.values import json_int

__all__ = ["GroupService"]

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


class GroupService:
    def __init__(self, metadata: MetadataStore, storage: ShardStore, clock: Clock) -> None:
        self._metadata = metadata
        self._storage = storage
        self._clock = clock
        self._lock = threading.Lock()
        self._live: dict[GroupKey, _LiveGroup] = {}
        # groups defined before this process started lost their assignments with it
        self._from_before: set[GroupKey] = set()
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
        timeout_s = body.get("timeout")
        ordered = body.get("order", False)
        if not isinstance(name, str) or not isinstance(ordered, bool):
            raise ParameterInvalid("consumerGroup (string) and order (boolean) are required")
        catalog = self._metadata.consumer_groups(project, logstore)
        catalog.create(project, logstore, ConsumerGroupDef(name, _timeout(timeout_s), ordered))

    def update(self, project: str, logstore: str, name: str, body: Any) -> None:
        if not isinstance(body, dict):
            raise ParameterInvalid("the body must be a JSON object")
        ordered = body.get("order")
        if ordered is not None and not isinstance(ordered, bool):
            raise ParameterInvalid("order must be a boolean")
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
        with self._lock:
            self._live.pop((project, logstore, name), None)

    def list_groups(self, project: str, logstore: str) -> list[dict[str, object]]:
        catalog = self._metadata.consumer_groups(project, logstore)
        return [group.to_json() for group in catalog.list_groups(project, logstore)]

    # -- heartbeats and checkpoints -------------------------------------------------------------

    def heartbeat(
        self, project: str, logstore: str, name: str, consumer: str, held: Any
    ) -> list[int]:
        if not isinstance(held, list) or len(held) > _HELD_SHARDS_MAX:
            raise ParameterInvalid("a heartbeat body is a JSON array of shard ids")
        held = [
            json_int(s, "a held shard id", ParameterInvalid, low=0, high=_SHARD_ID_MAX)
            for s in held
        ]
        if not consumer:
            raise ParameterInvalid("the query parameter consumer is required")
        live = self._live_group(project, logstore, name)
        with live.lock:
            views = self._shard_views(project, logstore, name)
            return live.group.heartbeat(consumer, held, views, self._clock.monotonic_ms())

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
        shard_id = json_int(body.get("shard"), "shard", ParameterInvalid, low=0, high=_SHARD_ID_MAX)
        cursor = body.get("checkpoint")
        if not isinstance(cursor, str):
            raise InvalidShardCheckPoint("checkpoint (a cursor string) is required")
        shard = self._metadata.get_shard(project, logstore, shard_id)
        try:
            position = decode_cursor(cursor)
        except InvalidCursor as exc:
            raise InvalidShardCheckPoint(f"checkpoint {cursor!r} is not a cursor") from exc
        if position > self._shard_log(project, logstore, shard).end_seq:
            raise InvalidShardCheckPoint(f"checkpoint {cursor!r} is past the end of the shard")
        live = self._live_group(project, logstore, name)
        if not force:
            with live.lock:
                if not live.group.can_checkpoint(consumer, shard_id):
                    raise ConsumerNotMatch(f"consumer {consumer!r} does not hold shard {shard_id}")
        checkpoint = Checkpoint(shard_id, cursor.strip(), consumer, self._clock.wall_ms() * 1000)
        catalog = self._metadata.consumer_groups(project, logstore)
        catalog.save_checkpoint(project, logstore, name, checkpoint)

    def get_checkpoints(
        self, project: str, logstore: str, name: str, shard_id: int | None
    ) -> list[dict[str, object]]:
        """One entry per shard (an empty checkpoint where none was saved), or for one shard;
        an unknown shard gives an empty list, as the SDK expects. "consumer" names the
        shard's owner now (empty when nobody holds it), as on the hosted service, not the
        last consumer that wrote the checkpoint."""
        catalog = self._metadata.consumer_groups(project, logstore)
        saved = catalog.checkpoints(project, logstore, name)
        owners = self._owners(project, logstore, name)
        shard_ids: Iterable[int] = [
            s.shard_id for s in self._metadata.list_shards(project, logstore)
        ]
        if shard_id is not None:
            shard_ids = [shard_id] if shard_id in shard_ids else []
        return [
            replace(saved.get(s, Checkpoint(s, "", "", 0)), consumer=owners.get(s, "")).to_json()
            for s in shard_ids
        ]

    def _owners(self, project: str, logstore: str, name: str) -> dict[int, str]:
        """The live group's owners (after expiring the silent); none before any heartbeat."""
        with self._lock:
            live = self._live.get((project, logstore, name))
        if live is None:
            return {}
        with live.lock:
            live.group.expire(self._clock.monotonic_ms())
            return live.group.owners()

    # -- internals ------------------------------------------------------------------------------

    def _live_group(self, project: str, logstore: str, name: str) -> _LiveGroup:
        definition = self._metadata.consumer_groups(project, logstore).get(project, logstore, name)
        key = (project, logstore, name)
        with self._lock:
            live = self._live.get(key)
            if live is None:
                group = ConsumerGroup(
                    name,
                    definition.timeout_s * 1000,
                    definition.ordered,
                    self._clock.monotonic_ms(),
                    recovering=key in self._from_before,
                )
                live = self._live[key] = _LiveGroup(threading.Lock(), group)
            return live

    def _shard_log(self, project: str, logstore: str, shard: Shard) -> ShardLog:
        store = self._metadata.get_logstore(project, logstore)
        return self._storage.shard(store.storage_key, shard.shard_id)

    def _shard_views(self, project: str, logstore: str, name: str) -> list[ShardView]:
        saved = self._metadata.consumer_groups(project, logstore).checkpoints(
            project, logstore, name
        )
        views = []
        for shard in self._metadata.list_shards(project, logstore):
            finished = False
            if shard.status == "readonly" and shard.end_seq is not None:
                begin_seq = self._shard_log(project, logstore, shard).begin_seq
                checkpoint = saved.get(shard.shard_id)
                position = begin_seq
                if checkpoint is not None and checkpoint.cursor:
                    position = max(begin_seq, decode_cursor(checkpoint.cursor))
                finished = position >= shard.end_seq
            views.append(ShardView(shard.shard_id, shard.parents, finished))
        return views


def _timeout(value: Any) -> int:
    """A group timeout in seconds. The official SDK sends ``heartbeat_interval * 2``, a float
    such as 4.0; a fractional one is rounded up (a longer timeout is the safe side)."""
    if value is None:
        raise ParameterInvalid("timeout (integer seconds) is required")
    return json_int(
        value, "timeout", ParameterInvalid, low=1, high=group_timeout_s_max, round_up=True
    )
