"""The server's engine: the LogHub operations over metadata and shard storage, without HTTP.

The HTTP layer (``app.py``) parses requests and calls these methods; the blocking parts of
the data path (decompression, protobuf parsing, checksums, disk writes, fsync waits) run in
``storage_threads`` threads beside the event loop. Those libraries release the GIL, which is
how one server process uses both cores.

Thread-safety: every method may be called from any thread; the metadata store and the shard
logs do their own locking.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import shutil
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from loghub._clock import Clock
from loghub.errors import (
    ConsumerGroupAlreadyExist,
    ConsumerGroupNotExist,
    DataCorrupted,
    InvalidCursor,
    LogHubError,
    LogSealedError,
    LogStoreInfoInvalid,
    LogStoreNotExist,
    NotFoundError,
    ParameterInvalid,
    RecordsLostError,
    ServerBusy,
    ShardNotExist,
    ShardReadOnly,
    StorageClosedError,
)
from loghub.metadata import (
    Checkpoint,
    ConsumerGroupDef,
    Logstore,
    LogstoreSpec,
    MetadataStore,
    Shard,
    parse_hash_key,
)

if TYPE_CHECKING:  # the etcd client loads only in cluster mode
    from loghub.cluster.etcd_metadata import EtcdMetadataStore
from loghub.server.autosplit import AutoSplitMonitor
from loghub.server.commit import CommitQueue
from loghub.server.config import ServerConfig
from loghub.server.groups import GroupService
from loghub.server.idempotence import IdempotentWrites
from loghub.server.metrics import GroupShardLag, LogstoreDisk, ServerMetrics
from loghub.server.quotas import ShardQuota, ShardQuotas, rate_per_s_max
from loghub.server.read_buffers import ReadBuffers
from loghub.server.tail_waits import ShardTail, TailWaits
from loghub.server.validation import BodyChecker
from loghub.storage import (
    ShardLog,
    ShardLogStatistics,
    ShardStore,
    StorageConfig,
    raise_open_files_limit,
)
from loghub.wire.cursor import decode_cursor, encode_cursor
from loghub.wire.logs import PULL_BYTES_MAX_PARAM, frame_log_group, split_log_group_list
from loghub.wire.producer_ids import WriteId, marked
from loghub.wire.stored import expand, reply_body, stored_entry
from loghub.wire.values import json_bool, json_int, parse_decimal

__all__ = ["LogHubService", "Offload", "PullResult", "RemoteLogs"]

# Runs a blocking call off the event loop (the server's storage threads).
Offload = Callable[..., Awaitable[Any]]

log = logging.getLogger("loghub.server")

# describe_logstore's write rate is the log groups received in this many last seconds
rate_window_s = 60

_DAY_MS = 86_400_000
# A write that keeps meeting freshly sealed shards gives up after this many routings.
_REROUTES_MAX = 16
# Bodies up to this size (compressed, and declared raw) are checked on the event loop by
# put_logs_async: the check runs at about 1 GB/s of raw bytes (16 logs of 200 B take 20 us, a
# 1 MiB body about a millisecond), and a body handed to a thread and back cost its request
# several milliseconds more and the server a third of its rate. Measured with
# benchmarks/ingest.py (4 producers, one request in flight each): at 64 KiB, 4,096-log bodies
# (870 KiB raw) went to a thread, 1.78-1.85 M logs/s, p50 8.6-8.9 ms; at 1 MiB 2.61-2.72 M,
# p50 5.5-5.8 ms; 512-log bodies (110 KiB) 0.75-0.88 M at 64 KiB, 1.05-1.20 M at 256 KiB.
# The bound keeps the loop's longest stall for other requests near a millisecond.
loop_body_bytes_max = 1024 * 1024
# Stored records up to this size stay readable whatever the body limits are set to now.
_RECORD_BYTES_FLOOR = 32 * 1024 * 1024


@dataclass
class _LbBalance:
    """A logstore's `lb` state: the shard of the current commit round, bytes per shard."""

    round: int
    shard_id: int
    bytes_by_shard: collections.Counter[int]


@dataclass(frozen=True)
class PullResult:
    body: bytes  # the (compressed) LogGroupList
    compress_type: str  # "" when the body is not compressed
    raw_size: int
    count: int
    next_cursor: str
    bytes_max: int = 0  # the raw-byte limit applied
    # Set when the reply is empty because the pull is at the end of a writable shard (not at
    # an end_cursor): new data may still come, so a long poll may wait for it.
    tail: ShardTail | None = None


# on a 503 from a node that got a forwarded request for a shard it no longer serves: the
# node that forwarded it routes it again instead of passing the 503 on
NOT_SERVED_HEADER = "x-loghub-not-served"


class NotServedHere(ServerBusy):
    """A forwarded request reached a node that no longer serves it (a shard's leadership
    or a group moved after the forwarding node looked); answered 503 with
    ``NOT_SERVED_HEADER``, so the forwarding node routes it again."""


class NodeUnreachable(ServerBusy):
    """A forward whose connection was refused (or, for a write with an id, dropped):
    nothing was stored by it, so the request may be routed again (``LogHubApp._shard``
    does, once its view has moved on)."""


class ShardElsewhere(ServerBusy):
    """A write picked a shard whose log another node of the cluster holds (a routed write
    whose shard was handed over and succeeded while it waited, or whose placement this
    node's view does not show yet). Nothing was appended: the front end passes the request
    on to the holder, and a client that sees this as a 503 may send it again."""

    def __init__(self, shard_id: int, logstore: str) -> None:
        super().__init__(
            f"shard {shard_id} of {logstore} is served by another node (it moved); try again"
        )
        self.shard_id = shard_id


class LogHubService:
    def __init__(self, config: ServerConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        config.data_dir.mkdir(parents=True, exist_ok=True)
        # Descriptors are bounded by the storage's file cache, but sockets are not: take
        # whatever the hard limit allows.
        soft, hard = raise_open_files_limit()
        # Idle log files may take half of the limit; sockets and the database get the rest.
        open_files_max = max(16, min(config.open_files_max, soft // 2))
        log.info(
            "open files limit: soft %d, hard %d; idle log files kept open: %d",
            soft,
            hard,
            open_files_max,
        )
        self.metrics = ServerMetrics()
        self.metadata: MetadataStore | EtcdMetadataStore
        if config.cluster is None:
            self.metadata = MetadataStore.open(config.metadata_url(), clock)
        else:
            from loghub.cluster.etcd_metadata import EtcdMetadataStore

            self.metadata = EtcdMetadataStore.open(config.cluster.url, clock)
        self.storage = ShardStore(
            config.data_dir / "shards",
            StorageConfig(
                fsync_policy=config.fsync_policy,
                fsync_interval_ms=config.fsync_interval_ms,
                segment_bytes_max=config.segment_bytes_max,
                # The bound a record read back must keep: never below what earlier releases
                # let in (32 MiB), so lowering the body limit cannot make stored records
                # look damaged.
                payload_bytes_max=max(config.limits.raw_body_bytes_max, _RECORD_BYTES_FLOOR) + 16,
                open_files_max=open_files_max,
                fsync_observer=self.metrics.fsync_seconds.observe,
            ),
            clock,
        )
        try:
            segment_count = self.storage.check_formats()
        except BaseException:
            self.metadata.close()
            raise
        log.info("data directory: %d segment files in formats this server reads", segment_count)
        self.groups = GroupService(self.metadata, self.storage, clock)
        self.groups.heartbeat_observer = self.metrics.count_heartbeat
        self.metrics.watch_storage(self.storage.statistics)
        self.metrics.watch_service(self)
        self._round_robin = itertools.count()
        self.body_checker = BodyChecker(config.limits)
        self.autosplit = AutoSplitMonitor(
            config.auto_split_bytes_per_s, config.auto_split_sustain_ms
        )
        self.quotas = ShardQuotas(clock)
        self.tail_waits = TailWaits(config.limits.pull_waiters_max)
        self.read_buffers = ReadBuffers(config.limits.pull_buffer_bytes_kept_max)
        self._closed = threading.Event()
        self._commits: CommitQueue | None = None
        self._lb: dict[tuple[str, str], _LbBalance] = {}
        self._commits_lock = threading.Lock()
        # In a cluster: the shard logs that live on other nodes (set by the front end), so a
        # merge of two shards on two nodes seals both
        self.remote_logs: RemoteLogs | None = None
        # In a cluster: whether this node holds a shard's log (set by the front end). A write
        # is appended only to such a shard: a routed write that a hand-over's seal sends on
        # to the successor, placed on another node, must go there, not into a local file
        # that no read would ever reach.
        self.holds_shard: Callable[[str, str, int], bool] | None = None
        # In a cluster with replicated shards: the leaders' acknowledgement (set by the front
        # end). A write is answered once every in-sync replica holds it, and refused while
        # the shard has fewer in-sync replicas than required.
        self.replication: ReplicationGate | None = None
        # what each shard's leader remembers of the producers writing to it
        self.idempotent = IdempotentWrites()

    def close(self) -> None:
        with self._commits_lock:
            self._closed.set()
            if self._commits is not None:
                self._commits.close()
        self.body_checker.close()
        self.storage.close()
        self.metadata.close()

    # -- logstores ---------------------------------------------------------------------------

    def create_logstore(self, project: str, body: Mapping[str, Any]) -> Logstore:
        return self.metadata.create_logstore(project, logstore_spec_from_json(body))

    def update_logstore(self, project: str, name: str, body: Mapping[str, Any]) -> Logstore:
        """Applies the changed fields; `shardCount` is ignored, since only split and merge
        change the shards of a logstore. Quota keys absent from the body are kept: the
        official SDK's update sends only the keys it knows. A `logstoreName` other than the
        path's is refused, not ignored: the caller meant a rename, which is not done."""
        named = body.get("logstoreName")
        if named is not None and named != name:
            raise LogStoreInfoInvalid(
                f"logstoreName {str(named)[:70]!r} in the body is not the logstore {name!r} of "
                "the path; a logstore cannot be renamed"
            )
        changes = logstore_changes_from_json(body)
        if "extra" in changes:
            old = self.metadata.get_logstore(project, name).extra
            kept = {k: old[k] for k in _QUOTA_KEYS if k in old and k not in changes["extra"]}
            changes["extra"] = {**kept, **changes["extra"]}
        return self.metadata.update_logstore(project, name, changes)

    def delete_logstore(self, project: str, name: str) -> None:
        logstore = self.metadata.delete_logstore(project, name)
        self._lb.pop((project, name), None)
        self.storage.drop_logstore(logstore.storage_key)
        self.metrics.forget_logstore(project, name)

    def delete_project(self, project: str) -> None:
        for logstore in self.metadata.delete_project(project):
            self.storage.drop_logstore(logstore.storage_key)
            self.metrics.forget_logstore(project, logstore.name)
            self._lb.pop((project, logstore.name), None)

    # -- data path ---------------------------------------------------------------------------

    def shard_log(self, project: str, logstore: str, shard_id: int) -> ShardLog:
        store = self.metadata.get_logstore(project, logstore)
        return self._open_log(store, self.metadata.get_shard(project, logstore, shard_id))

    def _open_log(self, store: Logstore, shard: Shard) -> ShardLog:
        """The shard's log; a read-only shard's log is sealed, also after a restart."""
        shard_log = self.storage.shard(store.storage_key, shard.shard_id)
        if shard.status == "readonly" and not shard_log.sealed:
            end_seq = shard_log.seal()
            self.tail_waits.notify(shard_log)
            if end_seq != shard.end_seq:
                log.error(
                    "shard %s/%d ends at %d, but was closed at %s",
                    store.storage_key,
                    shard.shard_id,
                    end_seq,
                    shard.end_seq,
                )
        return shard_log

    # -- split and merge ---------------------------------------------------------------------

    def split_shard(
        self, project: str, logstore: str, shard_id: int, key: str | None
    ) -> list[Shard]:
        """Splits at `key`, or in the middle of the range; returns [parent, left, right]."""
        shard = self.metadata.get_shard(project, logstore, shard_id)
        split_key = (shard.begin_key + shard.end_key) // 2 if not key else parse_hash_key(key)
        sealer = _Sealer(self, self.metadata.get_logstore(project, logstore))
        parent, left, right = self.metadata.split_shard(
            project, logstore, shard_id, split_key, sealer
        )
        log.info(
            "split %s/%s shard %d into %d and %d",
            project,
            logstore,
            shard_id,
            left.shard_id,
            right.shard_id,
        )
        return [parent, left, right]

    def merge_shard(self, project: str, logstore: str, shard_id: int) -> list[Shard]:
        """Merges with the right-hand neighbour; returns [merged, left, right]."""
        sealer = _Sealer(self, self.metadata.get_logstore(project, logstore))
        merged, left, right = self.metadata.merge_shard(project, logstore, shard_id, sealer)
        log.info(
            "merged %s/%s shards %d and %d into %d",
            project,
            logstore,
            left.shard_id,
            right.shard_id,
            merged.shard_id,
        )
        return [merged, left, right]

    def shard_json(self, shard: Shard) -> dict[str, Any]:
        """A list_shards entry; a read-only shard also shows its fixed end (``endCursor``)."""
        body = shard.to_json()
        if shard.end_seq is not None:
            body["endCursor"] = encode_cursor(shard.end_seq)
        return body

    def describe_logstore(self, project: str, name: str) -> dict[str, Any]:
        """LogHub only: the logstore with what an operator asks of it, per shard its size on
        disk, retained range and write rate. The rate is counted from the time index (log
        groups received in the last ``rate_window_s``), so it costs two index lookups, needs
        no counters kept for it, and is the same on every server after a restart."""
        store = self.metadata.get_logstore(project, name)
        now_ms = self.clock.wall_ms()
        shards: list[dict[str, Any]] = []
        size_bytes, recent_groups = 0, 0
        for shard in self.metadata.list_shards(project, name):
            shard_log = self._open_log(store, shard)
            statistics = shard_log.statistics()
            recent = statistics.end_seq - shard_log.seq_for_time(now_ms - rate_window_s * 1000)
            size_bytes += statistics.size_bytes
            recent_groups += recent
            shards.append(
                {
                    "shard": shard.shard_id,
                    "status": shard.status,
                    "sizeBytes": statistics.size_bytes,
                    "beginSeq": statistics.begin_seq,
                    "endSeq": statistics.end_seq,
                    "groupsPerSecond": round(recent / rate_window_s, 3),
                }
            )
        return {
            "logstore": store.to_json(),
            "shards": shards,
            "sizeBytes": size_bytes,
            "groupsPerSecond": round(recent_groups / rate_window_s, 3),
            "rateWindowSeconds": rate_window_s,
        }

    def check_autosplit(self) -> list[Shard]:
        """Splits every shard that has written faster than the limit for long enough, in
        logstores with autoSplit on, up to their maxSplitShard; returns the new shards."""
        created: list[Shard] = []
        for project, logstore, shard_id in self.autosplit.due(self.clock.monotonic_ms()):
            try:
                store = self.metadata.get_logstore(project, logstore)
                writable = [s for s in self.metadata.list_shards(project, logstore) if _writable(s)]
                if not store.auto_split or len(writable) >= store.max_split_shard:
                    continue
                created.extend(self.split_shard(project, logstore, shard_id, None)[1:])
            except (NotFoundError, ShardReadOnly):
                continue  # deleted or already resharded since it was measured
            except LogHubError as exc:  # e.g. a range too narrow or no shard ids left
                log.warning(
                    "auto-split of %s/%s shard %d refused: %s", project, logstore, shard_id, exc
                )
        return created

    def pick_shard(
        self,
        project: str,
        logstore: str,
        target: str,
        hash_key: str | None,
        lb_round: int | None = None,
    ) -> Shard:
        """The shard a PutLogs goes to: `lb` (any readwrite shard), `route` (by key), or an
        id. With ``lb_round`` (the commit round being filled), every `lb` write of one round
        goes to one shard (see ``_lb_shard``); without, `lb` takes the shards in turn."""
        if target == "route":
            if hash_key is None:
                raise ParameterInvalid("a routed write needs the query parameter key")
            return self.metadata.shard_for_key(project, logstore, parse_hash_key(hash_key))
        if target == "lb":
            writable = [s for s in self.metadata.list_shards(project, logstore) if _writable(s)]
            if not writable:
                raise ShardNotExist(f"logstore {logstore} has no readwrite shard")
            if lb_round is not None:
                return self._lb_shard(project, logstore, writable, lb_round)
            return writable[next(self._round_robin) % len(writable)]
        shard = self.metadata.get_shard(project, logstore, parse_shard_id(target))
        if not _writable(shard):
            raise ShardReadOnly(f"shard {shard.shard_id} is readonly")
        return shard

    def _check_held(self, project: str, logstore: str, shard: Shard) -> None:
        """In a cluster, ``ShardElsewhere`` for a shard whose log this node does not hold
        (before anything is appended, so the front end may pass the request on)."""
        if self.holds_shard is not None and not self.holds_shard(project, logstore, shard.shard_id):
            raise ShardElsewhere(shard.shard_id, logstore)

    def put_logs(
        self,
        project: str,
        logstore: str,
        target: str,
        hash_key: str | None,
        body: bytes,
        compress_type: str | None,
        raw_size: int | None,
    ) -> int:
        """Validates one LogGroup body and appends it durably to the shard `target` names
        (see ``pick_shard``); returns its sequence number.

        A routed or load-balanced write that meets a shard sealed by a split or merge in
        progress waits for that change to commit and routes again, so it lands in the child:
        for any key, writes before the change are in the parent and later ones in a child.
        Blocking (decompression, parse, fsync wait): call from a storage thread.
        """
        self.metadata.get_logstore(project, logstore)  # a missing logstore first: LogStoreNotExist
        raw, log_count = self.body_checker.checked_raw(compress_type, body, raw_size)
        payload = stored_entry(compress_type, body, raw)
        for _attempt in range(_REROUTES_MAX):
            shard = self.pick_shard(project, logstore, target, hash_key)
            self._check_held(project, logstore, shard)
            store = self.metadata.get_logstore(project, logstore)
            self.quotas.admit_write(
                (project, logstore, shard.shard_id), self.shard_quota(store), len(raw)
            )
            key = (project, logstore, shard.shard_id)
            token = None if self.replication is None else self.replication.check_writable(key)
            try:
                sequence = self._open_log(store, shard).append(payload, self.clock.wall_ms())
                if self.replication is not None:
                    self.replication.committed_blocking(key, sequence + 1)
            except LogSealedError as exc:
                if target not in ("lb", "route"):
                    raise ShardReadOnly(f"shard {shard.shard_id} is readonly") from exc
                self.metadata.wait_for_writes()
                continue
            finally:
                if self.replication is not None:
                    self.replication.write_done(token)
            self.autosplit.record(project, logstore, shard.shard_id, len(raw))
            self.metrics.count_ingest(project, logstore, shard.shard_id, log_count, len(raw))
            return sequence
        raise ShardReadOnly(f"logstore {logstore} kept resharding; try again")

    async def put_logs_async(
        self,
        project: str,
        logstore: str,
        target: str,
        hash_key: str | None,
        body: bytes,
        compress_type: str | None,
        raw_size: int | None,
        offload: Offload,
        write: WriteId | None = None,
    ) -> int:
        """``put_logs`` for a caller on the event loop, with the same checks, errors and
        split/merge behaviour, at a fraction of the cost for small bodies: a body of up to
        ``loop_body_bytes_max`` (compressed and declared raw) is checked on the loop, where
        the check costs less than a thread hand-off; a larger one by ``offload`` (a thread:
        decompression releases the GIL, and the loop must not stall on megabytes). The
        record then joins the commit queue's next round (``commit.py``): one write and one
        fdatasync per shard for every append that arrived meanwhile, and one wake-up of the
        loop for all of them. A write that names a producer (``write``) and is already in
        the shard is answered as stored, not appended again (``idempotence.py``)."""
        self.metadata.get_logstore(project, logstore)  # a missing logstore first: LogStoreNotExist
        if len(body) <= loop_body_bytes_max and (raw_size or 0) <= loop_body_bytes_max:
            raw, log_count = self.body_checker.checked_raw(compress_type, body, raw_size)
        else:
            raw, log_count = await offload(
                self.body_checker.checked_raw, compress_type, body, raw_size
            )
        if write is None:
            payload = stored_entry(compress_type, body, raw)
        else:  # the mark changes the group: it is stored framed
            payload = frame_log_group(marked(raw, write))
        commits = self._commit_queue()
        for _attempt in range(_REROUTES_MAX):
            # lb: every write of one commit round to the same shard, the next round to the
            # next one, so that a round of lb writes costs one fdatasync, not one per shard
            shard = self.pick_shard(project, logstore, target, hash_key, commits.rounds)
            self._check_held(project, logstore, shard)
            store = self.metadata.get_logstore(project, logstore)
            self.quotas.admit_write(
                (project, logstore, shard.shard_id), self.shard_quota(store), len(raw)
            )
            shard_log = self._open_log(store, shard)
            shard_log.check_payload_size(len(payload))
            key = (project, logstore, shard.shard_id)
            token = None if self.replication is None else self.replication.check_writable(key)
            try:
                producers = None
                if write is not None:
                    producers = await self.idempotent.producers(
                        (store.storage_key, shard.shard_id), shard_log, offload
                    )
                    stored = producers.find(write)
                    if stored is not None:
                        # a retry of a write this shard holds (or is appending): the first
                        # attempt's answer, once its replicas hold it
                        end = stored if isinstance(stored, int) else await asyncio.shield(stored)
                        if self.replication is not None:
                            await self.replication.committed(key, end)
                        return end - 1
                    appending: asyncio.Future[int] = asyncio.get_running_loop().create_future()
                    producers.note(write, appending)
                try:
                    sequence = await commits.append(shard_log, payload, self.clock.wall_ms())
                except BaseException as exc:
                    if producers is not None and write is not None:
                        producers.forget(write)
                        appending.set_exception(
                            exc
                            if isinstance(exc, Exception)
                            else ServerBusy("the first attempt of this write was cut short; retry")
                        )
                        appending.exception()  # retrieved: a retry that waited re-raises it
                    if isinstance(exc, LogSealedError):
                        if target not in ("lb", "route"):
                            raise ShardReadOnly(f"shard {shard.shard_id} is readonly") from exc
                        await offload(self.metadata.wait_for_writes)
                        continue
                    raise
                if producers is not None and write is not None:
                    producers.note(write, sequence + 1)
                    appending.set_result(sequence + 1)
                if self.replication is not None:
                    await self.replication.committed(key, sequence + 1)
            finally:
                if self.replication is not None:
                    self.replication.write_done(token)
            self.autosplit.record(project, logstore, shard.shard_id, len(raw))
            self.metrics.count_ingest(project, logstore, shard.shard_id, log_count, len(raw))
            balance = self._lb.get((project, logstore))
            if target == "lb" and balance is not None:
                balance.bytes_by_shard[shard.shard_id] += len(raw)
            return sequence
        raise ShardReadOnly(f"logstore {logstore} kept resharding; try again")

    def _lb_shard(self, project: str, logstore: str, writable: list[Shard], round_: int) -> Shard:
        """The shard for `lb` writes in commit round ``round_``: the one chosen by the
        round's first `lb` write, which took the writable shard that has received the fewest
        `lb` bytes so far. So a round of load-balanced writes costs one fdatasync, and the
        shards stay even however rounds vary in size (taking them in turn per round would
        not: rounds often alternate large and small). Called on the event loop only."""
        key = (project, logstore)
        balance = self._lb.get(key)
        if balance is None:
            balance = self._lb[key] = _LbBalance(-1, -1, collections.Counter())
        if balance.round == round_:
            for shard in writable:
                if shard.shard_id == balance.shard_id:
                    return shard
        chosen = min(writable, key=lambda s: balance.bytes_by_shard[s.shard_id])
        balance.round, balance.shard_id = round_, chosen.shard_id
        return chosen

    def _commit_queue(self) -> CommitQueue:
        """The commit queue of the running loop (made on first use: the loop exists only
        once the server runs)."""
        loop = asyncio.get_running_loop()
        queue = self._commits
        if queue is None or queue.loop is not loop:
            with self._commits_lock:
                if self._closed.is_set():
                    raise StorageClosedError("the server is shutting down")
                queue = self._commits
                if queue is None or queue.loop is not loop:
                    if queue is not None:
                        queue.close()
                    queue = self._commits = CommitQueue(loop)
        return queue

    def get_cursor(self, project: str, logstore: str, shard_id: int, position: str) -> str:
        shard_log = self.shard_log(project, logstore, shard_id)
        if position == "begin":
            return encode_cursor(shard_log.begin_seq)
        if position == "end":
            return encode_cursor(shard_log.high_watermark_seq)
        time_s = parse_decimal(
            position, "from (begin, end or unix seconds)", ParameterInvalid, fraction=True
        )
        if time_s < 0 or time_s > 2**40:
            raise ParameterInvalid(f"from time {time_s} is out of range")
        return encode_cursor(shard_log.seq_for_time(time_s * 1000))

    def get_cursor_time(self, project: str, logstore: str, shard_id: int, cursor: str) -> int:
        shard_log = self.shard_log(project, logstore, shard_id)
        try:
            return shard_log.receive_time_ms(decode_cursor(cursor)) // 1000
        except RecordsLostError as exc:
            raise _with_cursors(exc, logstore, shard_id) from exc

    def pull_logs(
        self,
        project: str,
        logstore: str,
        shard_id: int,
        cursor: str,
        count: int,
        end_cursor: str | None,
        accept_compress: str,
        bytes_max: int | None = None,
    ) -> PullResult:
        """Reads stored groups and makes the reply (kept lz4 blocks joined, see
        ``loghub.wire.stored``). Blocking: call from a storage thread.
        ``bytes_max`` (LogHub's own, optional) lowers the reply's raw-byte limit below
        ``Limits.pull_bytes_max``; the first group is returned whatever its size."""
        limits = self.config.limits
        if not 1 <= count <= limits.pull_groups_max:
            raise ParameterInvalid(f"count must be 1..{limits.pull_groups_max}, not {count}")
        if bytes_max is not None and bytes_max < 1:
            raise ParameterInvalid(f"{PULL_BYTES_MAX_PARAM} must be positive, not {bytes_max}")
        bytes_max = min(limits.pull_bytes_max, bytes_max or limits.pull_bytes_max)
        store = self.metadata.get_logstore(project, logstore)
        shard_log = self._open_log(store, self.metadata.get_shard(project, logstore, shard_id))
        start = decode_cursor(cursor)
        end = None if end_cursor is None else decode_cursor(end_cursor)
        if end is not None and end < start:
            raise InvalidCursor(f"end_cursor {end_cursor} is before cursor {cursor}")
        quota, quota_key = self.shard_quota(store), (project, logstore, shard_id)
        self.quotas.admit_read(quota_key, quota)
        # the stored entries, packed together in one reused buffer, make the reply: framed
        # ones are LogGroupList entries as they are, kept lz4 blocks are joined or expanded
        buffer = self.read_buffers.take()
        try:
            try:
                batch = shard_log.read_into(buffer, start, count, bytes_max, end)
            except RecordsLostError as exc:
                raise _with_cursors(exc, logstore, shard_id) from exc
            body = b""
            if batch.size_bytes:
                with memoryview(buffer) as view, view[: batch.size_bytes] as data:
                    body = reply_body(accept_compress, data, batch.raw_bytes)
        finally:
            self.read_buffers.give_back(buffer)
        self.quotas.charge_read(quota_key, quota, batch.raw_bytes)
        self.metrics.count_pull(project, logstore, shard_id, batch.count, batch.raw_bytes)
        tail = None
        if not batch.count and end is None and not shard_log.sealed:
            tail = ShardTail(shard_log, batch.next_seq)
        return PullResult(
            body=body,
            compress_type=accept_compress if batch.size_bytes else "",
            raw_size=batch.raw_bytes,
            count=batch.count,
            next_cursor=encode_cursor(batch.next_seq),
            bytes_max=bytes_max,
            tail=tail,
        )

    def shard_quota(self, store: Logstore) -> ShardQuota:
        """The server-wide quota with the logstore's own overrides (its JSON quota keys)."""
        default = self.config.shard_quota
        if not store.extra:
            return default
        rates = {
            attribute: int(store.extra.get(key, getattr(default, attribute)))
            for key, attribute in _QUOTA_KEYS.items()
        }
        return ShardQuota(**rates)

    # -- status, for the metrics and the console (read-only) ---------------------------------

    def logstores(self) -> list[tuple[str, Logstore]]:
        """Every logstore with its project; one deleted while this runs is left out."""
        found: list[tuple[str, Logstore]] = []
        for project in self.metadata.list_projects(0, 1_000_000)[0]:
            for name in self.metadata.list_logstores(project.name, 0, 1_000_000)[0]:
                try:
                    found.append((project.name, self.metadata.get_logstore(project.name, name)))
                except NotFoundError:
                    continue
        return found

    def shard_statistics(self, store: Logstore, shard: Shard) -> ShardLogStatistics:
        return self._open_log(store, shard).statistics()

    def logstore_disk(self) -> list[LogstoreDisk]:
        disk = []
        for project, store in self.logstores():
            try:
                shards = self.metadata.list_shards(project, store.name)
                size = sum(self.shard_statistics(store, s).size_bytes for s in shards)
            except NotFoundError:
                continue
            disk.append(LogstoreDisk(project, store.name, size))
        return disk

    def group_lags(self) -> list[GroupShardLag]:
        lags = []
        for project, store in self.logstores():
            try:
                for group in self.groups.list_groups(project, store.name):
                    name = str(group["name"])
                    for status in self.groups.shard_status(project, store.name, name):
                        lags.append(
                            GroupShardLag(
                                project,
                                store.name,
                                name,
                                status.shard_id,
                                status.lag_log_groups,
                                status.lag_s,
                            )
                        )
            except NotFoundError:
                continue
        return lags

    def disk_free_bytes(self) -> int:
        return shutil.disk_usage(self.config.data_dir).free

    def apply_retention(self) -> int:
        """Deletes expired segments of every logstore; returns how many went."""
        deleted = 0
        now_ms = self.clock.wall_ms()
        projects, _ = self.metadata.list_projects(0, 1_000_000)
        for project in projects:
            names, _ = self.metadata.list_logstores(project.name, 0, 1_000_000)
            for name in names:
                store = self.metadata.get_logstore(project.name, name)
                shard_ids = [s.shard_id for s in self.metadata.list_shards(project.name, name)]
                deleted += self.storage.apply_retention(
                    store.storage_key, shard_ids, now_ms, store.ttl_days * _DAY_MS
                )
        return deleted

    # -- for front ends other than REST (the Kafka listener) ---------------------------------
    # Protocol-neutral reads and writes, so that a front end needs nothing below this class.

    def list_shards(self, project: str, logstore: str) -> list[Shard]:
        """Every shard of the logstore, read-only ones included, by id. Ids are dense and
        append-only: 0..n-1 at creation, children continue after the largest id ever given."""
        return self.metadata.list_shards(project, logstore)

    def get_logstore(self, project: str, logstore: str) -> Logstore:
        return self.metadata.get_logstore(project, logstore)

    def append_log_group(
        self, project: str, logstore: str, shard_id: int, raw: bytes
    ) -> int | None:
        """Appends one serialized LogGroup to the shard, or, when the shard has turned
        read-only (split or merge), to a writable shard of the logstore; returns its sequence
        number in ``shard_id``, or None when it went elsewhere. Durable under the server's
        fsync policy, as PutLogs. Blocking: call from a thread."""
        shard = self.metadata.get_shard(project, logstore, shard_id)
        if _writable(shard):
            try:
                return self.put_logs(project, logstore, str(shard_id), None, raw, None, len(raw))
            except ShardReadOnly:
                pass  # sealed since it was looked at
        self.put_logs(project, logstore, "lb", None, raw, None, len(raw))
        return None

    def shard_range(self, project: str, logstore: str, shard_id: int) -> tuple[int, int]:
        """The retained sequences ``[begin, end)`` of a shard that consumers may read (its
        end is the high watermark)."""
        shard_log = self.shard_log(project, logstore, shard_id)
        return shard_log.begin_seq, shard_log.high_watermark_seq

    def seq_for_time(self, project: str, logstore: str, shard_id: int, time_ms: int) -> int:
        """The first sequence received at or after ``time_ms`` (the time index)."""
        return self.shard_log(project, logstore, shard_id).seq_for_time(time_ms)

    def read_log_groups(
        self, project: str, logstore: str, shard_id: int, start_seq: int, count: int, bytes_max: int
    ) -> list[bytes]:
        """Serialized LogGroups from ``start_seq`` on (consecutive sequences), at most
        ``count`` and about ``bytes_max`` bytes, at least one when any is there. Blocking."""
        store = self.metadata.get_logstore(project, logstore)
        shard_log = self._open_log(store, self.metadata.get_shard(project, logstore, shard_id))
        quota, quota_key = self.shard_quota(store), (project, logstore, shard_id)
        self.quotas.admit_read(quota_key, quota)
        try:
            batch = shard_log.read(start_seq, count, bytes_max)
        except RecordsLostError as exc:
            raise _with_cursors(exc, logstore, shard_id) from exc
        self.quotas.charge_read(quota_key, quota, batch.raw_bytes)
        self.metrics.count_pull(project, logstore, shard_id, batch.count, batch.raw_bytes)
        return split_log_group_list(expand(batch.data, batch.raw_bytes))

    def checkpoints(self, project: str, logstore: str, group: str) -> Mapping[int, Checkpoint]:
        """The group's checkpoints by shard; none when the group does not exist."""
        catalog = self.metadata.consumer_groups(project, logstore)
        try:
            return catalog.checkpoints(project, logstore, group)
        except ConsumerGroupNotExist:
            return {}

    def save_checkpoint(
        self, project: str, logstore: str, group: str, shard_id: int, cursor: str, consumer: str
    ) -> None:
        """Stores a checkpoint durably, creating the consumer group (unordered, with the
        default timeout) when it does not exist yet."""
        catalog = self.metadata.consumer_groups(project, logstore)
        self.metadata.get_shard(project, logstore, shard_id)
        try:
            catalog.get(project, logstore, group)
        except ConsumerGroupNotExist:
            with contextlib.suppress(ConsumerGroupAlreadyExist):
                catalog.create(project, logstore, ConsumerGroupDef(group, 60, False))
        checkpoint = Checkpoint(shard_id, cursor, consumer, self.clock.wall_ms() * 1000)
        catalog.save_checkpoint(project, logstore, group, checkpoint)

    # -- the cluster's view of this node's logs (``loghub.cluster.node.LocalLogs``) ----------

    def unseal_log(self, project: str, logstore: str, shard_id: int) -> None:
        """Undoes ``seal_log`` when the change that sealed it was not committed."""
        store = self.metadata.get_logstore(project, logstore)
        self.storage.shard(store.storage_key, shard_id).unseal()

    def drop_deleted_logs(self) -> list[str]:
        """Removes this node's data of logstores deleted anywhere in the cluster (the node
        that took the delete removed its own at once); returns their storage keys. Only
        keys the cluster recorded as deleted are touched, never a directory merely unknown
        to the metadata: a node pointed at the wrong etcd must not wipe its disk."""
        from loghub.cluster.etcd_metadata import EtcdMetadataStore  # cluster mode only

        if not isinstance(self.metadata, EtcdMetadataStore):
            return []
        deleted = self.metadata.deleted_storage_keys()
        dropped = [key for key in self.storage.logstore_keys() if key in deleted]
        for key in dropped:
            self.storage.drop_logstore(key)
            log.info("removed the data of deleted logstore %s", key)
        return dropped

    def replica_log(self, project: str, logstore: str, shard_id: int) -> ShardLog:
        """This node's replica of a shard, as replication leads or follows it: opened, and
        never sealed here (a follower of a read-only shard still copies its tail)."""
        store = self.metadata.get_logstore(project, logstore)
        return self.storage.shard(store.storage_key, shard_id)

    def drop_replica_log(self, project: str, logstore: str, shard_id: int) -> bool:
        """Deletes this node's copy of a shard it no longer replicates (a reassignment that
        moved the shard to other nodes has ended); False when it had none."""
        try:
            store = self.metadata.get_logstore(project, logstore)
        except LogStoreNotExist:
            return False  # a deleted logstore's data goes with drop_deleted_logs
        return self.storage.drop_shard(store.storage_key, shard_id)

    def seal_log(self, project: str, logstore: str, shard_id: int) -> int:
        """Seals this node's log of a shard for good (a hand-over, or a shard succeeded
        while this node was away); returns its end."""
        return self.replica_log(project, logstore, shard_id).seal()


class ReplicationGate(Protocol):
    """A replicated shard's leader (``loghub.cluster.replication.ReplicaManager``)."""

    def check_writable(self, key: tuple[str, str, int]) -> object | None:
        """NotEnoughReplicasError while the ISR is too small to acknowledge a write; else a
        token for ``write_done``, called once the write is answered."""
        ...

    def write_done(self, token: object | None) -> None: ...

    async def committed(self, key: tuple[str, str, int], end_seq: int) -> None:
        """Returns once the ISR holds the records before ``end_seq``."""
        ...

    def committed_blocking(self, key: tuple[str, str, int], end_seq: int) -> None:
        """``committed`` for a caller on a thread."""
        ...


class RemoteLogs(Protocol):
    """Shard logs on other nodes of a cluster (blocking calls, from a storage thread)."""

    def is_local(self, project: str, logstore: str, shard_id: int) -> bool: ...

    def seal(self, project: str, logstore: str, shard_id: int) -> int: ...

    def unseal(self, project: str, logstore: str, shard_id: int) -> None: ...


class _Sealer:
    """Seals shard logs of one logstore for the metadata store's split and merge: here, or
    on the node that holds the log."""

    def __init__(self, service: LogHubService, store: Logstore) -> None:
        self._service = service
        self._store = store

    def _remote(self, shard_id: int) -> RemoteLogs | None:
        remote = self._service.remote_logs
        if remote is None or remote.is_local(self._store.project, self._store.name, shard_id):
            return None
        return remote

    def seal(self, shard_id: int) -> int:
        remote = self._remote(shard_id)
        if remote is not None:
            return remote.seal(self._store.project, self._store.name, shard_id)
        shard_log = self._service.storage.shard(self._store.storage_key, shard_id)
        end_seq = shard_log.seal()
        self._service.tail_waits.notify(shard_log)  # pulls parked at its end stop waiting
        return end_seq

    def unseal(self, shard_id: int) -> None:
        remote = self._remote(shard_id)
        if remote is not None:
            remote.unseal(self._store.project, self._store.name, shard_id)
            return
        self._service.storage.shard(self._store.storage_key, shard_id).unseal()


def _with_cursors(error: RecordsLostError, logstore: str, shard_id: int) -> DataCorrupted:
    """The storage's RecordsLostError told in cursors, the reader's unit, with the cursor to
    resume from (a consumer may checkpoint it to move past the damage)."""
    lost = error.end_seq - error.first_seq
    return DataCorrupted(
        f"{lost} log groups from cursor {encode_cursor(error.first_seq)} of shard {shard_id} "
        f"of logstore {logstore} were lost to damage on the server's disk; reading can "
        f"resume at cursor {encode_cursor(error.end_seq)}",
        first_seq=error.first_seq,
        end_seq=error.end_seq,
    )


def _writable(shard: Shard) -> bool:
    return shard.status == "readwrite"


def parse_shard_id(text: str) -> int:
    """A shard id from a path: ASCII digits only (``str.isdigit`` would let ``²`` through
    to ``int``, and ``int`` reads ``٣`` as 3)."""
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise ShardNotExist(f"shard {text[:40]!r} does not exist")
    return int(text)


def _as_int(value: Any, key: str) -> int:
    # the range is validate_spec's to check; this bound only keeps the number a number
    return json_int(value, key, LogStoreInfoInvalid, low=-(2**63), high=2**63 - 1)


def _as_bool(value: Any, key: str) -> bool:
    return json_bool(value, key, LogStoreInfoInvalid)


def _as_str(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise LogStoreInfoInvalid(f"{key} must be a string")
    return value


# JSON key -> (spec field, converter). Keys not listed here are kept as `extra` when they are
# known SDK fields, and ignored otherwise (the reference asks servers to ignore unknown keys).
_LOGSTORE_FIELDS: dict[str, tuple[str, Any]] = {
    "ttl": ("ttl_days", _as_int),
    "autoSplit": ("auto_split", _as_bool),
    "maxSplitShard": ("max_split_shard", _as_int),
    "appendMeta": ("append_meta", _as_bool),
    "enable_tracking": ("enable_tracking", _as_bool),
    "telemetryType": ("telemetry_type", _as_str),
    "mode": ("mode", _as_str),
}
_EXTRA_KEYS = ("enableModify", "hot_ttl", "encrypt_conf", "infrequentAccessTTL")
# LogHub's own keys (the hosted service has no such keys; the official SDK ignores them in
# get_logstore): a logstore's per-shard quotas, overriding the server's; 0 means none.
_QUOTA_KEYS: dict[str, str] = {
    "shardWriteQuotaBytesPerSecond": "write_bytes_per_s",
    "shardWriteQuotaRequestsPerSecond": "write_requests_per_s",
    "shardReadQuotaBytesPerSecond": "read_bytes_per_s",
}


def _quota_rate(value: Any, key: str) -> int:
    """A rate in 0..rate_per_s_max: a JSON integer, an integral float (``1048576.0``) or a
    string of ASCII digits (see ``json_int``)."""
    return json_int(value, key, LogStoreInfoInvalid, low=0, high=rate_per_s_max)


def logstore_changes_from_json(body: Mapping[str, Any]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for key, (attribute, convert) in _LOGSTORE_FIELDS.items():
        if key in body and body[key] is not None:
            changes[attribute] = convert(body[key], key)
    extra = {key: body[key] for key in _EXTRA_KEYS if key in body}
    extra.update(
        {key: _quota_rate(body[key], key) for key in _QUOTA_KEYS if body.get(key) is not None}
    )
    if extra:
        changes["extra"] = extra
    return changes


def logstore_spec_from_json(body: Mapping[str, Any]) -> LogstoreSpec:
    name = body.get("logstoreName")
    if not isinstance(name, str):
        raise LogStoreInfoInvalid("logstoreName is required")
    changes = logstore_changes_from_json(body)
    if "shardCount" in body:
        changes["shard_count"] = _as_int(body["shardCount"], "shardCount")
    return LogstoreSpec(name=name, **changes)
