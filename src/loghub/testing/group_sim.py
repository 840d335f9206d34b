"""A simulated cluster around one ``ConsumerGroup``: many consumers, faults, splits, merges.

Why: the rules that keep a shard from being read twice only matter when things go wrong at
the worst moment (a reply lost just as a rebalance starts, a pause just longer than the
timeout, a split while a shard changes hands). A seeded simulation tries millions of such
moments quickly and replays any failure exactly from its seed (``LOGHUB_SEED=<seed>``).

Time is a ``FakeClock`` advanced one tick per step; every random choice comes from one
``random.Random(seed)``. The consumers behave like the SDK's ``ConsumerWorker``
(``reference/sls-protocol.md`` 7.3, 7.4):

- one heartbeat in flight at a time, every ``heartbeat_interval_ms``; a request or its reply
  may be lost (the consumer gives up after ``request_timeout_ms``) or delayed (less than that);
- the heart list is what it was granted plus what it still runs or is shutting down; a shard
  missing from a reply is shut down over a random hand-off time, its final checkpoint written
  (the group must accept it), and only then dropped from the heart list;
- it gives up all its shards at once (self-fencing) once it has had no successful heartbeat
  for ``timeout_ms``, measured from the send time of the last successful one; a reply that
  comes back later than that is thrown away.

Faults come in storms separated by calm spells (so that convergence can be checked): joins,
clean leaves (release everything, send a leave: one heartbeat reporting nothing, which may be
lost, then stop heartbeating), crashes, pauses (some longer
than the timeout), lost and delayed heartbeats, splits, merges, deletion of finished shards
and server restarts (the group is rebuilt with ``recovering=True``; checkpoints survive).

Checkers run after every step and raise ``AssertionError`` naming the seed:

1. no shard is consumed by two live (not crashed, not paused) consumers at once;
2. no shard is granted while another live consumer still reports it;
3. a checkpoint write by a consumer that is not the holder is refused (tried actively);
4. ordered groups: no shard in a live consumer's hands before all its ancestors are over,
   and none consumed before its ancestors are finished;
5. after a quiet spell (no fault, no reshard, no shard finishing) of the timeout plus four
   heartbeat intervals plus the hand-off and request times, the live consumers' counts
   differ by at most one, every consumable shard is held, and each consumer runs exactly
   what it was granted.

Besides, no log position is delivered twice unless a crash, a pause, a self-fence or a
refused checkpoint lost the progress made after the last checkpoint.

Not thread-safe; single-threaded by design.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from loghub.coordination.group import ConsumerGroup, ShardView
from loghub.coordination.shard_state import ShardState
from loghub.errors import LogHubError
from loghub.testing.clock import FakeClock

__all__ = ["GroupSimulation", "SimulationFaults", "SimulationStatistics"]


@dataclass(frozen=True)
class SimulationFaults:
    """Probabilities per step (per heartbeat for the ``heartbeat_*`` ones), during storms."""

    join: float = 0.02
    leave: float = 0.01
    crash: float = 0.01
    pause: float = 0.01
    split: float = 0.02
    merge: float = 0.015
    delete: float = 0.02
    restart: float = 0.002
    heartbeat_request_lost: float = 0.05
    heartbeat_reply_lost: float = 0.05
    heartbeat_delayed: float = 0.1


@dataclass(frozen=True)
class SimulationStatistics:
    seed: int
    steps: int
    heartbeats: int
    grants: int
    joins: int
    leaves: int
    crashes: int
    pauses: int
    self_fences: int
    requests_lost: int
    replies_lost: int
    heartbeats_delayed: int
    splits: int
    merges: int
    deletions: int
    restarts: int
    shards_finished: int
    positions_consumed: int
    positions_redelivered: int
    intruder_checkpoints_refused: int
    quiet_checks: int


@dataclass
class _Shard:
    shard_id: int
    parents: tuple[int, ...]
    ancestors: frozenset[int]
    read_only: bool = False
    length: int = 0  # positions written
    checkpoint: int = 0  # durable: the position to resume from
    delivered_max: int = 0  # the highest position any consumer has read to
    lost_max: int = 0  # a fault may have lost progress up to here: re-reading it is allowed

    @property
    def finished(self) -> bool:
        return self.read_only and self.checkpoint >= self.length


@dataclass
class _Request:
    consumer: _Consumer
    send_ms: int
    heart: list[int]
    arrive_ms: int | None  # None: lost on the way
    reply_delay_ms: int | None  # None: the reply is lost
    deadline_ms: int
    reply: list[int] | None = None
    reply_ms: int | None = None


@dataclass
class _Consumer:
    name: str
    status: str = "active"  # active, leaving, paused, crashed, left
    granted: set[int] = field(default_factory=set)
    running: dict[int, int] = field(default_factory=dict)  # shard -> next position to read
    persisted: dict[int, int] = field(default_factory=dict)  # shard -> last checkpoint written
    flushed_ms: dict[int, int] = field(default_factory=dict)
    releasing: dict[int, tuple[int, int]] = field(default_factory=dict)  # shard -> (done, pos)
    last_ok_send_ms: int | None = None
    request: _Request | None = None
    next_heartbeat_ms: int = 0
    paused_until_ms: int = 0

    @property
    def live(self) -> bool:
        return self.status in ("active", "leaving")

    def heart(self) -> set[int]:
        held = set(self.running) | set(self.releasing)
        return held if self.status == "leaving" else held | self.granted


class GroupSimulation:
    """One group, ``consumers`` SDK-like consumers, ``shards`` shards; ``run()`` the steps."""

    def __init__(
        self,
        seed: int,
        *,
        consumers: int = 10,
        shards: int = 64,
        ordered: bool = False,
        steps: int = 3000,
        faults: SimulationFaults | None = None,
        tick_ms: int = 100,
        heartbeat_interval_ms: int = 1000,
        request_timeout_ms: int = 500,
        handoff_ms_max: int = 1500,
        flush_interval_ms: int = 1000,
        read_positions_per_step: int = 20,
    ) -> None:
        assert consumers >= 1 and shards >= 1 and steps >= 0
        self.seed = seed
        self.ordered = ordered
        self.steps = steps
        self.faults = faults if faults is not None else SimulationFaults()
        self.tick_ms = tick_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.timeout_ms = 2 * heartbeat_interval_ms  # what ConsumerWorker asks for
        self.request_timeout_ms = request_timeout_ms
        self.handoff_ms_max = handoff_ms_max
        self.flush_interval_ms = flush_interval_ms
        self.read_positions_per_step = read_positions_per_step
        self.quiet_ms = (
            self.timeout_ms + 4 * heartbeat_interval_ms + handoff_ms_max + request_timeout_ms
        ) + 2 * tick_ms
        self.clock = FakeClock()
        self.random = random.Random(seed)
        self.group = ConsumerGroup("sim", self.timeout_ms, ordered, now_ms=0)
        self._target_consumers = consumers
        self._initial_shards = shards
        self._shards: dict[int, _Shard] = {i: _Shard(i, (), frozenset()) for i in range(shards)}
        self._next_shard_id = shards
        self._views: list[ShardView] | None = None
        self._consumers: dict[str, _Consumer] = {}  # not crashed, not left
        self._gone: set[str] = set()  # names of crashed and departed consumers
        self._next_name = 0
        self._wire: list[_Request] = []
        self._storm = False
        self._phase_end_step = 0
        self._disturbed_ms = 0
        self._restarted_ms: int | None = None
        self._count: dict[str, int] = dict.fromkeys(
            [f.name for f in SimulationStatistics.__dataclass_fields__.values()], 0
        )
        for _ in range(consumers):
            self._join(first_heartbeat_ms=self.random.randrange(0, heartbeat_interval_ms, tick_ms))

    def run(self) -> SimulationStatistics:
        """Run every step; raises ``AssertionError`` naming the seed when a checker fails."""
        for step in range(self.steps):
            try:
                self._step(step)
            except (AssertionError, LogHubError) as exc:
                raise AssertionError(
                    f"{exc}\n[LOGHUB_SEED={self.seed} ordered={self.ordered} step={step} "
                    f"now_ms={self.clock.monotonic_ms()}: replay with LOGHUB_SEED={self.seed}]"
                ) from exc
        values = {**self._count, "seed": self.seed, "steps": self.steps}
        return SimulationStatistics(**values)

    # -- one step -----------------------------------------------------------------------

    def _step(self, step: int) -> None:
        self.clock.advance(self.tick_ms)
        now = self.clock.monotonic_ms()
        if step >= self._phase_end_step:
            self._storm = not self._storm
            low, high = (50, 200) if self._storm else (100, 250)
            self._phase_end_step = step + self.random.randint(low, high)
        if self._storm:
            self._inject_faults(now)
        self._write(now)
        for consumer in self._shuffled(list(self._consumers.values())):
            self._consumer_step(consumer, now)
            if consumer.status in ("crashed", "left"):
                del self._consumers[consumer.name]  # its requests on the wire may still arrive
                self._gone.add(consumer.name)
        self._server_step(now)
        self._check(now)

    def _shuffled(self, items: list[_Consumer]) -> list[_Consumer]:
        self.random.shuffle(items)
        return items

    def _disturb(self, now: int) -> None:
        self._disturbed_ms = now

    def _inject_faults(self, now: int) -> None:
        f, rng = self.faults, self.random
        live = [c for c in self._consumers.values() if c.live]
        if rng.random() < f.join * (3 if len(live) < self._target_consumers else 1):
            self._join(now)
        if live and rng.random() < f.leave:
            self._leave(rng.choice(live), now)
        running = [c for c in self._consumers.values() if c.status in ("active", "leaving")]
        if running and rng.random() < f.crash:
            self._crash(rng.choice(running), now)
        active = [c for c in self._consumers.values() if c.status == "active"]
        if active and rng.random() < f.pause:
            self._pause(rng.choice(active), now)
        if rng.random() < f.split:
            self._split(now)
        if rng.random() < f.merge:
            self._merge(now)
        if rng.random() < f.delete:
            self._delete(now)
        if rng.random() < f.restart:
            self.group = ConsumerGroup("sim", self.timeout_ms, self.ordered, now, recovering=True)
            self._restarted_ms = now
            self._count["restarts"] += 1
            self._disturb(now)

    # -- faults -------------------------------------------------------------------------

    def _join(self, now: int = 0, first_heartbeat_ms: int | None = None) -> None:
        if self._gone and self.random.random() < 0.3:
            name = self.random.choice(sorted(self._gone))  # a restarted process keeps its name
            self._gone.discard(name)
        else:
            name = f"consumer-{self._next_name:03d}"
            self._next_name += 1
        start = now if first_heartbeat_ms is None else first_heartbeat_ms
        self._consumers[name] = _Consumer(name, next_heartbeat_ms=start)
        self._count["joins"] += 1
        self._disturb(now)

    def _leave(self, consumer: _Consumer, now: int) -> None:
        consumer.status = "leaving"
        self._count["leaves"] += 1
        self._disturb(now)

    def _crash(self, consumer: _Consumer, now: int) -> None:
        self._lose_progress(consumer)
        consumer.status = "crashed"
        consumer.request = None  # a request on the wire may still arrive; its reply is lost
        self._count["crashes"] += 1
        self._disturb(now)

    def _pause(self, consumer: _Consumer, now: int) -> None:
        if self.random.random() < 0.5:
            pause_ms = self.random.randrange(self.tick_ms, self.timeout_ms // 2, self.tick_ms)
        else:
            extra_ms = self.random.randrange(self.tick_ms, 2 * self.heartbeat_interval_ms)
            pause_ms = self.timeout_ms + extra_ms // self.tick_ms * self.tick_ms
        consumer.status = "paused"
        consumer.paused_until_ms = now + pause_ms
        for shard_id in [*consumer.running, *consumer.releasing]:  # the group may move on
            shard = self._shards.get(shard_id)
            if shard is not None:
                shard.lost_max = max(shard.lost_max, shard.delivered_max)
        self._count["pauses"] += 1
        self._disturb(now)

    def _writable(self) -> list[_Shard]:
        return [s for s in self._shards.values() if not s.read_only]

    def _add_child(self, parents: tuple[int, ...]) -> None:
        ancestors = frozenset(parents).union(*(self._shards[p].ancestors for p in parents))
        shard_id = self._next_shard_id
        self._next_shard_id += 1
        self._shards[shard_id] = _Shard(shard_id, parents, ancestors)

    def _seal(self, shard: _Shard, now: int) -> None:
        shard.read_only = True
        if shard.finished:  # empty, or read to its end already
            self._finished(now)

    def _split(self, now: int) -> None:
        writable = self._writable()
        if (
            len(writable) >= 2 * self._initial_shards
            or len(self._shards) >= 4 * self._initial_shards
        ):
            return
        parent = self.random.choice(writable)
        self._seal(parent, now)
        self._add_child((parent.shard_id,))
        self._add_child((parent.shard_id,))
        self._views = None
        self._count["splits"] += 1
        self._disturb(now)

    def _merge(self, now: int) -> None:
        writable = self._writable()
        if len(writable) <= max(2, self._initial_shards // 2):
            return
        first, second = self.random.sample(writable, 2)
        self._seal(first, now)
        self._seal(second, now)
        self._add_child((first.shard_id, second.shard_id))
        self._views = None
        self._count["merges"] += 1
        self._disturb(now)

    def _delete(self, now: int) -> None:
        """Retention removes a finished shard (its children treat it as over)."""
        finished = [s for s in self._shards.values() if s.finished]
        if not finished:
            return
        del self._shards[self.random.choice(finished).shard_id]
        self._views = None
        self._count["deletions"] += 1
        self._disturb(now)

    def _finished(self, now: int) -> None:
        self._views = None
        self._count["shards_finished"] += 1
        self._disturb(now)

    def _lose_progress(self, consumer: _Consumer) -> None:
        """Whatever was read after the last checkpoint may be read again."""
        for shard_id in [*consumer.running, *consumer.releasing]:
            shard = self._shards.get(shard_id)
            if shard is not None:
                shard.lost_max = max(shard.lost_max, shard.delivered_max)
        consumer.running.clear()
        consumer.releasing.clear()
        consumer.granted.clear()

    # -- the shards' data -----------------------------------------------------------------

    def _write(self, now: int) -> None:
        for shard in self._shards.values():
            if not shard.read_only and self.random.random() < 0.2:
                shard.length += self.random.randint(1, 3)

    def _shard_views(self) -> list[ShardView]:
        if self._views is None:
            self._views = [
                ShardView(s.shard_id, s.parents, s.finished)
                for s in sorted(self._shards.values(), key=lambda s: s.shard_id)
            ]
        return self._views

    # -- a consumer -----------------------------------------------------------------------

    def _consumer_step(self, consumer: _Consumer, now: int) -> None:
        if consumer.status == "paused" and now >= consumer.paused_until_ms:
            consumer.status = "active"
            self._disturb(now)
        if not consumer.live:
            return
        self._fence_if_cut_off(consumer, now)
        self._receive(consumer, now)
        self._release_and_start(consumer, now)
        self._read_and_flush(consumer, now)
        if consumer.status == "leaving" and not consumer.running and not consumer.releasing:
            if consumer.request is None:
                self._send(consumer, now)  # the leave: its heart is empty now
            consumer.status = "left"  # then silence; a lost leave is timed out
            return
        if consumer.request is None and now >= consumer.next_heartbeat_ms:
            self._send(consumer, now)

    def _fence_if_cut_off(self, consumer: _Consumer, now: int) -> None:
        last = consumer.last_ok_send_ms
        holds = consumer.running or consumer.releasing or consumer.granted
        if last is not None and now - last >= self.timeout_ms and holds:
            self._lose_progress(consumer)
            self._count["self_fences"] += 1
            self._disturb(now)

    def _receive(self, consumer: _Consumer, now: int) -> None:
        request = consumer.request
        if request is None:
            return
        if request.reply is not None and request.reply_ms is not None and request.reply_ms <= now:
            consumer.request = None
            if now - request.send_ms >= self.timeout_ms:
                return  # too late: the consumer has fenced itself meanwhile
            consumer.last_ok_send_ms = request.send_ms
            granted = set(request.reply)
            if consumer.status == "active":
                self._check_grants(consumer, granted - consumer.heart())
            consumer.granted = granted
        elif now >= request.deadline_ms:
            consumer.request = None  # failed: the held set is kept (7.3), retry at once
            consumer.next_heartbeat_ms = now

    def _release_and_start(self, consumer: _Consumer, now: int) -> None:
        for shard_id, (done_ms, position) in list(consumer.releasing.items()):
            if now >= done_ms:
                if consumer.persisted.get(shard_id) != position:
                    self._write_checkpoint(consumer, shard_id, position, now)
                del consumer.releasing[shard_id]
        wanted = consumer.granted if consumer.status == "active" else set()
        for shard_id in [s for s in consumer.running if s not in wanted]:
            handoff_ms = self.random.randrange(0, self.handoff_ms_max + 1, self.tick_ms)
            consumer.releasing[shard_id] = (now + handoff_ms, consumer.running.pop(shard_id))
        for shard_id in sorted(wanted - set(consumer.running) - set(consumer.releasing)):
            shard = self._shards.get(shard_id)
            if shard is not None:
                self._start(consumer, shard, now)

    def _start(self, consumer: _Consumer, shard: _Shard, now: int) -> None:
        if self.ordered:  # checked once: in the simulation a finished shard stays finished
            self._check_ancestors_finished(shard, f"{consumer.name} starts")
        position = shard.checkpoint
        if position < shard.delivered_max:
            assert shard.delivered_max <= shard.lost_max, (
                f"{consumer.name} starts shard {shard.shard_id} at {position}, but positions up "
                f"to {shard.delivered_max} were delivered and no fault lost them: a planned "
                "move delivered logs twice"
            )
            self._count["positions_redelivered"] += shard.delivered_max - position
        consumer.running[shard.shard_id] = position
        consumer.persisted[shard.shard_id] = position
        consumer.flushed_ms[shard.shard_id] = now

    def _read_and_flush(self, consumer: _Consumer, now: int) -> None:
        running, persisted, flushed_ms = consumer.running, consumer.persisted, consumer.flushed_ms
        for shard_id, position in running.items():
            shard = self._shards.get(shard_id)
            if shard is None:
                continue
            read = min(self.read_positions_per_step, shard.length - position)
            if read > 0:
                position += read
                running[shard_id] = position
                if position > shard.delivered_max:
                    shard.delivered_max = position
                self._count["positions_consumed"] += read
            if position != persisted[shard_id] and (
                now - flushed_ms[shard_id] >= self.flush_interval_ms
                or (shard.read_only and position >= shard.length)
            ):
                self._write_checkpoint(consumer, shard_id, position, now)

    def _write_checkpoint(
        self, consumer: _Consumer, shard_id: int, position: int, now: int
    ) -> None:
        shard = self._shards.get(shard_id)
        if shard is None:
            return
        consumer.flushed_ms[shard_id] = now
        if not self.group.can_checkpoint(consumer.name, shard_id):
            recent = (
                self._restarted_ms is not None and now - self._restarted_ms <= 3 * self.timeout_ms
            )
            assert recent, (
                f"{consumer.name} holds shard {shard_id} but its checkpoint was refused "
                f"(state {self.group.shard_states().get(shard_id)})"
            )
            # After a restart two consumers may report a shard (one of them stale); neither
            # is its holder until the stale one stops. The progress may be read again.
            shard.lost_max = max(shard.lost_max, shard.delivered_max)
            return
        assert position >= shard.checkpoint, (
            f"{consumer.name} moves the checkpoint of shard {shard_id} back from "
            f"{shard.checkpoint} to {position}: someone else read it meanwhile"
        )
        was_finished = shard.finished
        shard.checkpoint = position
        consumer.persisted[shard_id] = position
        if shard.finished and not was_finished:
            self._finished(now)

    def _send(self, consumer: _Consumer, now: int) -> None:
        f, rng = self.faults, self.random
        delay_max = self.request_timeout_ms - self.tick_ms
        request_lost = self._storm and rng.random() < f.heartbeat_request_lost
        reply_lost = self._storm and rng.random() < f.heartbeat_reply_lost
        delayed = self._storm and rng.random() < f.heartbeat_delayed
        request_delay = rng.randrange(0, delay_max // 2 + 1, self.tick_ms) if delayed else 0
        reply_delay = rng.randrange(0, delay_max // 2 + 1, self.tick_ms) if delayed else 0
        request = _Request(
            consumer=consumer,
            send_ms=now,
            heart=sorted(consumer.heart()),
            arrive_ms=None if request_lost else now + request_delay,
            reply_delay_ms=None if reply_lost else reply_delay,
            deadline_ms=now + self.request_timeout_ms,
        )
        consumer.request = request
        consumer.next_heartbeat_ms = now + self.heartbeat_interval_ms
        self._wire.append(request)
        self._count["heartbeats"] += 1
        self._count["requests_lost"] += request_lost
        self._count["replies_lost"] += reply_lost and not request_lost
        self._count["heartbeats_delayed"] += delayed
        if request_lost or reply_lost or delayed:
            self._disturb(now)

    # -- the server -------------------------------------------------------------------------

    def _server_step(self, now: int) -> None:
        arrived = [r for r in self._wire if r.arrive_ms is not None and r.arrive_ms <= now]
        self._wire = [r for r in self._wire if r.arrive_ms is not None and r.arrive_ms > now]
        self.random.shuffle(arrived)
        for request in arrived:
            reply = self.group.heartbeat(
                request.consumer.name, request.heart, self._shard_views(), now
            )
            if request.reply_delay_ms is not None and request.consumer.request is request:
                request.reply = reply
                request.reply_ms = now + request.reply_delay_ms

    # -- checkers -----------------------------------------------------------------------------

    def _check_grants(self, consumer: _Consumer, new: set[int]) -> None:
        """Checker 2: nobody else live still reports a shard this consumer is newly given."""
        if not new:
            return
        self._count["grants"] += len(new)
        for other in self._consumers.values():
            if other is not consumer and other.live:
                both = new & other.heart()
                assert not both, (
                    f"{consumer.name} is given shards {sorted(both)} that {other.name} still "
                    "reports"
                )

    def _check_ancestors_finished(self, shard: _Shard, who: str) -> None:
        for ancestor in shard.ancestors:
            parent = self._shards.get(ancestor)
            assert parent is None or parent.finished, (
                f"ordered group: {who} shard {shard.shard_id} before its ancestor "
                f"{ancestor} is finished"
            )

    def _check(self, now: int) -> None:
        live = [c for c in self._consumers.values() if c.live]
        reader: dict[int, str] = {}
        for consumer in live:
            for shard_id in consumer.running:
                assert shard_id not in reader, (
                    f"shard {shard_id} is consumed by {reader[shard_id]} and {consumer.name}"
                )
                reader[shard_id] = consumer.name
        if reader and self.random.random() < 0.3:
            self._check_intruder(reader)
        if self.ordered:
            self._check_ordered_states()
        if now - self._disturbed_ms >= self.quiet_ms:
            self._check_converged(live)

    def _check_intruder(self, reader: dict[int, str]) -> None:
        """Checker 3: a checkpoint by anyone but the reader of a shard is refused."""
        shard_id = self.random.choice(sorted(reader))
        names = sorted((set(self._consumers) | self._gone) - {reader[shard_id]}) + ["intruder"]
        intruder = self.random.choice(names)
        assert not self.group.can_checkpoint(intruder, shard_id), (
            f"{intruder} may checkpoint shard {shard_id}, which {reader[shard_id]} consumes"
        )
        self._count["intruder_checkpoints_refused"] += 1

    def _check_ordered_states(self) -> None:
        """Checker 4, server side: nothing is handed out before its ancestors are over."""
        states = self.group.shard_states()
        for shard_id, state in states.items():
            if state in (ShardState.ALREADY_ALLOC, ShardState.TRANSFER):
                shard = self._shards.get(shard_id)
                for ancestor in shard.ancestors if shard is not None else ():
                    assert states.get(ancestor, ShardState.OVER) is ShardState.OVER, (
                        f"ordered group: shard {shard_id} is {state.value} while its ancestor "
                        f"{ancestor} is {states[ancestor].value}"
                    )

    def _check_converged(self, live: list[_Consumer]) -> None:
        """Checker 5: after a quiet spell, balanced, everything held, everyone in step."""
        self._count["quiet_checks"] += 1
        assignments = self.group.assignments()
        names = sorted(c.name for c in live)
        assert sorted(assignments) == names, (
            f"quiet: the group's consumers {sorted(assignments)} are not the live ones {names}"
        )
        if not live:
            return
        counts = {name: len(shards) for name, shards in assignments.items()}
        assert max(counts.values()) - min(counts.values()) <= 1, f"quiet: unbalanced {counts}"
        stats = self.group.statistics()
        assert stats.not_alloc == 0 and stats.transfer == 0, f"quiet: not all held: {stats}"
        for consumer in live:
            assert sorted(consumer.running) == assignments[consumer.name], (
                f"quiet: {consumer.name} runs {sorted(consumer.running)}, "
                f"granted {assignments[consumer.name]}"
            )
