"""EtcdMetadataStore: the metadata store of a cluster, kept in etcd and served from memory.

It has the public interface and the semantics of ``loghub.metadata.MetadataStore`` (projects,
logstores, shards with their hash ranges and lineage, split and merge with a ``ShardSealer``,
consumer groups and their checkpoints), so that every node of a cluster sees one catalogue.

Key layout (``prefix`` is ``/loghub/meta/`` unless told otherwise; names cannot hold ``/``):

    {prefix}projects/{project}                              {"description", "created_at_s",
                                                             "modified_at_s", "w"}
    {prefix}logstores/{project}/{logstore}                  {"logstore": {settings, times,
                                                             storage_key}, "shards": [...], "w"}
    {prefix}groups/{project}/{logstore}/{group}             {"timeout_s", "ordered", "w"}
    {prefix}checkpoints/{project}/{logstore}/{group}/{shard} {"cursor", "consumer",
                                                             "update_time_us", "w"}
    {prefix}deleted/{storage_key}                           {"deleted_at_s", "w"}: a deleted
                                                             logstore whose data every node
                                                             removes from its own disk
    {prefix}deleted/{project}/.project-{8 hex}              {"deleted_at_s", "storage_keys",
                                                             "w"}: a deleted project's
    {prefix}sync                                            written to learn "now" (below)

A logstore is one key holding all its shards (``[id, status, begin_hex, end_hex, created_s,
closed_s, parents, children, end_seq]`` each), so that a split or merge is one
compare-and-swap on one key and lineage can never be half-written: at the limit of 4,096
shard ids that is about 0.5 MB, under etcd's 1.5 MiB request limit (a larger value is refused
with ParameterInvalid before it is sent). Checkpoints are one key each, written often and
alone. "w" is a random token in every value, so a write whose reply was lost can be
recognised as ours when read back (``EtcdStore.transact``).

Every change is a compare-and-swap: the transaction's conditions name the revision of every
record the change was decided on (``mod_revision`` of the logstore for a split, "absent"
(0) for a create, the parent's ``create_revision`` so that a child never lands in a deleted
and re-created parent, "nothing under this prefix changed since the revision the decision
was made at" for a project's logstores or a logstore's group count). A change is first
decided on the cache; if a condition fails, or the cache says no (e.g. "already exists"),
the store brings its cache up to etcd's present (it writes ``{prefix}sync`` and waits until
its watch has delivered that revision) and decides again, so an error is only ever raised
from a cache as new as etcd. Deletes cascade by prefix: one operation whatever the number
of checkpoints, so no change needs more than a handful of etcd's 128 operations a
transaction.

Cache: every record is loaded on open and kept current by a watch on the prefix; readers
take no lock and see dictionaries that are replaced, never changed in place. The watch is
the only writer of the cache: a write returns once the watch has applied its revision, so
the node that made a change reads it at once, and every other node within the watch's delay
(milliseconds on a LAN). When the watch breaks (member down, revision compacted), the store
reads the prefix again and watches from the revision of that read.

Threads: the etcd client runs on a private event loop in a daemon thread owned by the store;
the store's methods are called from any other thread and wait for that loop
(``run_coroutine_threadsafe``). Writes made through one store are serialised by its write
lock (as in ``MetadataStore``: a writer that met a sealed shard waits for the split with
``wait_for_writes``); writes from different nodes are serialised by etcd.

Crash: a write either committed in etcd (every node sees it) or did not happen. A seal is
made before the commit; if the commit is refused or fails, the seal is undone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, fields, replace
from typing import Any, Generic, TypeVar, cast

from loghub._clock import Clock
from loghub.cluster.etcd_store import (
    Compare,
    Delete,
    Entry,
    EtcdStore,
    Fence,
    Put,
    end_if_cancelled,
)
from loghub.cluster.group_coordinators import ASSIGNMENTS_PREFIX
from loghub.errors import (
    ConsumerGroupAlreadyExist,
    ConsumerGroupNotExist,
    ControlPlaneError,
    FencedError,
    LogHubError,
    LogStoreAlreadyExist,
    NotFoundError,
    ParameterInvalid,
    ProjectAlreadyExist,
    ProjectNotExist,
)
from loghub.metadata import Checkpoint, ConsumerGroupDef, Logstore, LogstoreSpec, Project, Shard
from loghub.metadata._logstores import (
    CachedLogstore,
    ShardSealer,
    check_updatable,
    close_parents,
    missing_logstore,
    page,
    plan_merge,
    plan_split,
    plan_succession,
    reshard,
    seal,
    spec_of,
    spec_values,
    unseal,
)
from loghub.metadata._validate import validate_description, validate_project_name, validate_spec
from loghub.metadata.groups import (
    consumer_groups_per_logstore_max,
    group_count,
    validate_checkpoint,
    validate_group,
)
from loghub.metadata.hashing import even_ranges
from loghub.metadata.models import ShardStatus

__all__ = [
    "DEFAULT_PREFIX",
    "EtcdConsumerGroupCatalog",
    "EtcdMetadataStore",
    "conflict_retries_max",
    "value_bytes_max",
]

log = logging.getLogger("loghub.cluster")

# how long a node that starts waits for etcd to answer its first read before it gives up:
# longer than one call's retry budget, so that a node started while etcd elects a leader,
# restarts a member or is slow under load comes up a few seconds late instead of exiting
# (Kafka's broker waits zookeeper.connection.timeout.ms, 18 s, for its control plane)
STARTUP_WAIT_S = 30.0

DEFAULT_PREFIX = "/loghub/meta/"
# etcd refuses a request over 1.5 MiB (--max-request-bytes); a record stays well below.
value_bytes_max = 1024 * 1024
# A change that keeps meeting newer revisions (other nodes writing the same record) gives up.
conflict_retries_max = 32
# How long a write waits for the watch to deliver its own revision before re-reading.
_watch_catch_up_s = 2.0

# How long closing waits for the client to close, then for its tasks to end.
_close_step_s = 2.0

_T = TypeVar("_T")
GroupKey = tuple[str, str, str]


@dataclass(frozen=True)
class _Versioned(Generic[_T]):
    """A cached record with the revisions a compare-and-swap on it names."""

    value: _T
    create_revision: int
    mod_revision: int


@dataclass
class _Change(Generic[_T]):
    """One decided change: etcd's conditions and operations, what the caller gets back, and
    what to undo if etcd refuses it."""

    compare: list[Compare]
    ops: list[Put | Delete]
    result: _T
    undo: Callable[[], None] = field(default=lambda: None)
    # called when etcd refused the change, to raise what a retry cannot fix (a lost fence)
    refused: Callable[[], None] = field(default=lambda: None)


# The sections of the key layout, each cached in the store's attribute of the same name.
# the name of a "deleted" mark that lists the logstores of a deleted project (no logstore
# name starts with a dot)
_PROJECT_MARK = ".project-"

_SECTIONS = ("projects", "logstores", "groups", "checkpoints", "deleted")


class EtcdMetadataStore:
    """Projects, logstores, shards and consumer groups in etcd; see the module docstring."""

    def __init__(
        self,
        url: str,
        clock: Clock,
        prefix: str = DEFAULT_PREFIX,
        call_timeout_s: float = 2.0,
        retry_budget_s: float = 6.0,
        startup_wait_s: float = STARTUP_WAIT_S,
    ) -> None:
        """Use ``EtcdMetadataStore.open``; this connects and loads everything, waiting up
        to ``startup_wait_s`` for etcd to answer (see STARTUP_WAIT_S)."""
        assert prefix.endswith("/"), prefix
        self._clock = clock
        self._prefix = prefix
        self._wait_s = retry_budget_s + 2 * call_timeout_s + _watch_catch_up_s
        self._write_lock = threading.Lock()
        self._projects: dict[str, _Versioned[Project]] = {}
        self._logstores: dict[tuple[str, str], _Versioned[CachedLogstore]] = {}
        self._groups: dict[GroupKey, _Versioned[ConsumerGroupDef]] = {}
        self._checkpoints: dict[GroupKey, dict[int, Checkpoint]] = {}
        self._deleted: dict[str, int] = {}  # storage key -> deleted at (s)
        self._applied_revision = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="loghub-etcd-metadata", daemon=True
        )
        self._thread.start()
        self._etcd = EtcdStore(url, call_timeout_s, retry_budget_s)
        self._watcher: Future[None] | None = None
        try:
            self._call(self._etcd.__aenter__())
            deadline = time.monotonic() + startup_wait_s
            while True:
                try:
                    self._call(self._reload())
                    break
                except ControlPlaneError as exc:
                    if time.monotonic() >= deadline:
                        raise
                    log.warning("etcd at %s did not answer the first read (%s); trying again "
                                "for up to %.0f s", url, exc, startup_wait_s)  # fmt: skip
                    time.sleep(0.5)
        except BaseException:
            self.close()
            raise
        self._watcher = asyncio.run_coroutine_threadsafe(self._watch_forever(), self._loop)
        self._catalog = EtcdConsumerGroupCatalog(self)

    @classmethod
    def open(cls, url: str, clock: Clock, prefix: str = DEFAULT_PREFIX) -> EtcdMetadataStore:
        """Connect to the etcd cluster at ``url`` (``etcd://h1:2379,h2:2379,...``)."""
        return cls(url, clock, prefix)

    def close(self) -> None:
        """Stops the watch, the etcd client and the loop; a second call does nothing."""
        if not self._thread.is_alive():
            return
        try:
            self._call(self._shutdown())
        finally:
            self._stop_loop()

    # -- projects ---------------------------------------------------------------------------

    def create_project(self, name: str, description: str = "") -> Project:
        validate_project_name(name)
        validate_description(description)

        def plan() -> _Change[Project]:
            if name in self._projects:
                raise ProjectAlreadyExist(f"project {name} already exists")
            now_s = self._now_s()
            project = Project(name, description, now_s, now_s)
            key = self._key("projects", name)
            put = Put(key, _encode(_project_value(project)))
            return _Change([Compare(key, "create", "==", 0)], [put], project)

        return self._write(plan)

    def get_project(self, name: str) -> Project:
        return self._fresh(lambda: self._project(name).value)

    def list_projects(
        self, offset: int = 0, size: int = 500, name_contains: str = ""
    ) -> tuple[list[Project], int]:
        """A page of projects by name, and how many match in all."""
        projects = self._projects
        names = sorted(n for n in projects if name_contains in n)
        return [projects[n].value for n in page(names, offset, size)], len(names)

    def delete_project(self, name: str) -> list[Logstore]:
        """Delete a project with its logstores, shards, groups and checkpoints. Returns the
        logstores deleted, so the caller can remove their data after this commit."""

        def plan() -> _Change[list[Logstore]]:
            revision = self._applied_revision  # first: the records read below are as new
            project = self._project(name)
            gone = [v.value.logstore for k, v in sorted(self._logstores.items()) if k[0] == name]
            key = self._key("projects", name)
            logstores = self._key("logstores", name, "")
            compare = [
                Compare(key, "mod", "==", project.mod_revision),
                Compare(logstores, "mod", "<", revision + 1, prefix=True),
            ]
            ops: list[Put | Delete] = [
                Delete(key),
                Delete(logstores, prefix=True),
                Delete(self._key("groups", name, ""), prefix=True),
                Delete(self._key("checkpoints", name, ""), prefix=True),
                Delete(f"{ASSIGNMENTS_PREFIX}{name}/", prefix=True),
                *self._tombstones(name, gone),
            ]
            return _Change(compare, ops, gone)

        return self._write(plan)

    # -- logstores --------------------------------------------------------------------------

    def create_logstore(self, project: str, spec: LogstoreSpec) -> Logstore:
        """Create a logstore with ``spec.shard_count`` read-write shards, ids 0..n-1, that
        split the key space evenly."""
        validate_spec(spec)

        def plan() -> _Change[Logstore]:
            owner = self._project(project)
            if (project, spec.name) in self._logstores:
                raise LogStoreAlreadyExist(f"logstore {spec.name} already exists")
            now_s = self._now_s()
            logstore = Logstore(
                project=project,
                **spec_values(spec),
                created_at_s=now_s,
                modified_at_s=now_s,
                storage_key=f"{project}/{spec.name}-{secrets.token_hex(4)}",
            )
            shards = [
                Shard(shard_id, "readwrite", begin, end, now_s)
                for shard_id, (begin, end) in enumerate(even_ranges(spec.shard_count))
            ]
            entry = CachedLogstore.build(logstore, shards)
            key = self._key("logstores", project, spec.name)
            compare = [
                Compare(self._key("projects", project), "create", "==", owner.create_revision),
                Compare(key, "create", "==", 0),
            ]
            return _Change(compare, [Put(key, _encode(_logstore_value(entry)))], entry.logstore)

        return self._write(plan)

    def get_logstore(self, project: str, name: str) -> Logstore:
        return self._fresh(lambda: self._entry(project, name).logstore)

    def list_logstores(
        self, project: str, offset: int = 0, size: int = 500, name_contains: str = ""
    ) -> tuple[list[str], int]:
        """A page of logstore names, sorted, and how many match in all."""
        self.get_project(project)
        names = sorted(n for p, n in self._logstores if p == project and name_contains in n)
        return page(names, offset, size), len(names)

    def update_logstore(self, project: str, name: str, changes: Mapping[str, Any]) -> Logstore:
        """Change the fields named in ``changes`` (``LogstoreSpec`` field names, except
        ``name`` and ``shard_count``: the shard count changes only by split and merge)."""
        check_updatable(changes)

        def plan() -> _Change[Logstore]:
            cached = self._versioned_entry(project, name)
            old = cached.value.logstore
            spec = replace(spec_of(old), **changes)
            validate_spec(spec)
            new = replace(old, **spec_values(spec), modified_at_s=self._now_s())
            entry = CachedLogstore.build(new, cached.value.shards)
            return self._logstore_swap(cached, entry, entry.logstore)

        return self._write(plan)

    def delete_logstore(self, project: str, name: str) -> Logstore:
        """Delete a logstore, its shards, groups and checkpoints; returns it so the caller
        can remove its data."""

        def plan() -> _Change[Logstore]:
            cached = self._versioned_entry(project, name)
            key = self._key("logstores", project, name)
            ops: list[Put | Delete] = [
                Delete(key),
                Delete(self._key("groups", project, name, ""), prefix=True),
                Delete(self._key("checkpoints", project, name, ""), prefix=True),
                Delete(f"{ASSIGNMENTS_PREFIX}{project}/{name}/", prefix=True),
                *self._tombstones(project, [cached.value.logstore]),
            ]
            compare = [Compare(key, "mod", "==", cached.mod_revision)]
            return _Change(compare, ops, cached.value.logstore)

        return self._write(plan)

    # -- shards -----------------------------------------------------------------------------

    def list_shards(self, project: str, logstore: str) -> list[Shard]:
        return self._fresh(lambda: list(self._entry(project, logstore).shards))

    def get_shard(self, project: str, logstore: str, shard_id: int) -> Shard:
        return self._fresh(lambda: self._entry(project, logstore).shard(shard_id))

    def shard_for_key(self, project: str, logstore: str, key: int) -> Shard:
        """The read-write shard whose range holds ``key`` (see ``hashing.parse_hash_key``)."""
        return self._fresh(lambda: self._entry(project, logstore).shard_for_key(key))

    # -- consumer groups --------------------------------------------------------------------

    def consumer_groups(self, project: str, logstore: str) -> EtcdConsumerGroupCatalog:
        """The groups and checkpoints of a logstore that exists (LogStoreNotExist if not)."""
        self._entry(project, logstore)
        return self._catalog

    # -- split and merge --------------------------------------------------------------------

    def split_shard(
        self, project: str, logstore: str, shard_id: int, split_key: int, sealer: ShardSealer
    ) -> tuple[Shard, Shard, Shard]:
        """Splits a read-write shard at ``split_key`` into two children covering
        [begin, split_key) and [split_key, end); returns (parent now read-only, left, right).

        The parent's log is sealed (``sealer``) before the change commits, so its end never
        moves after it turns read-only; if the commit is refused or fails, the seal is undone.
        """

        def plan() -> _Change[tuple[Shard, Shard, Shard]]:
            cached = self._versioned_entry(project, logstore)
            now_s = self._now_s()
            parent, children = plan_split(cached.value, shard_id, split_key, now_s)
            return self._resharded(
                cached, [parent], children, sealer, now_s,
                lambda closed: (closed[0], children[0], children[1]),
            )  # fmt: skip

        return self._write(plan)

    def merge_shard(
        self, project: str, logstore: str, shard_id: int, sealer: ShardSealer
    ) -> tuple[Shard, Shard, Shard]:
        """Merges a read-write shard with its right-hand read-write neighbour into one new
        shard; returns (new shard, left now read-only, right now read-only)."""

        def plan() -> _Change[tuple[Shard, Shard, Shard]]:
            cached = self._versioned_entry(project, logstore)
            now_s = self._now_s()
            parents, merged = plan_merge(cached.value, shard_id, now_s)
            return self._resharded(
                cached, parents, [merged], sealer, now_s,
                lambda closed: (merged, closed[0], closed[1]),
            )  # fmt: skip

        return self._write(plan)

    # -- the cluster's moves (``loghub.cluster.controller.Catalog``) -------------------------

    def deleted_storage_keys(self) -> frozenset[str]:
        """The storage keys of every logstore deleted so far. A logstore's data lies on the
        nodes that owned its shards, not only on the node that took the delete: each node
        removes what it holds of these (also a node that was down when it happened). A
        storage key holds a random part, so a logstore made again under the same name never
        has a deleted key."""
        return frozenset(self._deleted)

    def _tombstones(self, project: str, logstores: list[Logstore]) -> list[Put]:
        """The marks of deleted logstores: one key for one logstore, one key holding every
        storage key for a project's (a project may have more logstores than a transaction
        may have operations)."""
        if not logstores:
            return []
        keys = [logstore.storage_key for logstore in logstores]
        value: dict[str, Any] = {"deleted_at_s": self._now_s()}
        if len(keys) == 1:
            return [Put(self._key("deleted", *keys[0].split("/")), _encode(value))]
        value["storage_keys"] = keys
        name = f"{_PROJECT_MARK}{secrets.token_hex(4)}"
        return [Put(self._key("deleted", project, name), _encode(value))]

    def all_logstores(self) -> list[tuple[str, str]]:
        """(project, logstore) of every logstore, sorted."""
        return sorted(self._logstores)

    def succeed_shard(
        self, project: str, logstore: str, shard_id: int, end_seq: int | None
    ) -> Shard:
        """Turns a read-write shard read-only at ``end_seq`` (None: its node is gone and the
        end is not known yet; ``record_end`` sets it later) and creates its child with the
        same hash range; returns the child. The log was sealed by its node before (a
        hand-over) or its node is gone: nothing is sealed here."""

        def plan() -> _Change[Shard]:
            cached = self._versioned_entry(project, logstore)
            now_s = self._now_s()
            parent, child = plan_succession(cached.value, shard_id, now_s)
            closed = replace(parent, status="readonly", closed_at_s=now_s,
                             children=(child.shard_id,), end_seq=end_seq)  # fmt: skip
            entry = CachedLogstore.build(
                cached.value.logstore, reshard(cached.value, [closed], [child])
            )
            return self._logstore_swap(cached, entry, child)

        return self._write(plan)

    def record_end(self, project: str, logstore: str, shard_id: int, end_seq: int) -> None:
        """Sets the end of a read-only shard whose end was not known (its node returned and
        sealed its log); a shard whose end is known already keeps it."""

        shard = self.get_shard(project, logstore, shard_id)
        if shard.status != "readonly" or shard.end_seq is not None:
            return

        def plan() -> _Change[None]:
            cached = self._versioned_entry(project, logstore)
            shard = cached.value.shard(shard_id)
            # another node's record may have come first: keep it
            end = shard.end_seq if shard.end_seq is not None else end_seq
            entry = CachedLogstore.build(
                cached.value.logstore,
                reshard(cached.value, [replace(shard, end_seq=end)], []),
            )
            return self._logstore_swap(cached, entry, None)

        self._write(plan)

    def wait_for_writes(self) -> None:
        """Returns once no write through this store that started before the call is still
        committing, and the cache holds every change any node committed before the call: a
        writer that found a shard sealed by a split uses it to see the split's children."""
        with self._write_lock:
            self._call(self._sync())

    def _resharded(
        self,
        cached: _Versioned[CachedLogstore],
        parents: list[Shard],
        children: list[Shard],
        sealer: ShardSealer,
        now_s: int,
        result: Callable[[list[Shard]], _T],
    ) -> _Change[_T]:
        """The swap that closes ``parents`` and adds ``children``, with the parents sealed
        (and unsealed again if etcd refuses the swap)."""
        end_seqs = seal(sealer, parents)
        try:
            closed = close_parents(parents, children, end_seqs, now_s)
            entry = CachedLogstore.build(
                cached.value.logstore, reshard(cached.value, closed, children)
            )
            change = self._logstore_swap(cached, entry, result(closed))
        except BaseException:
            unseal(sealer, parents)
            raise
        change.undo = lambda: unseal(sealer, parents)
        return change

    def _logstore_swap(
        self, cached: _Versioned[CachedLogstore], entry: CachedLogstore, result: _T
    ) -> _Change[_T]:
        logstore = entry.logstore
        key = self._key("logstores", logstore.project, logstore.name)
        compare = [Compare(key, "mod", "==", cached.mod_revision)]
        return _Change(compare, [Put(key, _encode(_logstore_value(entry)))], result)

    # -- reads of the cache -----------------------------------------------------------------

    def _fresh(self, read: Callable[[], _T]) -> _T:
        """``read`` of the cache; a "does not exist" answer is given only from a cache as new
        as etcd. A record another node made a moment ago may not have reached this node's
        watch yet (a group made through one node, then a heartbeat forwarded to its
        coordinator; a shard split elsewhere, then asked for here): on a miss the cache
        catches up with etcd's present (one linearizable read of its revision, no write)
        and the read is made again. Only misses pay, and each pays one etcd read."""
        try:
            return read()
        except NotFoundError:
            if threading.current_thread() is self._thread:
                raise  # on the store's own loop: it cannot wait for itself
            self._call(self._catch_up())
            return read()

    async def _catch_up(self) -> None:
        _entries, revision = await self._etcd.read_prefix(self._key("sync"))
        await self._until_applied(revision)

    def _project(self, name: str) -> _Versioned[Project]:
        project = self._projects.get(name)
        if project is None:
            raise ProjectNotExist(f"project {name} does not exist")
        return project

    def _versioned_entry(self, project: str, name: str) -> _Versioned[CachedLogstore]:
        entry = self._logstores.get((project, name))
        if entry is None:
            self.get_project(project)
            raise missing_logstore(name)
        return entry

    def _entry(self, project: str, name: str) -> CachedLogstore:
        return self._versioned_entry(project, name).value

    def _now_s(self) -> int:
        return self._clock.wall_ms() // 1000

    def _key(self, *parts: object) -> str:
        return self._prefix + "/".join(str(p) for p in parts)

    # -- writing ----------------------------------------------------------------------------

    def _write(self, plan: Callable[[], _Change[_T]]) -> _T:
        """Decides a change with ``plan`` (on the cache) and commits it by compare-and-swap;
        on a refusal, or when the cache says no, catches the cache up with etcd and decides
        again (see the module docstring)."""
        with self._write_lock:
            synced = False
            for _attempt in range(conflict_retries_max):
                if synced:
                    self._call(self._sync())
                try:
                    change = plan()
                except LogHubError:
                    if synced:
                        raise
                    synced = True
                    continue
                try:
                    revision = self._call(self._commit(change))
                except BaseException:
                    change.undo()
                    raise
                if revision is not None:
                    return change.result
                change.undo()
                change.refused()
                synced = True
            raise ControlPlaneError(
                f"a metadata change met a newer revision {conflict_retries_max} times; try again"
            )

    def _call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        assert threading.current_thread() is not self._thread, "would wait for itself"
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(self._wait_s)
        except TimeoutError as exc:
            future.cancel()
            raise ControlPlaneError(f"etcd did not answer within {self._wait_s} s") from exc

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    # -- on the loop ------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Ends every task of the loop (the watch, the client's own) and the connection,
        each within a bound: closing must not hang on a member that stopped answering."""
        if self._watcher is not None:
            self._watcher.cancel()
        current = asyncio.current_task()
        for step in (self._etcd.close, lambda: _cancel_all(current)):
            try:
                await asyncio.wait_for(step(), _close_step_s)
            except (TimeoutError, ControlPlaneError) as exc:
                log.warning("closing the metadata store: %r", exc)

    async def _commit(self, change: _Change[Any]) -> int | None:
        for op in change.ops:
            if isinstance(op, Put) and len(op.value) > value_bytes_max:
                raise ParameterInvalid(
                    f"{op.key} would take {len(op.value)} bytes; at most {value_bytes_max}"
                )
        revision = await self._etcd.transact(change.compare, change.ops)
        if revision is not None:
            await self._until_applied(revision)
        return revision

    async def _sync(self) -> None:
        """Brings the cache up to etcd's present: a write to the prefix's sync key is ordered
        after every change committed before it, and the watch delivers them in order."""
        revision = await self._etcd.put(self._key("sync"), b"")
        await self._until_applied(revision)

    async def _until_applied(self, revision: int) -> None:
        if self._applied_revision >= revision:
            return
        waiter = self._loop.create_future()
        self._waiters.append((revision, waiter))
        try:
            await asyncio.wait_for(asyncio.shield(waiter), _watch_catch_up_s)
        except TimeoutError:
            log.warning("the metadata watch is behind revision %d; reading again", revision)
            await self._reload()
        finally:
            self._waiters = [(r, w) for r, w in self._waiters if w is not waiter]

    async def _reload(self) -> None:
        """Replaces the cache with a fresh read, unless the cache moved past that read while
        it was under way (two reloads can overlap: the watch's, and a write's that gave up
        waiting for the watch); the watch's later events are applied on top as usual."""
        entries, revision = await self._etcd.read_prefix(self._prefix)
        if revision < self._applied_revision:
            return
        sections: dict[str, dict[Any, Any]] = {name: {} for name in _SECTIONS}
        for entry in entries:
            section = entry.key[len(self._prefix) :].split("/", 1)[0]
            if section in sections:
                self._apply_record(sections[section], "PUT", entry)
        for name, records in sections.items():
            setattr(self, f"_{name}", records)
        self._advance(revision)

    async def _watch_forever(self) -> None:
        delay_s = 0.05
        while True:
            try:
                start = self._applied_revision + 1
                async for kind, _key, entry in self._etcd.watch_prefix(self._prefix, start):
                    self._apply(kind, entry)
                    delay_s = 0.05
                log.info("the metadata watch ended; watching again")
            except ControlPlaneError as exc:
                end_if_cancelled()
                log.warning("the metadata watch broke (%s); reading again", exc)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 1.0)
            try:
                await self._reload()
            except ControlPlaneError as exc:
                log.warning("cannot read the metadata again yet: %s", exc)

    def _apply(self, kind: str, entry: Entry) -> None:
        """One watched change into the cache: the section it touches is copied, changed and
        put back, so that readers of the old one see it whole."""
        if entry.mod_revision < self._applied_revision:
            return  # older than a reload that already holds its effect
        section = entry.key[len(self._prefix) :].split("/", 1)[0]
        if section in _SECTIONS:
            records = dict(getattr(self, f"_{section}"))
            self._apply_record(records, kind, entry)
            setattr(self, f"_{section}", records)
        self._advance(entry.mod_revision)

    def _apply_record(self, records: dict[Any, Any], kind: str, entry: Entry) -> None:
        """Puts a record into (or takes it out of) its section's dictionary, in place."""
        section, *names = entry.key[len(self._prefix) :].split("/")
        deleted = kind == "DELETE"
        try:
            if section == "projects" and len(names) == 1:
                _set(records, names[0], deleted, lambda: _project_of(names[0], entry))
            elif section == "logstores" and len(names) == 2:
                _set(
                    records, tuple(names), deleted, lambda: _logstore_of(names[0], names[1], entry)
                )
            elif section == "groups" and len(names) == 3:
                _set(records, tuple(names), deleted, lambda: _group_of(names[2], entry))
            elif section == "checkpoints" and len(names) == 4:
                group, shard_id = tuple(names[:3]), int(names[3])
                shards = dict(records.get(group, {}))
                _set(shards, shard_id, deleted, lambda: _checkpoint_of(shard_id, entry))
                _set(records, group, not shards, lambda: shards)
            elif section == "deleted" and len(names) == 2 and not deleted:
                mark = _decode(entry)
                at_s = int(mark["deleted_at_s"])
                if names[1].startswith(_PROJECT_MARK):
                    for key in mark["storage_keys"]:
                        records[str(key)] = at_s
                else:
                    records["/".join(names)] = at_s
            else:
                log.error("a metadata key outside the layout: %s", entry.key)
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            log.error("an unreadable metadata record %s: %r", entry.key, exc)

    def _advance(self, revision: int) -> None:
        self._applied_revision = max(self._applied_revision, revision)
        for wanted, waiter in self._waiters:
            if wanted <= self._applied_revision and not waiter.done():
                waiter.set_result(None)


class EtcdConsumerGroupCatalog:
    """Consumer groups and checkpoints of every logstore, in etcd: the interface of
    ``loghub.metadata.ConsumerGroupCatalog``. Owned by ``EtcdMetadataStore``."""

    def __init__(self, store: EtcdMetadataStore) -> None:
        self._store = store

    # -- groups -----------------------------------------------------------------------------

    def create(self, project: str, logstore: str, group: ConsumerGroupDef) -> None:
        validate_group(group.name, group.timeout_s)
        store = self._store

        def plan() -> _Change[None]:
            revision = store._applied_revision  # first: the records read below are as new
            owner = store._versioned_entry(project, logstore)
            groups = store._groups
            if (project, logstore, group.name) in groups:
                raise ConsumerGroupAlreadyExist(f"consumer group {group.name} already exists")
            if group_count(groups, project, logstore) >= consumer_groups_per_logstore_max:
                raise ParameterInvalid(
                    f"a logstore has at most {consumer_groups_per_logstore_max} consumer groups"
                )
            key = store._key("groups", project, logstore, group.name)
            compare = [
                Compare(store._key("logstores", project, logstore), "create", "==",
                        owner.create_revision),
                Compare(key, "create", "==", 0),
                Compare(store._key("groups", project, logstore, ""), "mod", "<", revision + 1,
                        prefix=True),
            ]  # fmt: skip
            return _Change(compare, [Put(key, _encode(_group_value(group)))], None)

        store._write(plan)

    def get(self, project: str, logstore: str, name: str) -> ConsumerGroupDef:
        return self._store._fresh(lambda: self._group(project, logstore, name).value)

    def list_groups(self, project: str, logstore: str) -> list[ConsumerGroupDef]:
        return [
            group.value
            for (p, ls, _), group in sorted(self._store._groups.items())
            if (p, ls) == (project, logstore)
        ]

    def update(
        self,
        project: str,
        logstore: str,
        name: str,
        timeout_s: int | None = None,
        ordered: bool | None = None,
    ) -> ConsumerGroupDef:
        store = self._store

        def plan() -> _Change[ConsumerGroupDef]:
            cached = self._group(project, logstore, name)
            old = cached.value
            new = replace(
                old,
                timeout_s=old.timeout_s if timeout_s is None else timeout_s,
                ordered=old.ordered if ordered is None else ordered,
            )
            validate_group(new.name, new.timeout_s)
            key = store._key("groups", project, logstore, name)
            compare = [Compare(key, "mod", "==", cached.mod_revision)]
            return _Change(compare, [Put(key, _encode(_group_value(new)))], new)

        return store._write(plan)

    def delete(self, project: str, logstore: str, name: str) -> None:
        store = self._store

        def plan() -> _Change[None]:
            cached = self._group(project, logstore, name)
            key = store._key("groups", project, logstore, name)
            ops: list[Put | Delete] = [
                Delete(key),
                Delete(store._key("checkpoints", project, logstore, name, ""), prefix=True),
            ]
            return _Change([Compare(key, "mod", "==", cached.mod_revision)], ops, None)

        store._write(plan)

    # -- checkpoints ------------------------------------------------------------------------

    def checkpoints(self, project: str, logstore: str, name: str) -> Mapping[int, Checkpoint]:
        self.get(project, logstore, name)
        return self._store._checkpoints.get((project, logstore, name), {})

    def save_checkpoint(
        self,
        project: str,
        logstore: str,
        name: str,
        checkpoint: Checkpoint,
        fence: Fence | None = None,
    ) -> None:
        """Saves a checkpoint if the group still exists (the same group, not one deleted and
        made again) and, with ``fence``, only while the fence holds: a group coordinator
        passes the create revision of its coordinator key, so that a coordinator that lost
        its role can no longer write (FencedError), whatever its clock says."""
        validate_checkpoint(checkpoint)
        store = self._store

        def plan() -> _Change[None]:
            group = self._group(project, logstore, name)
            group_key = store._key("groups", project, logstore, name)
            compare = [Compare(group_key, "create", "==", group.create_revision)]
            if fence is not None:
                compare.append(Compare(fence.key, "create", "==", fence.create_revision))
            key = store._key("checkpoints", project, logstore, name, checkpoint.shard_id)
            put = Put(key, _encode(_checkpoint_value(checkpoint)))
            return _Change(compare, [put], None, refused=lambda: self._check_fence(fence))

        store._write(plan)

    def _check_fence(self, fence: Fence | None) -> None:
        if fence is None:
            return
        holder = self._store._call(self._store._etcd.get(fence.key))
        if holder is None or holder.create_revision != fence.create_revision:
            raise FencedError(f"{fence.key} is held by another since {fence} was taken")

    def _group(self, project: str, logstore: str, name: str) -> _Versioned[ConsumerGroupDef]:
        group = self._store._groups.get((project, logstore, name))
        if group is None:
            raise ConsumerGroupNotExist(f"consumer group {name} does not exist")
        return group


async def _cancel_all(caller: asyncio.Task[Any] | None) -> None:
    """Cancels every task of the loop but the caller and this one, and waits for them."""
    spared = {caller, asyncio.current_task()}
    tasks = [t for t in asyncio.all_tasks() if t not in spared]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _set(target: dict[Any, Any], key: Any, deleted: bool, value: Callable[[], Any]) -> None:
    if deleted:
        target.pop(key, None)
    else:
        target[key] = value()


# -- values ----------------------------------------------------------------------------------


def _encode(value: dict[str, Any]) -> bytes:
    value["w"] = secrets.token_hex(6)
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def _decode(entry: Entry) -> dict[str, Any]:
    value = json.loads(entry.value)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _versioned(value: _T, entry: Entry) -> _Versioned[_T]:
    return _Versioned(value, entry.create_revision, entry.mod_revision)


def _project_value(project: Project) -> dict[str, Any]:
    return {
        "description": project.description,
        "created_at_s": project.created_at_s,
        "modified_at_s": project.modified_at_s,
    }


def _project_of(name: str, entry: Entry) -> _Versioned[Project]:
    v = _decode(entry)
    return _versioned(Project(name, v["description"], v["created_at_s"], v["modified_at_s"]), entry)


_LOGSTORE_STORED = tuple(
    f.name for f in fields(Logstore) if f.name not in ("project", "name", "shard_count")
)


def _logstore_value(entry: CachedLogstore) -> dict[str, Any]:
    logstore = {name: getattr(entry.logstore, name) for name in _LOGSTORE_STORED}
    logstore["extra"] = dict(entry.logstore.extra)
    shards = [
        [s.shard_id, s.status, f"{s.begin_key:x}", f"{s.end_key:x}", s.created_at_s,
         s.closed_at_s, list(s.parents), list(s.children), s.end_seq]
        for s in entry.shards
    ]  # fmt: skip
    return {"logstore": logstore, "shards": shards}


def _logstore_of(project: str, name: str, entry: Entry) -> _Versioned[CachedLogstore]:
    v = _decode(entry)
    shards = []
    for shard_id, status, begin, end, created, closed, parents, children, end_seq in v["shards"]:
        assert status in ("readwrite", "readonly"), status
        shards.append(
            Shard(
                shard_id,
                cast(ShardStatus, status),
                int(begin, 16),
                int(end, 16),
                created,
                closed,
                tuple(parents),
                tuple(children),
                end_seq,
            )  # fmt: skip
        )
    stored = {name: v["logstore"][name] for name in _LOGSTORE_STORED}
    logstore = Logstore(project=project, name=name, shard_count=0, **stored)
    return _versioned(CachedLogstore.build(logstore, shards), entry)


def _group_value(group: ConsumerGroupDef) -> dict[str, Any]:
    return {"timeout_s": group.timeout_s, "ordered": group.ordered}


def _group_of(name: str, entry: Entry) -> _Versioned[ConsumerGroupDef]:
    v = _decode(entry)
    return _versioned(ConsumerGroupDef(name, v["timeout_s"], v["ordered"]), entry)


def _checkpoint_value(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "cursor": checkpoint.cursor,
        "consumer": checkpoint.consumer,
        "update_time_us": checkpoint.update_time_us,
    }


def _checkpoint_of(shard_id: int, entry: Entry) -> Checkpoint:
    v = _decode(entry)
    return Checkpoint(shard_id, v["cursor"], v["consumer"], v["update_time_us"])
