"""Server mode: shards from the server's consumer group, by heartbeat.

The protocol (``spec/consumer-groups.md``): every ``heartbeat_interval_ms`` the worker reports
the shards it holds and the server answers the shards it should hold. A shard left out of
the answer is stopped here, its checkpoint written, and only then left out of the next
report: the server gives a shard to nobody else while someone still reports it, so a shard
is never read by two workers during a planned move.

What this does better than the official SDK (``reference/sls-protocol.md`` section 7):

- A failed heartbeat is retried within the timeout (every quarter interval), so a brief
  network problem does not give shards up.
- Self-fencing, measured from the *send* time of the last heartbeat that succeeded: once
  ``timeout_ms`` has passed since then, ``assigned()`` is empty and ``may_consume`` is false,
  so every shard stops before the server (which counts from the later *receive* time, in
  whole seconds at least as long) can give it to another worker.
- Checkpoints are written fenced (``forceSuccess=False``): a worker that lost a shard cannot
  move its checkpoint, so its late write cannot skip data the new holder has not seen.
- A finished read-only shard is released as soon as its end checkpoint is written, so its
  children start at the next heartbeat rather than 30 s later.
- A server that cannot serve the group yet (a 503: in a cluster, no node can coordinate it
  while the control plane is out of reach) does not stop the worker: creating the group is
  retried in the heartbeat thread with capped exponential backoff
  (``join_backoff_max_ms``), and the worker holds nothing until it succeeds.

The same requests work against the hosted service.

Thread-safety: every public method may be called from any thread; one lock guards the state
that the heartbeat thread and the worker share.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from loghub._clock import Clock
from loghub._retry import is_retryable
from loghub.client import LogHubClient, ShardInfo
from loghub.consumer.assignment import Wake
from loghub.consumer.config import ConsumerConfig
from loghub.consumer.shards import ShardDirectory
from loghub.errors import (
    ConsumerGroupAlreadyExist,
    ConsumerNotMatch,
    LeaseLostError,
    LogHubError,
)

__all__ = [
    "HeartbeatAssignment",
    "HeartbeatStatistics",
    "heartbeat_retries_per_interval",
    "join_backoff_max_ms",
]

logger = logging.getLogger(__name__)

# A failed heartbeat is retried this many times per interval, so a timeout of two intervals
# leaves about eight tries before the shards are given up.
heartbeat_retries_per_interval = 4
# Creating the group is retried after a quarter interval, then twice as long each time, up
# to this (or one interval, if longer): a cluster without a coordinator for minutes is not
# asked four times a second by every worker.
join_backoff_max_ms = 5_000


@dataclass(frozen=True)
class HeartbeatStatistics:
    heartbeats: int
    heartbeat_failures: int
    self_fenced: int


@dataclass
class _Shared:
    """What the heartbeat thread and the worker share (under ``HeartbeatAssignment._lock``)."""

    granted: frozenset[int] = frozenset()
    held: frozenset[int] = frozenset()
    last_ok_send_ms: int | None = None  # send time of the last heartbeat that succeeded
    fenced: bool = False
    shards: Mapping[int, ShardInfo] = field(default_factory=dict)
    finished_at_ms: dict[int, int] = field(default_factory=dict)  # until the server knows


class HeartbeatAssignment:
    def __init__(
        self, client: LogHubClient, config: ConsumerConfig, clock: Clock, wake: Wake
    ) -> None:
        self._client = client
        self._config = config
        self._clock = clock
        self._wake = wake
        self._directory = ShardDirectory(client, config.project, config.logstore)
        self._lock = threading.Lock()
        self._shared = _Shared()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"loghub-heartbeat-{config.worker_name}", daemon=True
        )
        self._heartbeats = 0
        self._failures = 0
        self._fences = 0
        self._joined = False  # the group was created (or updated) once
        self._join_failures = 0

    # -- the worker's side ---------------------------------------------------------------------

    def start(self, *, background: bool = True) -> None:
        """Create the group (or update its timeout and order), list the shards, send the
        first heartbeat, then keep heartbeating in a thread (``background=False``: the
        caller drives ``run_once``, as tests with a fake clock do). When the server cannot
        serve the group yet, the thread keeps trying (see the module docstring); an error
        that asking again cannot fix (a wrong key, no such logstore) is raised here."""
        self._join()
        self._refresh_shards()
        if self._joined:
            self._heartbeat()
        if background:
            self._thread.start()

    def _join(self) -> None:
        config = self._config
        try:
            try:
                self._client.create_consumer_group(
                    config.project,
                    config.logstore,
                    config.group,
                    config.group_timeout_s,
                    config.ordered,
                )
            except ConsumerGroupAlreadyExist:
                self._client.update_consumer_group(
                    config.project,
                    config.logstore,
                    config.group,
                    timeout_s=config.group_timeout_s,
                    ordered=config.ordered,
                )
        except LogHubError as exc:
            if not is_retryable(exc):
                raise
            with self._lock:
                self._failures += 1
            self._join_failures += 1
            logger.warning("%s: the group cannot be joined yet, retrying: %s",
                           config.worker_name, exc)  # fmt: skip
            return
        self._joined = True
        self._join_failures = 0

    def _join_backoff_ms(self) -> int:
        quarter_ms = max(1, self._config.heartbeat_interval_ms // heartbeat_retries_per_interval)
        cap_ms = max(join_backoff_max_ms, self._config.heartbeat_interval_ms)
        return int(min(cap_ms, quarter_ms * 2 ** min(self._join_failures - 1, 30)))

    def assigned(self) -> frozenset[int]:
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            if self._fenced(now_ms):
                return frozenset()
            return self._shared.granted - self._shared.finished_at_ms.keys()

    def shards(self) -> Mapping[int, ShardInfo]:
        with self._lock:
            return self._shared.shards

    def set_held(self, shard_ids: Collection[int]) -> None:
        with self._lock:
            self._shared.held = frozenset(shard_ids)

    def may_consume(self, shard_id: int) -> bool:
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            return not self._fenced(now_ms)

    def read_checkpoint(self, shard_id: int) -> str:
        config = self._config
        saved = self._client.get_checkpoints(
            config.project, config.logstore, config.group, shard_id
        )
        return saved.get(shard_id, "")

    def write_checkpoint(self, shard_id: int, cursor: str) -> None:
        config = self._config
        try:
            self._client.update_checkpoint(
                config.project,
                config.logstore,
                config.group,
                shard_id,
                cursor,
                consumer=config.worker_name,
                force=False,
            )
        except ConsumerNotMatch as exc:
            raise LeaseLostError(f"{config.worker_name} no longer holds shard {shard_id}") from exc

    def mark_finished(self, shard_id: int) -> None:
        """Not asked for again until a heartbeat sent after now has answered: a reply to an
        earlier one may still list it (the server had not seen the end checkpoint yet)."""
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            self._shared.finished_at_ms[shard_id] = now_ms

    def shutdown(self) -> None:
        """Stop heartbeating, then leave: one heartbeat that reports no shard tells the server
        (LogHub, and the hosted service alike) that this worker let go of everything it was
        granted, so its shards move at the others' next heartbeat instead of after the
        group's timeout. Sent only when no shard runs here any more (the worker stopped every
        shard and wrote its checkpoints); otherwise, and when it fails, the timeout does it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            idle = not self._shared.held
            granted = bool(self._shared.granted)
        if not idle or not granted:
            return
        config = self._config
        try:
            self._client.heartbeat(
                config.project, config.logstore, config.group, config.worker_name, []
            )
        except LogHubError as exc:
            logger.info("%s: leave not sent: %s", config.worker_name, exc)

    def statistics(self) -> HeartbeatStatistics:
        with self._lock:
            return HeartbeatStatistics(self._heartbeats, self._failures, self._fences)

    # -- the heartbeat thread ------------------------------------------------------------------

    def run_once(self) -> int:
        """One round: a heartbeat, then the shard list. Returns the milliseconds until the
        next round: an interval after a success, a quarter of one after a failure."""
        interval_ms = self._config.heartbeat_interval_ms
        started_ms = self._clock.monotonic_ms()
        if not self._joined:
            self._join()
            if not self._joined:
                return self._join_backoff_ms()
        ok = self._heartbeat()
        self._refresh_shards()
        delay_ms = interval_ms if ok else max(1, interval_ms // heartbeat_retries_per_interval)
        return max(0, delay_ms - (self._clock.monotonic_ms() - started_ms))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._stop.wait(self.run_once() / 1000)

    def _heartbeat(self) -> bool:
        config = self._config
        with self._lock:
            report = sorted(self._shared.held | self._shared.granted)
        send_ms = self._clock.monotonic_ms()
        try:
            reply = self._client.heartbeat(
                config.project, config.logstore, config.group, config.worker_name, report
            )
        except LogHubError as exc:
            self._on_failure(exc)
            return False
        with self._lock:
            self._heartbeats += 1
            changed = frozenset(reply) != self._shared.granted or self._shared.fenced
            self._shared.granted = frozenset(reply)
            self._shared.last_ok_send_ms = send_ms
            self._shared.fenced = False
            for shard_id, at_ms in list(self._shared.finished_at_ms.items()):
                if at_ms < send_ms:  # this heartbeat left after the end checkpoint was written
                    del self._shared.finished_at_ms[shard_id]
        if changed:
            self._wake()
        return True

    def _on_failure(self, exc: LogHubError) -> None:
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            self._failures += 1
            newly_fenced = self._fenced(now_ms) and not self._shared.fenced
            if newly_fenced:
                # Nothing granted survives a fence: a later reply says afresh what to hold.
                self._shared.fenced = True
                self._shared.granted = frozenset()
                self._fences += 1
        if newly_fenced:
            logger.warning(
                "%s: no heartbeat for %d ms, giving up every shard: %s",
                self._config.worker_name,
                self._config.timeout_ms,
                exc,
            )
            self._wake()
        else:
            logger.info("%s: heartbeat failed, retrying: %s", self._config.worker_name, exc)

    def _fenced(self, now_ms: int) -> bool:
        """Caller holds the lock. Past the timeout since the send time of the last good
        heartbeat (before the first one nothing is granted anyway)."""
        last_ok = self._shared.last_ok_send_ms
        return last_ok is not None and now_ms - last_ok >= self._config.timeout_ms

    def _refresh_shards(self) -> None:
        try:
            shards = self._directory.refresh()
        except LogHubError as exc:
            logger.info("%s: listing shards failed: %s", self._config.worker_name, exc)
            return
        with self._lock:
            changed = shards != self._shared.shards
            self._shared.shards = shards
        if changed:
            self._wake()
