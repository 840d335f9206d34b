"""One shard's replicas under a simulated cluster: faults, failovers, checkers every step.

Why: the replica rules (``loghub.coordination.replica``) lose acknowledged data only when
faults meet at the worst moment: a follower restarts just before the leader dies, two leaders
fail one after the other, a deposed leader wakes up and goes on as if nothing happened. A
seeded simulation tries thousands of such moments in seconds and replays any failure exactly
from its seed (``LOGHUB_SEED=<seed>``).

The model: ``replicas`` replicas (three by default, ``min_insync_replicas`` two) and a control
plane that is a linearizable compare-and-swap register holding the shard's
``ShardLeadership``, with a lease per replica. Time is a ``FakeClock`` advanced one tick per
step; every choice comes from one ``random.Random(seed)``.

- Producers write unique payloads to a replica that believes it leads (a deposed one too);
  a write is acknowledged when ``is_acknowledged`` says so while its leader still leads its
  epoch, and is indeterminate (neither acknowledged nor refused) once that leader is gone.
- Followers fetch from the leader their copy of the record names, one fetch in flight,
  again after ``fetch_timeout_ms``; mostly once they have fsynced what the last fetch
  brought, sometimes before. Replicas fsync at random moments (group commit), within
  ``fsync_delay_ms_max`` of an append.
- The controller elects cleanly from the ISR once the leader's lease has expired or the
  leader restarted (a new session); a replica learns a new record through a watch that may
  lag, or at once when its compare-and-swap is refused.
- Consumers read from any replica that believes it leads.

Faults come in storms separated by calm spells: crashes (the unfsynced tail is lost) and
restarts, pauses (some longer than the lag bound and the lease), a replica cut off from the
control plane (its lease expires while it goes on serving), links between two replicas cut,
fetches and replies lost or delayed, and a newly elected leader crashed within a few ticks
(a fast double failover, sometimes after it took writes in its epoch). At the end every
fault is healed and the replicas must converge.

Checkers run after every step and raise ``AssertionError`` naming the seed:

1. below its own high watermark, every replica (offline ones too) holds the same records at
   the same offsets as every other: one lineage, the committed records, of which every
   acknowledged one is part;
2. every member of the control plane's ISR has fsynced every committed record (so every
   acknowledged one): the next clean leader holds them all;
3. a leader's high watermark never decreases within its epoch;
4. an acknowledged write is committed at the offset it was acknowledged at;
5. a read never returns a record at or above the high watermark of the replica it read from;
6. after healing: all replicas identical up to the high watermark, and every acknowledged
   payload readable exactly once, at the offset it was acknowledged at.

Not thread-safe; single-threaded by design.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field

from loghub.coordination.replica import (
    LINEAGE_TRUNCATION,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    LeaderState,
    Record,
    ReplicaLog,
    ReplicaRole,
    TruncationRule,
    advance_high_watermark,
    append_as_leader,
    become_follower,
    become_leader,
    clean_election,
    compare_and_swap,
    crash,
    fetch_request,
    follow_fetch_response,
    fsync,
    handle_fetch,
    is_acknowledged,
    isr_change,
    isr_changed,
    next_role,
    propose_isr,
    readable_records,
)
from loghub.errors import FencedError, LogHubError, NotEnoughReplicasError
from loghub.metadata.cluster_store import ShardLeadership
from loghub.testing.clock import FakeClock

__all__ = [
    "NO_FAULTS",
    "HighWatermarkTruncation",
    "ReplicaFaults",
    "ReplicaSimulation",
    "ReplicaStatistics",
]


class HighWatermarkTruncation:
    """Broken on purpose, as Kafka was before KIP-101: a follower cuts its log at its own
    high watermark (which lags the leader's by a fetch) when it starts following a leader,
    and on a diverging answer. For tests that show the checkers catch it; never use it."""

    def on_follow(self, log: ReplicaLog) -> int | None:
        return log.high_watermark

    def on_diverging(self, log: ReplicaLog, answer: EpochEndOffset) -> int:
        return log.high_watermark


@dataclass(frozen=True)
class ReplicaFaults:
    """Probabilities per step during storms (``double_failover`` per election)."""

    crash: float = 0.012
    pause: float = 0.012
    cut_off: float = 0.008  # a replica loses the control plane (lease, watch, CAS)
    link_down: float = 0.01  # two replicas stop hearing each other
    message_lost: float = 0.04  # each fetch, and each reply, on its own
    message_delayed: float = 0.2
    double_failover: float = 0.3


NO_FAULTS = ReplicaFaults(0, 0, 0, 0, 0, 0, 0)


@dataclass(frozen=True)
class ReplicaStatistics:
    seed: int
    steps: int
    heal_steps: int
    writes: int
    acks: int
    writes_refused: int
    writes_indeterminate: int
    stale_leader_appends: int
    reads: int
    records_read: int
    fetches: int
    fetches_fenced: int
    diverging_answers: int
    truncations: int
    records_truncated: int
    isr_shrinks: int
    isr_expands: int
    stale_cas_refused: int
    elections: int
    elections_blocked: int
    double_failovers: int
    depositions: int
    crashes: int
    records_lost_in_crashes: int
    restarts: int
    pauses: int
    cut_offs: int
    links_down: int
    messages_lost: int
    messages_delayed: int


@dataclass
class _Replica:
    replica_id: str
    log: ReplicaLog = field(default_factory=ReplicaLog)
    role: ReplicaRole = ReplicaRole.OFFLINE
    session: int = 0
    leader: LeaderState | None = None
    view: ShardLeadership | None = None  # the record as this replica last learned it
    following_epoch: int | None = None
    inflight: tuple[int, FetchRequest, int] | None = None  # (request id, request, sent ms)
    restart_ms: int = 0
    paused_until_ms: int = 0
    cut_off_until_ms: int = 0
    lease_expiry_ms: int = 0
    crash_at_ms: int | None = None
    tail_since_ms: int | None = None  # since when records wait for an fsync


@dataclass
class _Message:
    deliver_ms: int
    source: str
    destination: str
    request_id: int
    request: FetchRequest
    response: FetchResponse | None = None


@dataclass(frozen=True)
class _Pending:
    replica_id: str
    offset: int
    payload: bytes


class ReplicaSimulation:
    """One shard, ``replicas`` replicas, ``steps`` steps of faults then a heal; ``run()``."""

    def __init__(
        self,
        seed: int,
        *,
        steps: int = 300,
        replicas: int = 3,
        min_insync_replicas: int = 2,
        faults: ReplicaFaults | None = None,
        truncation: TruncationRule = LINEAGE_TRUNCATION,
        tick_ms: int = 10,
        replica_lag_ms: int = 100,
        lease_timeout_ms: int = 120,
        fetch_timeout_ms: int = 50,
        fsync_delay_ms_max: int = 30,
        heal_steps_max: int = 400,
    ) -> None:
        assert 2 <= replicas <= 9 and 1 <= min_insync_replicas <= replicas and steps >= 0
        self.seed = seed
        self.steps = steps
        self.min_insync_replicas = min_insync_replicas
        self.faults = faults if faults is not None else ReplicaFaults()
        self.truncation = truncation
        self.tick_ms = tick_ms
        self.replica_lag_ms = replica_lag_ms
        self.lease_timeout_ms = lease_timeout_ms
        self.fetch_timeout_ms = fetch_timeout_ms
        self.fsync_delay_ms_max = fsync_delay_ms_max
        self.heal_steps_max = heal_steps_max
        self.clock = FakeClock()
        self.random = random.Random(seed)
        ids = [f"r{i}" for i in range(replicas)]
        self._replicas = {replica_id: _Replica(replica_id) for replica_id in ids}
        self._ids = ids
        self._register = ShardLeadership(ids[0], 0, tuple(ids), 0)  # the control plane
        self._elected_session = 0
        self._wire: list[_Message] = []
        self._links_down: dict[frozenset[str], int] = {}
        # writes waiting for their acknowledgement, by (leader, epoch), in offset order
        self._pending: dict[tuple[str, int], deque[_Pending]] = {}
        self._acked: dict[bytes, int] = {}  # payload -> offset
        self._committed: tuple[Record, ...] = ()
        self._leader_high_watermarks: dict[tuple[str, int], int] = {}
        self._next_payload = 0
        self._next_request_id = 0
        self._next_session = 1
        self._storm = False
        self._phase_end_step = 0
        self._healing = False
        self._count: dict[str, int] = dict.fromkeys(ReplicaStatistics.__dataclass_fields__, 0)
        for replica in self._replicas.values():
            self._start(replica, 0)
        self._elected_session = self._replicas[ids[0]].session
        for replica in self._replicas.values():
            self._learn(replica, 0)

    def run(self) -> ReplicaStatistics:
        """Every step, then the heal; ``AssertionError`` naming the seed when a checker fails."""
        step = 0
        try:
            for step in range(self.steps):
                self._step(step)
            step = self.steps
            heal_steps = self._heal()
        except (AssertionError, LogHubError) as exc:
            raise AssertionError(
                f"{exc}\n[LOGHUB_SEED={self.seed} step={step} "
                f"now_ms={self.clock.monotonic_ms()}: replay with LOGHUB_SEED={self.seed}]"
            ) from exc
        values = {**self._count, "seed": self.seed, "steps": self.steps, "heal_steps": heal_steps}
        return ReplicaStatistics(**values)

    # -- one step ------------------------------------------------------------------------

    def _step(self, step: int) -> None:
        self.clock.advance(self.tick_ms)
        now = self.clock.monotonic_ms()
        if not self._healing and step >= self._phase_end_step:
            self._storm = not self._storm
            low, high = (20, 80) if self._storm else (10, 40)
            self._phase_end_step = step + self.random.randint(low, high)
        if self._storm:
            self._inject_faults(now)
        for replica in self._shuffled(list(self._replicas.values())):
            self._replica_step(replica, now)
        self._deliver(now)
        if not self._healing:
            self._produce(now)
        self._absorb_committed()
        self._acknowledge()
        self._consume()
        self._control(now)
        self._check()

    def _shuffled(self, items: list[_Replica]) -> list[_Replica]:
        self.random.shuffle(items)
        return items

    def _up(self, replica: _Replica, now: int) -> bool:
        """Running and not paused: able to act and to receive."""
        return replica.role is not ReplicaRole.OFFLINE and now >= replica.paused_until_ms

    def _connected(self, replica: _Replica, now: int) -> bool:
        return self._up(replica, now) and now >= replica.cut_off_until_ms

    # -- faults ----------------------------------------------------------------------------

    def _inject_faults(self, now: int) -> None:
        f, rng = self.faults, self.random
        running = [r for r in self._replicas.values() if r.role is not ReplicaRole.OFFLINE]
        if running and rng.random() < f.crash:
            self._crash(rng.choice(running), now)
        up = [r for r in self._replicas.values() if self._up(r, now)]
        if up and rng.random() < f.pause:
            replica = rng.choice(up)
            short = rng.random() < 0.5
            pause_ms = rng.randrange(self.tick_ms, 60 if short else 400, self.tick_ms)
            replica.paused_until_ms = now + pause_ms
            self._count["pauses"] += 1
        if up and rng.random() < f.cut_off:
            replica = rng.choice(up)
            replica.cut_off_until_ms = now + rng.randrange(50, 400, self.tick_ms)
            self._count["cut_offs"] += 1
        if rng.random() < f.link_down:
            pair = frozenset(rng.sample(self._ids, 2))
            self._links_down[pair] = now + rng.randrange(50, 300, self.tick_ms)
            self._count["links_down"] += 1

    def _crash(self, replica: _Replica, now: int) -> None:
        before = replica.log.log_end_offset
        replica.log = crash(replica.log)
        replica.role = next_role(replica.role, ReplicaRole.OFFLINE)
        replica.leader = None
        replica.view = None
        replica.following_epoch = None
        replica.inflight = None
        replica.tail_since_ms = None
        replica.paused_until_ms = 0
        replica.crash_at_ms = None
        replica.restart_ms = now + self.random.randrange(20, 200, self.tick_ms)
        self._count["crashes"] += 1
        self._count["records_lost_in_crashes"] += before - replica.log.log_end_offset

    def _start(self, replica: _Replica, now: int) -> None:
        """Up as a follower, in a new session, never as the leader it was (KIP-966)."""
        replica.role = next_role(replica.role, ReplicaRole.FOLLOWER)
        replica.session = self._next_session
        self._next_session += 1
        replica.lease_expiry_ms = now + self.lease_timeout_ms

    # -- a replica's own moves ----------------------------------------------------------------

    def _replica_step(self, replica: _Replica, now: int) -> None:
        if replica.crash_at_ms is not None and now >= replica.crash_at_ms:
            if replica.role is ReplicaRole.OFFLINE:
                replica.crash_at_ms = None  # elected while down: its lease had not run out
            else:
                self._crash(replica, now)
        if replica.role is ReplicaRole.OFFLINE:
            if now >= replica.restart_ms:
                self._start(replica, now)
                self._count["restarts"] += 1
                if self._connected(replica, now):
                    self._learn(replica, now)  # a node reads the control plane as it starts
            return
        if not self._up(replica, now):
            return
        if self._connected(replica, now):
            replica.lease_expiry_ms = now + self.lease_timeout_ms
            if self.random.random() < 0.5:
                self._learn(replica, now)  # the watch, which may lag
        self._group_commit(replica, now)
        if replica.role is ReplicaRole.LEADER:
            self._lead(replica, now)
        else:
            self._follow(replica, now)

    def _group_commit(self, replica: _Replica, now: int) -> None:
        """An fsync at a random moment, but within ``fsync_delay_ms_max`` of the append."""
        log = replica.log
        if log.fsynced_end_offset == log.log_end_offset:
            replica.tail_since_ms = None
            return
        if replica.tail_since_ms is None:
            replica.tail_since_ms = now
        if self.random.random() < 0.6 or now - replica.tail_since_ms >= self.fsync_delay_ms_max:
            replica.log = fsync(log)
            replica.tail_since_ms = None

    def _learn(self, replica: _Replica, now: int) -> None:
        """The replica reads the control plane's record and acts on it."""
        record = self._register
        if replica.view is not None and replica.view.version == record.version:
            return
        replica.view = record
        leader = replica.leader
        if leader is not None and (
            record.leader != replica.replica_id or record.leader_epoch != leader.leader_epoch
        ):
            replica.role = next_role(replica.role, ReplicaRole.FOLLOWER)  # deposed
            replica.leader = None
            replica.following_epoch = None
            self._count["depositions"] += 1
        if replica.role is ReplicaRole.LEADER:
            return
        if record.leader == replica.replica_id:
            if replica.session == self._elected_session:
                replica.role = next_role(replica.role, ReplicaRole.LEADER)
                replica.log, replica.leader = become_leader(
                    replica.log, record, replica.replica_id, now
                )
                replica.inflight = None
            return  # elected in an earlier session: it waits for the next election
        if replica.following_epoch != record.leader_epoch:
            replica.following_epoch = record.leader_epoch
            replica.inflight = None
            self._cut(replica, become_follower(replica.log, self.truncation))

    def _cut(self, replica: _Replica, log: ReplicaLog) -> None:
        removed = replica.log.log_end_offset - log.log_end_offset
        if removed > 0:
            self._count["truncations"] += 1
            self._count["records_truncated"] += removed
        replica.log = log

    def _lead(self, replica: _Replica, now: int) -> None:
        leader = replica.leader
        assert leader is not None
        replica.log = advance_high_watermark(replica.log, leader)  # after its own fsync
        isr = isr_change(replica.log, leader, now, self.replica_lag_ms)
        if isr is None or not self._connected(replica, now):
            return
        try:
            record = compare_and_swap(self._register, propose_isr(leader, isr))
        except FencedError:
            self._count["stale_cas_refused"] += 1
            self._learn(replica, now)  # a refused CAS answers with the current record
            return
        grew = len(isr) > len(leader.record.isr)
        self._register = record
        replica.view = record
        replica.log, replica.leader = isr_changed(replica.log, leader, record)
        self._count["isr_expands" if grew else "isr_shrinks"] += 1

    def _follow(self, replica: _Replica, now: int) -> None:
        view = replica.view
        if view is None or view.leader == replica.replica_id:
            return
        if replica.inflight is not None and now - replica.inflight[2] < self.fetch_timeout_ms:
            return
        unfsynced = replica.log.fsynced_end_offset < replica.log.log_end_offset
        if unfsynced and self.random.random() < 0.75:
            return  # mostly append, fsync, fetch; a follower may also fetch before its fsync
        request = fetch_request(replica.log, replica.replica_id, view.leader_epoch)
        self._next_request_id += 1
        replica.inflight = (self._next_request_id, request, now)
        self._send(_Message(now, replica.replica_id, view.leader, self._next_request_id, request))
        self._count["fetches"] += 1

    # -- the network ---------------------------------------------------------------------------

    def _send(self, message: _Message) -> None:
        rng = self.random
        if self._storm and rng.random() < self.faults.message_lost:
            self._count["messages_lost"] += 1
            return
        if self._storm and rng.random() < self.faults.message_delayed:
            message.deliver_ms += rng.randrange(self.tick_ms, 8 * self.tick_ms, self.tick_ms)
            self._count["messages_delayed"] += 1
        self._wire.append(message)

    def _deliver(self, now: int) -> None:
        due = [m for m in self._wire if m.deliver_ms <= now]
        if not due:
            return
        self._wire = [m for m in self._wire if m.deliver_ms > now]
        self.random.shuffle(due)
        for message in due:
            destination = self._replicas[message.destination]
            if destination.role is ReplicaRole.OFFLINE:
                continue  # the process is gone, and its connections with it
            if self._link_down(message, now):
                continue
            if not self._up(destination, now):
                message.deliver_ms = destination.paused_until_ms  # waits in the socket
                self._wire.append(message)
            elif message.response is None:
                self._serve_fetch(destination, message, now)
            else:
                self._take_response(destination, message)

    def _link_down(self, message: _Message, now: int) -> bool:
        until = self._links_down.get(frozenset((message.source, message.destination)))
        return until is not None and now < until

    def _serve_fetch(self, replica: _Replica, message: _Message, now: int) -> None:
        leader = replica.leader
        if leader is None:
            return  # not a leader (any more): the follower times out and asks its view again
        try:
            log, leader, response = handle_fetch(replica.log, leader, message.request, now)
        except FencedError:
            self._count["fetches_fenced"] += 1
            return
        replica.log, replica.leader = log, leader
        self._count["diverging_answers"] += response.diverging is not None
        reply = _Message(
            now, message.destination, message.source, message.request_id, message.request, response
        )
        self._send(reply)

    def _take_response(self, replica: _Replica, message: _Message) -> None:
        inflight = replica.inflight
        if inflight is None or inflight[0] != message.request_id:
            return  # an answer to a fetch given up on
        replica.inflight = None
        if replica.role is not ReplicaRole.FOLLOWER:
            return
        assert message.response is not None
        log = follow_fetch_response(replica.log, message.request, message.response, self.truncation)
        self._cut(replica, log)

    # -- producers and consumers ----------------------------------------------------------------

    def _believed_leaders(self) -> list[_Replica]:
        now = self.clock.monotonic_ms()
        return [r for r in self._replicas.values() if r.leader is not None and self._up(r, now)]

    def _produce(self, now: int) -> None:
        leaders = self._believed_leaders()
        if not leaders or self.random.random() < 0.3:
            return
        replica = self.random.choice(leaders)
        leader = replica.leader
        assert leader is not None
        payloads = [self._payload() for _ in range(self.random.randint(1, 3))]
        self._count["writes"] += len(payloads)
        try:
            log, end_offset = append_as_leader(
                replica.log, leader, payloads, self.min_insync_replicas
            )
        except NotEnoughReplicasError:
            self._count["writes_refused"] += len(payloads)
            return
        replica.log = log
        if leader.leader_epoch < self._register.leader_epoch:
            self._count["stale_leader_appends"] += len(payloads)
        first = end_offset - len(payloads)
        key = (replica.replica_id, leader.leader_epoch)
        waiting = self._pending.setdefault(key, deque())
        for index, payload in enumerate(payloads):
            waiting.append(_Pending(replica.replica_id, first + index, payload))

    def _payload(self) -> bytes:
        self._next_payload += 1
        return b"v%d" % self._next_payload

    def _acknowledge(self) -> None:
        """Checker 4: what a leader acknowledges is committed where it said."""
        now = self.clock.monotonic_ms()
        for key, waiting in list(self._pending.items()):
            replica = self._replicas[key[0]]
            leader = replica.leader
            if leader is None or leader.leader_epoch != key[1]:
                self._count["writes_indeterminate"] += len(waiting)
                del self._pending[key]
                continue
            if not self._up(replica, now):
                continue  # a paused leader answers nobody
            while waiting and is_acknowledged(
                replica.log, leader, waiting[0].offset + 1, self.min_insync_replicas
            ):
                self._check_acknowledged(waiting.popleft())
            if not waiting:
                del self._pending[key]

    def _check_acknowledged(self, pending: _Pending) -> None:
        offset = pending.offset
        committed = self._committed
        assert offset < len(committed) and committed[offset].payload == pending.payload, (
            f"{pending.replica_id} acknowledges {pending.payload!r} at offset {offset}, "
            f"which is not committed there"
        )
        self._acked[pending.payload] = offset
        self._count["acks"] += 1

    def _consume(self) -> None:
        """Checker 5: a read stops at the high watermark of the replica read from."""
        leaders = self._believed_leaders()
        if not leaders or self.random.random() < 0.5:
            return
        replica = self.random.choice(leaders)
        high_watermark = replica.log.high_watermark
        offset = self.random.randint(max(0, high_watermark - 4), high_watermark + 2)
        records = readable_records(replica.log, offset, 5)
        assert not records or offset + len(records) <= high_watermark, (
            f"a read from {replica.replica_id} at {offset} returned {len(records)} records, "
            f"above its high watermark {high_watermark}"
        )
        assert records == self._committed[offset : offset + len(records)], (
            f"a read from {replica.replica_id} at {offset} returned records not committed there"
        )
        self._count["reads"] += 1
        self._count["records_read"] += len(records)

    # -- the controller --------------------------------------------------------------------------

    def _control(self, now: int) -> None:
        record = self._register
        leader = self._replicas[record.leader]
        if leader.lease_expiry_ms > now and leader.session == self._elected_session:
            return
        live = [r for r in self._ids if self._replicas[r].lease_expiry_ms > now]
        self.random.shuffle(live)
        elected = clean_election(record, live)
        if elected is None:
            self._count["elections_blocked"] += 1
            return
        self._register = compare_and_swap(record, elected)
        new_leader = self._replicas[elected.leader]
        self._elected_session = new_leader.session
        self._count["elections"] += 1
        if self._storm and self.random.random() < self.faults.double_failover:
            new_leader.crash_at_ms = now + self.random.randrange(0, 12 * self.tick_ms, self.tick_ms)
            self._count["double_failovers"] += 1

    # -- checkers ------------------------------------------------------------------------------

    def _absorb_committed(self) -> None:
        """Checker 1: below every replica's high watermark lies one and the same lineage."""
        for replica in self._replicas.values():
            log = replica.log
            committed = self._committed
            below = log.records[: log.high_watermark]
            shared = min(len(below), len(committed))
            if below[:shared] != committed[:shared]:
                offset = next(i for i in range(shared) if below[i] != committed[i])
                raise AssertionError(
                    f"two records at offset {offset} below the high watermark: "
                    f"{replica.replica_id} holds {below[offset]}, committed is "
                    f"{committed[offset]}{self._acked_note(offset, offset + 1)}"
                )
            if len(below) > shared:
                self._committed = below

    def _check(self) -> None:
        self._check_isr_holds_committed()
        self._check_leader_high_watermarks()

    def _check_isr_holds_committed(self) -> None:
        """Checker 2: the next clean leader, whoever it is, holds every committed record."""
        committed = self._committed
        for member in self._register.isr:
            log = self._replicas[member].log
            if log.fsynced_end_offset < len(committed) or (
                log.records[: len(committed)] != committed
            ):
                raise AssertionError(
                    f"ISR member {member} lacks committed records: it has fsynced "
                    f"{log.fsynced_end_offset} of {len(committed)} committed "
                    f"(log {log.log_end_offset}, HW {log.high_watermark})"
                    f"{self._acked_note(log.fsynced_end_offset, len(committed))}"
                )

    def _check_leader_high_watermarks(self) -> None:
        """Checker 3: a leader's high watermark never goes back within its epoch."""
        for replica in self._replicas.values():
            leader = replica.leader
            if leader is None:
                continue
            key = (replica.replica_id, leader.leader_epoch)
            seen = self._leader_high_watermarks.get(key, 0)
            assert replica.log.high_watermark >= seen, (
                f"leader {key[0]} lowered its high watermark in epoch {key[1]}: "
                f"{seen} -> {replica.log.high_watermark}"
            )
            self._leader_high_watermarks[key] = replica.log.high_watermark

    def _acked_note(self, start: int, end: int) -> str:
        lost = sorted(offset for offset in self._acked.values() if start <= offset < end)
        return f"; acknowledged among them: offsets {lost}" if lost else ""

    # -- healing -----------------------------------------------------------------------------------

    def _heal(self) -> int:
        """Checker 6: every fault ends, the replicas converge, nothing acknowledged is lost."""
        self._healing = True
        self._storm = False
        self._links_down.clear()
        for replica in self._replicas.values():
            replica.paused_until_ms = replica.cut_off_until_ms = 0
            replica.crash_at_ms = None
            replica.restart_ms = min(replica.restart_ms, self.clock.monotonic_ms())
        for step in range(self.heal_steps_max):
            if self._converged():
                self._check_healed()
                return step
            self._step(self.steps + step)
        leader = self._replicas[self._register.leader]
        raise AssertionError(
            f"no convergence within {self.heal_steps_max} steps of healing: record "
            f"{self._register}, logs "
            + ", ".join(
                f"{r.replica_id}: {r.role.value} end {r.log.log_end_offset} "
                f"HW {r.log.high_watermark}"
                for r in self._replicas.values()
            )
            + self._lost_note(leader)
        )

    def _lost_note(self, replica: _Replica) -> str:
        records = replica.log.records
        lost = sorted(
            offset
            for payload, offset in self._acked.items()
            if offset >= len(records) or records[offset].payload != payload
        )
        return f"; {replica.replica_id} lacks acknowledged offsets {lost}" if lost else ""

    def _converged(self) -> bool:
        record = self._register
        leader = self._replicas[record.leader]
        if leader.leader is None or leader.leader.leader_epoch != record.leader_epoch:
            return False
        if len(record.isr) != len(self._replicas) or self._pending:
            return False
        end = leader.log.log_end_offset
        return all(
            r.log.log_end_offset == end and r.log.high_watermark == end
            for r in self._replicas.values()
        )

    def _check_healed(self) -> None:
        leader = self._replicas[self._register.leader]
        high_watermark = leader.log.high_watermark
        for replica in self._replicas.values():
            assert replica.log.records == leader.log.records, (
                f"healed, but {replica.replica_id} differs from the leader {leader.replica_id}"
            )
        readable: list[Record] = []
        while len(readable) < high_watermark:
            readable.extend(readable_records(leader.log, len(readable), 100))
        offsets: dict[bytes, list[int]] = {}
        for offset, record in enumerate(readable):
            offsets.setdefault(record.payload, []).append(offset)
        copies = Counter(len(found) for found in offsets.values())
        assert set(copies) <= {1}, f"healed, but some payloads are there twice: {copies}"
        for payload, offset in self._acked.items():
            assert offsets.get(payload) == [offset], (
                f"acknowledged {payload!r} at offset {offset}, healed it is at "
                f"{offsets.get(payload)}"
            )
