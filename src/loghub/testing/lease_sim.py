"""A deterministic simulation of workers sharing shards through the lease protocol.

Everything runs in one thread on a ``FakeClock`` with one seeded ``random.Random``: a run is a
pure function of its seed. Workers share one ``MemoryLeaseStore``, each through its own
``FaultyLeaseStore`` (its own database connection, so a fault is pinned on one worker). Each
step advances the clock by ``step_ms`` and lets every running worker act once, in a random
order: tick its coordinator, act on the decisions, deliver one record of each shard it
consumes, and write checkpoints now and then.

Chaos phases mix joins, clean leaves, crashes, restarts under the same name, pauses longer
than the lease timeout, store failures and delays, and shard splits and merges (a read-only
parent is consumed to its end, then finished; in an ordered group its children appear only
then). Quiet phases have none of these; once quiet for one taker round plus one lease timeout
plus renew slack, the group must be balanced.

Checked after every worker's action (``InvariantViolation`` names the seed):

1. A worker that believes it may consume a shard is its ``consumer_owner`` in the store, so no
   two workers ever consume one shard at once (a paused worker's belief runs out with its
   deadline, on the shared clock).
2. A shard that moves is resumed from where the previous consumer stopped: its checkpoint
   covers every record delivered, unless that consumer crashed, was paused, or lost its final
   checkpoint to injected store faults (then replay is the at-least-once promise).
3. A checkpoint write by a worker that is not ``consumer_owner`` fails and changes nothing;
   one by the consumer_owner succeeds (unless a fault is injected).
4. After a quiet spell every consumable shard is held and consumed by a running worker, and
   any two running workers' counts differ by at most 1.

``LOGHUB_SEED=<seed>`` in a failure message replays it: ``LeaseSimulation(seed).run(steps)``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

from loghub._clock import Clock
from loghub.coordination.lease import (
    LeaseCoordinator,
    LeaseStore,
    renews_per_lease_timeout,
    taker_interval_lease_timeouts,
)
from loghub.errors import DatabaseError, LeaseLostError
from loghub.testing.clock import FakeClock
from loghub.testing.lease_store import FaultyLeaseStore, MemoryLeaseStore

__all__ = ["CoordinatorFactory", "InvariantViolation", "LeaseSimulation", "SimConfig"]

CoordinatorFactory = Callable[[LeaseStore, Clock, str, int], LeaseCoordinator]


def default_coordinator(
    store: LeaseStore, clock: Clock, name: str, lease_timeout_ms: int
) -> LeaseCoordinator:
    return LeaseCoordinator(store, clock, name, lease_timeout_ms=lease_timeout_ms)


class InvariantViolation(AssertionError):
    pass


class _JournalStore(MemoryLeaseStore):
    """Notes the shards whose consumer_owner changed, so the checker looks only at those."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.consumer_changes: set[int] = set()

    def compare_and_set(
        self, shard_id: int, seen_counter: int, lease_owner: str, consumer_owner: str | None
    ) -> bool:
        won = super().compare_and_set(shard_id, seen_counter, lease_owner, consumer_owner)
        if won and consumer_owner is not None:
            self.consumer_changes.add(shard_id)
        return won


@dataclass(frozen=True)
class SimConfig:
    lease_timeout_ms: int = 10_000
    step_ms: int = 500
    workers_min: int = 3
    workers_max: int = 8
    shards_min: int = 16
    shards_max: int = 64
    checkpoint_every_steps: int = 8
    failure_probability: float = 0.02
    delay_probability: float = 0.01
    delay_ms_max: int = 1_000
    event_probability: float = 0.03  # per step, during chaos
    chaos_steps_max: int = 200


@dataclass
class _Worker:
    name: str
    store: FaultyLeaseStore
    coordinator: LeaseCoordinator
    started: bool = False
    leaving: bool = False
    paused_until_ms: int = 0
    positions: dict[int, int] = field(default_factory=dict)  # next record to deliver
    starting: set[int] = field(default_factory=set)  # told to start; checkpoint not read yet
    consuming: set[int] = field(default_factory=set)
    pending_final: set[int] = field(default_factory=set)  # stopped; final checkpoint not written
    faulted_at_ms: int = -(10**12)  # last store fault, delay, or end of a pause

    def faults(self) -> int:
        return self.store.failures.total() + self.store.delays


class LeaseSimulation:
    def __init__(
        self,
        seed: int,
        config: SimConfig = SimConfig(),
        coordinator_factory: CoordinatorFactory = default_coordinator,
    ) -> None:
        self.seed = seed
        self.config = config
        self.rng = random.Random(seed)
        self.clock = FakeClock()
        self.inner = _JournalStore(self.clock)
        self.factory = coordinator_factory
        self.workers: dict[str, _Worker] = {}
        self.crashed: list[str] = []
        self.names_used = 0
        rng = self.rng
        self.ordered = rng.random() < 0.5
        shard_count = rng.randint(config.shards_min, config.shards_max)
        self.consumable: set[int] = set(range(shard_count))
        self.next_shard_id = shard_count
        self.ends: dict[int, int] = {}  # read-only shard -> its end position
        self.parents_of: dict[int, tuple[int, ...]] = {}  # children not yet consumable
        self.finished: set[int] = set()
        self.delivered_upto: dict[int, int] = {}
        self.last_deliverer: dict[int, str] = {}
        self.excused: set[int] = set()  # replay allowed: last deliverer crashed, paused, faulted
        self.faults_on = True
        self.quiet_since_ms = 0
        self.balance_checks = 0
        self.step_count = 0
        for _ in range(rng.randint(config.workers_min, config.workers_max)):
            self.join()

    # -- driving -----------------------------------------------------------------------------

    def run(self, steps: int) -> None:
        """Alternate chaos and quiet phases for ``steps`` steps."""
        config = self.config
        while self.step_count < steps:
            self.set_faults(True)
            for _ in range(self.rng.randint(10, config.chaos_steps_max)):
                if self.rng.random() < config.event_probability:
                    self.random_event()
                self.step()
            self.set_faults(False)
            self.settle(steps)

    def settle(self, steps_max: int) -> bool:
        """Step until quiet long enough, then check balance. False when out of steps."""
        self.quiet_since_ms = self.clock.monotonic_ms()
        while self.step_count < steps_max:
            self.step()
            now_ms = self.clock.monotonic_ms()
            if any(w.paused_until_ms > now_ms or w.leaving for w in self.workers.values()):
                self.quiet_since_ms = now_ms
            elif now_ms - self.quiet_since_ms >= self.quiet_window_ms():
                self.check_balance()
                return True
        return False

    def quiet_window_ms(self) -> int:
        """One taker round plus one lease timeout, plus slack: two renew intervals (one to
        observe a counter, one to hand a stolen lease over) and two steps."""
        timeout_ms = self.config.lease_timeout_ms
        return (
            taker_interval_lease_timeouts * timeout_ms
            + timeout_ms
            + 2 * (timeout_ms // renews_per_lease_timeout)
            + 2 * self.config.step_ms
        )

    def step(self) -> None:
        self.step_count += 1
        self.clock.advance(self.config.step_ms)
        running = [
            w for w in self.workers.values() if self.clock.monotonic_ms() >= w.paused_until_ms
        ]
        self.rng.shuffle(running)
        for worker in running:
            if worker.name in self.workers:
                self.act(worker)
                self.check_consumers(worker)

    def set_faults(self, on: bool) -> None:
        self.faults_on = on
        for worker in self.workers.values():
            self._set_worker_faults(worker)

    def _set_worker_faults(self, worker: _Worker) -> None:
        config = self.config
        on = self.faults_on
        worker.store.set_failure_probability(config.failure_probability if on else 0.0)
        worker.store.set_delay(config.delay_probability if on else 0.0, config.delay_ms_max)

    # -- events ------------------------------------------------------------------------------

    def random_event(self) -> None:
        rng = self.rng
        live = [name for name, w in self.workers.items() if not w.leaving]
        kind = rng.choice(["join", "leave", "crash", "restart", "pause", "split", "merge"])
        if kind == "join" and len(live) < self.config.workers_max:
            self.join()
        elif kind == "restart" and self.crashed and len(live) < self.config.workers_max:
            self.join(self.crashed.pop(rng.randrange(len(self.crashed))))
        elif kind in ("leave", "crash", "pause") and len(live) > self.config.workers_min:
            name = rng.choice(sorted(live))
            if kind == "leave":
                self.workers[name].leaving = True
            elif kind == "crash":
                self.crash(name)
            else:
                self.pause(name, rng.randint(self.config.lease_timeout_ms + 1, 30_000))
        elif kind == "split":
            self.split()
        elif kind == "merge":
            self.merge()

    def join(self, name: str | None = None) -> str:
        if name is None:
            name = f"w{self.names_used}"
            self.names_used += 1
        store = FaultyLeaseStore(self.inner, self.rng, sleep=self.clock.advance)
        coordinator = self.factory(store, self.clock, name, self.config.lease_timeout_ms)
        worker = _Worker(name, store, coordinator)
        self.workers[name] = worker
        self._set_worker_faults(worker)
        return name

    def crash(self, name: str) -> None:
        worker = self.workers.pop(name)
        self.excused |= worker.consuming | worker.pending_final | worker.starting
        self.crashed.append(name)

    def pause(self, name: str, duration_ms: int) -> None:
        worker = self.workers[name]
        worker.paused_until_ms = self.clock.monotonic_ms() + duration_ms
        worker.faulted_at_ms = worker.paused_until_ms  # a pause is a fault too
        self.excused |= worker.consuming | worker.pending_final | worker.starting

    def split(self) -> None:
        """A read-write shard turns read-only at a near end; two children take its writes."""
        candidates = sorted(s for s in self.consumable if s not in self.ends)
        if not candidates or len(self.consumable) + 2 > self.config.shards_max:
            return
        self._retire([self.rng.choice(candidates)], children=2)

    def merge(self) -> None:
        candidates = sorted(s for s in self.consumable if s not in self.ends)
        if len(candidates) < 2 or len(self.consumable) <= self.config.shards_min:
            return
        self._retire(self.rng.sample(candidates, 2), children=1)

    def _retire(self, parents: list[int], children: int) -> None:
        for parent in parents:
            self.ends[parent] = self.delivered_upto.get(parent, 0) + self.rng.randint(0, 20)
        for _ in range(children):
            child = self.next_shard_id
            self.next_shard_id += 1
            if self.ordered:
                self.parents_of[child] = tuple(parents)
            else:
                self.consumable.add(child)

    def _finish(self, shard_id: int) -> None:
        self.consumable.discard(shard_id)
        self.finished.add(shard_id)
        self.quiet_since_ms = self.clock.monotonic_ms()
        for child, parents in list(self.parents_of.items()):
            if all(parent in self.finished for parent in parents):
                del self.parents_of[child]
                self.consumable.add(child)

    # -- one worker's turn -------------------------------------------------------------------

    def act(self, worker: _Worker) -> None:
        faults_before = worker.faults()
        if worker.leaving:
            self._leave(worker)
        else:
            self._run(worker)
        if worker.faults() != faults_before:
            worker.faulted_at_ms = self.clock.monotonic_ms()

    def _run(self, worker: _Worker) -> None:
        shards = sorted(self.consumable)
        coordinator = worker.coordinator
        try:
            if worker.started:
                decisions = coordinator.tick(shards)
            else:
                decisions = coordinator.start(shards)
                worker.started = True
        except DatabaseError:
            return
        for shard_id in decisions.stop:
            worker.starting.discard(shard_id)
            if shard_id in worker.consuming:
                worker.consuming.discard(shard_id)
                worker.pending_final.add(shard_id)
        worker.starting.update(decisions.start)
        self._flush_finals(worker)
        self._start_shards(worker)
        self._consume(worker)

    def _leave(self, worker: _Worker) -> None:
        """Shutdown order: stop consuming, write final checkpoints, then release the leases."""
        worker.pending_final |= worker.consuming
        worker.consuming.clear()
        worker.starting.clear()
        self._flush_finals(worker)
        if worker.pending_final:
            return
        try:
            worker.coordinator.shutdown()
        except DatabaseError:
            return
        del self.workers[worker.name]

    def _flush_finals(self, worker: _Worker) -> None:
        for shard_id in sorted(worker.pending_final):
            try:
                self.write_checkpoint(worker, shard_id)
            except DatabaseError:
                continue
            except LeaseLostError:
                self._excuse_if_faulted(worker, shard_id)
            worker.pending_final.discard(shard_id)

    def _excuse_if_faulted(self, worker: _Worker, shard_id: int) -> None:
        """A final checkpoint refused: only faults (a pause, or renews that could not tell the
        worker its lease was stolen in time) may cause it."""
        recent_ms = 2 * self.config.lease_timeout_ms
        if self.clock.monotonic_ms() - worker.faulted_at_ms <= recent_ms:
            self.excused.add(shard_id)
        else:
            self.fail(f"{worker.name} lost its final checkpoint of shard {shard_id} without faults")

    def _replay_excused(self, shard_id: int) -> bool:
        """A replay is allowed after a crash or a pause, or when the last deliverer had faults
        recently: its renews may have failed until its lease expired, and an expired lease is
        taken (and consumed) at once, possibly before the old holder's next turn lets it try
        its final checkpoint."""
        if shard_id in self.excused:
            return True
        last = self.workers.get(self.last_deliverer.get(shard_id, ""))
        recent_ms = 2 * self.config.lease_timeout_ms
        return last is not None and self.clock.monotonic_ms() - last.faulted_at_ms <= recent_ms

    def _start_shards(self, worker: _Worker) -> None:
        for shard_id in sorted(worker.starting):
            if not worker.coordinator.may_consume(shard_id):
                continue
            try:
                cursor = worker.coordinator.read_checkpoint(shard_id)
            except DatabaseError:
                continue
            worker.starting.discard(shard_id)
            worker.pending_final.discard(shard_id)
            position = int(cursor) if cursor else 0
            delivered = self.delivered_upto.get(shard_id, 0)
            if position < delivered and not self._replay_excused(shard_id):
                self.fail(
                    f"{worker.name} resumes shard {shard_id} at {position}, but "
                    f"{self.last_deliverer.get(shard_id)} delivered up to {delivered}"
                )
            self.excused.discard(shard_id)
            self.delivered_upto[shard_id] = position  # a replay is counted against its resumer
            worker.positions[shard_id] = position
            worker.consuming.add(shard_id)

    def _consume(self, worker: _Worker) -> None:
        periodic = self.step_count % self.config.checkpoint_every_steps == 0
        for shard_id in sorted(worker.consuming):
            if not worker.coordinator.may_consume(shard_id):
                continue
            self._check_belief(worker, shard_id)
            position = worker.positions[shard_id]
            end = self.ends.get(shard_id)
            if end is None or position < end:
                worker.positions[shard_id] = position + 1
                self.delivered_upto[shard_id] = max(
                    self.delivered_upto.get(shard_id, 0), position + 1
                )
                self.last_deliverer[shard_id] = worker.name
            if end is not None and worker.positions[shard_id] >= end:
                self._finish_read_only(worker, shard_id)
            elif periodic:
                try:
                    self.write_checkpoint(worker, shard_id)
                except (DatabaseError, LeaseLostError):
                    continue

    def _finish_read_only(self, worker: _Worker, shard_id: int) -> None:
        """The last checkpoint of a read-only shard, then it is finished for everyone."""
        try:
            self.write_checkpoint(worker, shard_id)
        except (DatabaseError, LeaseLostError):
            return
        worker.consuming.discard(shard_id)
        self._finish(shard_id)

    def write_checkpoint(self, worker: _Worker, shard_id: int) -> None:
        """Checker 3, around every checkpoint write."""
        before = self.inner.get_lease(shard_id)
        cursor = str(worker.positions[shard_id])
        try:
            worker.coordinator.checkpoint(shard_id, cursor)
        except LeaseLostError:
            after = self.inner.get_lease(shard_id)
            if before is not None and before.consumer_owner == worker.name:
                self.fail(f"{worker.name}'s checkpoint of shard {shard_id} refused as owner")
            if after != before:
                self.fail(f"a refused checkpoint of shard {shard_id} changed {before} to {after}")
            raise
        after = self.inner.get_lease(shard_id)
        if before is None or before.consumer_owner != worker.name:
            self.fail(f"{worker.name} wrote shard {shard_id}'s checkpoint as non-owner {before}")
        if after is None or after.checkpoint != cursor:
            self.fail(f"checkpoint of shard {shard_id} is {after}, expected {cursor}")

    # -- checkers ----------------------------------------------------------------------------

    def fail(self, message: str) -> NoReturn:
        raise InvariantViolation(
            f"{message} (step {self.step_count}, t={self.clock.monotonic_ms()} ms, "
            f"LOGHUB_SEED={self.seed})"
        )

    def _check_belief(self, worker: _Worker, shard_id: int) -> None:
        record = self.inner.get_lease(shard_id)
        owner = None if record is None else record.consumer_owner
        if owner != worker.name:
            self.fail(f"{worker.name} may consume shard {shard_id} whose consumer_owner is {owner}")

    def check_consumers(self, acted: _Worker | None = None) -> None:
        """Checker 1, for every worker (paused ones too: their belief is judged on the clock).

        A belief appears only by its worker's own action and is undone only by a store change
        or the clock, which only ends beliefs; so after ``acted`` acts, its beliefs and those
        about shards whose consumer_owner changed are all that can be newly wrong."""
        changed = self.inner.consumer_changes
        self.inner.consumer_changes = set()
        believers: Counter[int] = Counter()
        for worker in self.workers.values():
            held = worker.coordinator.renewer.held
            if acted is None:
                shards = set(held)
            elif worker is acted:  # _consume has just checked the shards it consumes
                shards = (held.keys() - worker.consuming) | (held.keys() & changed)
            else:
                shards = held.keys() & changed
            for shard_id in shards:
                if worker.coordinator.may_consume(shard_id):
                    self._check_belief(worker, shard_id)
                    believers[shard_id] += 1
        for shard_id, count in believers.items():
            if count > 1:
                self.fail(f"{count} workers may consume shard {shard_id}")

    def check_balance(self) -> None:
        """Checker 4."""
        self.balance_checks += 1
        running = {name for name, w in self.workers.items() if w.started}
        counts = Counter({name: 0 for name in running})
        for shard_id in sorted(self.consumable):
            record = self.inner.get_lease(shard_id)
            if record is None or record.lease_owner not in running:
                self.fail(f"shard {shard_id} not held by a running worker: {record}")
            owner = record.lease_owner
            if record.consumer_owner != owner:
                self.fail(f"shard {shard_id} held but not yet consumed: {record}")
            worker = self.workers[owner]
            if shard_id not in worker.consuming or not worker.coordinator.may_consume(shard_id):
                self.fail(f"{owner} holds shard {shard_id} but does not consume it")
            counts[owner] += 1
        if counts and max(counts.values()) - min(counts.values()) > 1:
            self.fail(f"unbalanced after a quiet spell: {dict(sorted(counts.items()))}")
