"""Lease mode: shards taken as leases in a SQL database, no help from the log server.

Drives ``loghub.coordination.lease.LeaseCoordinator`` (the protocol of
``spec/lease-protocol.md``) from its own thread: ``start`` once, then ``tick`` by each
``Decisions.next_tick_ms``. The worker runs the shards in ``Decisions.consuming`` and stops
the others (stop fetching, then write the final checkpoint, which the lease's
``consumer_owner`` still allows: a thief waits one lease timeout before it consumes).

Ordering is this module's job, since no server enforces it: every ``heartbeat_interval_ms``
it lists the shards and reads the lease table's checkpoints, and passes the coordinator only
``consumable_shards``: not finished (read-only with the checkpoint at its end), and in an
ordered group with every ancestor finished. A shard this worker has just finished is left
out at once (``mark_finished``), so its lease is released and its children become
consumable without waiting for the next listing.

``may_consume`` answers from a snapshot taken after each tick: for each consuming shard, the
deadline one lease timeout after the start of its last winning renew (the coordinator's own
rule). Only time moves between ticks, so the answer is the coordinator's, without making the
processing threads wait for a tick's database round trips.

Thread-safety: every public method may be called from any thread. The coordinator itself is
used by the lease thread only (and by ``shutdown`` after that thread ended), except
``read_checkpoint``/``checkpoint``, which touch nothing but the store, and the store is
thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from loghub._clock import Clock
from loghub.client import LogHubClient, ShardInfo
from loghub.consumer.assignment import Wake
from loghub.consumer.config import ConsumerConfig
from loghub.consumer.shards import ShardDirectory, consumable_shards, finished_shards
from loghub.coordination.lease import Decisions, LeaseCoordinator, LeaseStatistics, LeaseStore
from loghub.errors import LogHubError

if TYPE_CHECKING:
    from loghub.coordination.lease_sql import SqlLeaseStore

__all__ = ["LeaseAssignment"]

logger = logging.getLogger(__name__)


class LeaseAssignment:
    def __init__(
        self,
        client: LogHubClient,
        config: ConsumerConfig,
        clock: Clock,
        wake: Wake,
        store: LeaseStore | None = None,
    ) -> None:
        """``store`` None opens ``config.lease_url`` at ``start`` (and closes it at
        ``shutdown``); tests pass a ``MemoryLeaseStore``."""
        self._client = client
        self._config = config
        self._clock = clock
        self._wake = wake
        self._store = store
        self._opened: SqlLeaseStore | None = None  # the store this assignment must close
        self._coordinator: LeaseCoordinator | None = None
        self._directory = ShardDirectory(client, config.project, config.logstore)
        self._lock = threading.Lock()
        self._shards: Mapping[int, ShardInfo] = {}
        self._consuming: frozenset[int] = frozenset()
        self._deadlines_ms: dict[int, int] = {}
        self._finished_at_ms: dict[int, int] = {}  # finished here, until a listing shows it
        self._allowed: frozenset[int] = frozenset()
        self._next_refresh_ms = 0
        self._stop = threading.Event()
        self._poke = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"loghub-leases-{config.worker_name}", daemon=True
        )

    # -- the worker's side ---------------------------------------------------------------------

    def start(self, *, background: bool = True) -> None:
        """Open the store, list the shards, register and take a first share of the leases,
        then keep ticking in a thread (``background=False``: the caller drives ``run_once``).
        Raises DatabaseError (database unreachable) or a client error: nothing was taken."""
        config = self._config
        if self._store is None:
            # Imported here: SQLAlchemy is needed only in this mode.
            from loghub.coordination.lease_sql import SqlLeaseStore

            self._store = self._opened = SqlLeaseStore.open(
                config.lease_url, config.group, config.logstore_sig, self._clock
            )
        self._coordinator = LeaseCoordinator(
            self._store, self._clock, config.worker_name, lease_timeout_ms=config.timeout_ms
        )
        self._refresh(raise_errors=True)
        self._apply(self._coordinator.start(self._allowed))
        if background:
            self._thread.start()

    def assigned(self) -> frozenset[int]:
        with self._lock:
            return self._consuming - self._finished_at_ms.keys()

    def shards(self) -> Mapping[int, ShardInfo]:
        with self._lock:
            return self._shards

    def set_held(self, shard_ids: Collection[int]) -> None:
        """Nothing to report: a lease is held until released or lost, whatever runs here."""

    def may_consume(self, shard_id: int) -> bool:
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            return now_ms < self._deadlines_ms.get(shard_id, now_ms)

    def read_checkpoint(self, shard_id: int) -> str:
        return self._started().read_checkpoint(shard_id)

    def write_checkpoint(self, shard_id: int, cursor: str) -> None:
        self._started().checkpoint(shard_id, cursor)

    def mark_finished(self, shard_id: int) -> None:
        with self._lock:
            self._finished_at_ms[shard_id] = self._clock.monotonic_ms()
            self._allowed = self._allowed - {shard_id}
            self._next_refresh_ms = 0
        self._poke.set()

    def shutdown(self) -> None:
        """Stop the lease thread, then release every lease (others take them at their next
        taker round) and deregister. A database error is logged: the leases then expire."""
        self._stop.set()
        self._poke.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            if self._coordinator is not None:
                self._coordinator.shutdown()
        except LogHubError as exc:
            logger.warning("%s: could not release leases: %s", self._config.worker_name, exc)
        finally:
            if self._opened is not None:
                self._opened.close()

    def statistics(self) -> LeaseStatistics:
        return self._started().statistics()

    # -- the lease thread ----------------------------------------------------------------------

    def run_once(self) -> int:
        """List shards and leases if due, then tick. Returns the milliseconds until the next
        tick or listing is due."""
        coordinator = self._started()
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            refresh_due = now_ms >= self._next_refresh_ms
        if refresh_due:
            self._refresh(raise_errors=False)
        with self._lock:
            allowed = self._allowed
        try:
            decisions = coordinator.tick(allowed)
        except LogHubError as exc:  # tick counts store errors; this is anything else
            logger.warning("%s: lease tick failed: %s", self._config.worker_name, exc)
            return self._config.heartbeat_interval_ms
        self._apply(decisions)
        with self._lock:
            next_ms = min(decisions.next_tick_ms, self._next_refresh_ms)
        return max(0, next_ms - self._clock.monotonic_ms())

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poke.clear()  # before the round: a poke during it shortens the next wait
            self._poke.wait(self.run_once() / 1000)

    def _refresh(self, *, raise_errors: bool) -> None:
        """List the shards and the lease checkpoints; recompute what may be asked for."""
        store = self._store
        assert store is not None
        started_ms = self._clock.monotonic_ms()
        try:
            shards = self._directory.refresh()
            checkpoints = {record.shard_id: record.checkpoint for record in store.list_leases()}
        except LogHubError as exc:
            if raise_errors:
                raise
            logger.info("%s: listing shards or leases failed: %s", self._config.worker_name, exc)
            with self._lock:
                self._next_refresh_ms = started_ms + self._config.heartbeat_interval_ms
            return
        finished = finished_shards(shards, checkpoints)
        with self._lock:
            for shard_id, at_ms in list(self._finished_at_ms.items()):
                if at_ms < started_ms or shard_id not in shards:  # this listing shows it
                    del self._finished_at_ms[shard_id]
            finished |= self._finished_at_ms.keys()
            changed = shards != self._shards
            self._shards = shards
            self._allowed = frozenset(consumable_shards(shards, finished, self._config.ordered))
            self._next_refresh_ms = started_ms + self._config.heartbeat_interval_ms
        if changed:
            self._wake()

    def _apply(self, decisions: Decisions) -> None:
        coordinator = self._started()
        timeout_ms = self._config.timeout_ms
        deadlines = {
            shard_id: coordinator.renewer.held[shard_id].renewed_at_ms + timeout_ms
            for shard_id in decisions.consuming
        }
        with self._lock:
            changed = frozenset(decisions.consuming) != self._consuming
            self._consuming = frozenset(decisions.consuming)
            self._deadlines_ms = deadlines
        if changed or decisions.stop:
            self._wake()

    def _started(self) -> LeaseCoordinator:
        assert self._coordinator is not None, "call start first"
        return self._coordinator
