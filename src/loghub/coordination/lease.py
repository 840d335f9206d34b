"""The client-side lease protocol (``spec/lease-protocol.md``): consumers share a logstore's
shards through lease rows in an external SQL database, with no help from the log server.

Roles, as in the Kinesis Client Library:

- ``LeaseStore``: the table behind it (``lease_sql.SqlLeaseStore``, or
  ``loghub.testing.lease_store.MemoryLeaseStore``). Every lease write is a compare-and-set in
  one statement: ``UPDATE ... WHERE lease_counter = :seen`` that increments the counter.
  Checkpoint writes are a compare-and-set on ``consumer_owner`` instead (see ``write_checkpoint``).
- ``Lease``: a lease row as this worker observed it, with the local monotonic time at which it
  first saw that counter. ``is_expired(now_ms, lease_timeout_ms)`` is judged from that local
  observation only: no other machine's clock is ever trusted.
- ``LeaseTaker``: one taker round as a pure plan (``plan``): targets from ``balance.targets``
  (shards // live workers, plus one for the ``shards % live`` workers holding the most), so
  the server's consumer group and this protocol balance alike; take free and expired leases
  first, then steal the rest in one round, as ``balance.plan_moves`` says.
- ``LeaseRenewer``: the leases this worker holds; bumps their counters, hands consumption over
  to itself once a stolen lease's wait is over, and reports leases lost to a compare-and-set.
- ``LeaseCoordinator``: what a consumer library drives: ``start`` then ``tick`` from its loop,
  ``may_consume`` before processing, ``checkpoint`` to persist progress, ``shutdown`` to leave.

Why a stolen shard is safe. A worker may consume a shard only while it is ``consumer_owner`` and
less than one lease timeout has passed since the start of its last successful write to that
lease. A thief sets only ``lease_owner``, and sets ``consumer_owner`` one lease timeout after
its steal: by then the old holder's own deadline has passed (its last winning write committed
before the thief read the counter it stole from), and in the normal case the old holder has
long since lost a renew, stopped and written its final checkpoint, which it may still do because
it is still ``consumer_owner``. Taking an *expired* lease hands consumption over at once: the
holder's deadline passed before the lease looked expired to anyone.

Held lease life cycle (``LeaseState``)::

    take free/expired ─────────────────────────────> CONSUMING ──┐
    steal ──> WAITING ──(one lease timeout later, renew sets      │ renew loses the CAS,
                │        consumer_owner = me)──────> CONSUMING    │ or release
                └─────────────────────────────────────────────────┴──> (gone)

Thread-safety: none. A coordinator belongs to one loop (or is guarded by its caller's lock).
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from loghub._clock import Clock
from loghub.coordination.balance import plan_moves, targets
from loghub.errors import DatabaseError, IllegalTransition, LeaseLostError, ParameterInvalid

__all__ = [
    "Decisions",
    "HeldLease",
    "Lease",
    "LeaseCoordinator",
    "LeaseRecord",
    "LeaseRenewer",
    "LeaseState",
    "LeaseStatistics",
    "LeaseStore",
    "LeaseTaker",
    "TakePlan",
    "checkpoint_length_max",
    "lease_timeout_ms_default",
    "lease_timeout_ms_min",
    "observe",
    "renews_per_lease_timeout",
    "shards_per_group_max",
    "take_attempts_max",
    "taker_interval_lease_timeouts",
    "worker_name_length_max",
]

# KCL's default failover time. Shorter means faster failover and more database writes.
lease_timeout_ms_default = 10_000
# Below this, one slow database round trip would cost leases.
lease_timeout_ms_min = 100
# The spec: the taker runs every 2 x lease timeout ...
taker_interval_lease_timeouts = 2
# ... and the renewer more often than every lease timeout / 2: three times, so a lease
# survives two failed renews in a row.
renews_per_lease_timeout = 3
# A taker round that loses a compare-and-set (another worker wrote the lease first) reads the
# table again and plans again at once, at most this many times in all, instead of waiting a
# whole taker round short of its share.
take_attempts_max = 3
# At the limit ``tick`` raises ParameterInvalid: the caller passed more shards than a group
# can hold (a logstore has at most 4096 shard ids ever).
shards_per_group_max = 4096
# The width of the name columns; longer names are refused (ParameterInvalid).
worker_name_length_max = 128
# A LogHub cursor is short; anything much longer is not a cursor (ParameterInvalid).
checkpoint_length_max = 1024


@dataclass(frozen=True)
class LeaseRecord:
    """One ``shard_lease`` row, as the store holds it. Empty strings mean "nobody"."""

    shard_id: int
    lease_counter: int
    lease_owner: str = ""
    consumer_owner: str = ""
    checkpoint: str = ""


class LeaseStore(Protocol):
    """The lease table of one consumer group of one logstore.

    Errors: a store that cannot reach its database raises ``DatabaseError``; nothing else.
    Stores stamp ``created_at``/``heartbeat_at``/``updated_at`` with their own wall clock, for
    monitoring and for ``recent_workers`` only (which workers count as live before they hold
    a lease; never whether a lease has expired).
    """

    def register_worker(self, worker_name: str) -> None:
        """Insert or refresh this worker's row (``heartbeat_at`` = now)."""
        ...

    def heartbeat(self, worker_name: str) -> None: ...

    def remove_worker(self, worker_name: str) -> None: ...

    def recent_workers(self, within_ms: int) -> list[str]:
        """Workers whose ``heartbeat_at`` is at most ``within_ms`` old, by name."""
        ...

    def list_leases(self) -> list[LeaseRecord]: ...

    def get_lease(self, shard_id: int) -> LeaseRecord | None: ...

    def create_leases(self, shard_ids: Collection[int]) -> None:
        """Create a free lease (counter 0, no owner) for each shard that has none."""
        ...

    def compare_and_set(
        self, shard_id: int, seen_counter: int, lease_owner: str, consumer_owner: str | None
    ) -> bool:
        """Set the owners (``consumer_owner`` None keeps it) and increment the counter, only if
        the counter is still ``seen_counter``. True when this write won."""
        ...

    def write_checkpoint(self, shard_id: int, consumer_owner: str, checkpoint: str) -> bool:
        """Set the checkpoint only if ``consumer_owner`` is still the given worker. True when
        written. It leaves the counter alone: the counter is the lease's liveness token, and
        bumping it would make the holder's own next renew look like a theft."""
        ...


@dataclass(frozen=True)
class Lease:
    """A lease as this worker observed it: the row plus when this counter was first seen."""

    record: LeaseRecord
    counter_seen_at_ms: int  # local monotonic time at which this counter was first seen

    @property
    def shard_id(self) -> int:
        return self.record.shard_id

    @property
    def lease_owner(self) -> str:
        return self.record.lease_owner

    def is_free(self) -> bool:
        """Nobody holds it: never taken (counter 0), or released by a worker that left."""
        return self.record.lease_owner == ""

    def is_expired(self, now_ms: int, lease_timeout_ms: int) -> bool:
        """Held, but its counter has not moved for longer than the lease timeout, as measured
        on this machine's monotonic clock."""
        return not self.is_free() and now_ms - self.counter_seen_at_ms > lease_timeout_ms


def observe(
    previous: Mapping[int, Lease], records: Iterable[LeaseRecord], seen_at_ms: int
) -> dict[int, Lease]:
    """The new observations: a lease keeps its first-seen time while its counter is unchanged.
    ``seen_at_ms`` must be read after the records were read, so expiry is never judged early."""
    observed = {}
    for record in records:
        before = previous.get(record.shard_id)
        same = before is not None and before.record.lease_counter == record.lease_counter
        seen = before.counter_seen_at_ms if same and before is not None else seen_at_ms
        observed[record.shard_id] = Lease(record, seen)
    return observed


@dataclass(frozen=True)
class TakePlan:
    """One taker round. ``take``: free, expired or this worker's own orphaned leases;
    ``steal``: live leases of other workers."""

    take: tuple[Lease, ...] = ()
    steal: tuple[Lease, ...] = ()
    target: int = 0


def _spread_key(worker_name: str, shard_id: int) -> int:
    """A stable order per worker, so that workers racing for leases mostly pick different ones."""
    return zlib.crc32(f"{worker_name}/{shard_id}".encode())


class LeaseTaker:
    """Plans a taker round. ``steal_max_per_round`` None is the spec's one-round steal; 1 is
    the policy common elsewhere (KCL's ``maxLeasesToStealAtOneTime``), kept for comparison."""

    def __init__(
        self, worker_name: str, lease_timeout_ms: int, steal_max_per_round: int | None = None
    ) -> None:
        assert steal_max_per_round is None or steal_max_per_round >= 1
        self.worker_name = worker_name
        self.lease_timeout_ms = lease_timeout_ms
        self.steal_max_per_round = steal_max_per_round

    def plan(
        self,
        leases: Mapping[int, Lease],
        shard_ids: Collection[int],
        held: Collection[int],
        now_ms: int,
        extra_live: Collection[str] = (),
        *,
        steal: bool = True,
    ) -> TakePlan:
        """Pure: which leases to take and steal, given the observations, the consumable shards,
        the shards this worker holds, and workers known live otherwise (registered and
        heartbeating, but holding nothing yet). ``steal`` False plans only the take of free
        and expired leases (the quick round run at every renew).

        Targets and steals come from ``balance`` (the one balancer both modes share): free
        and expired leases are taken first, up to this worker's target; then the shards that
        ``balance.plan_moves`` gives this worker are stolen. Workers that see the same table
        compute the same moves, so two thieves rarely reach for the same lease.
        """
        me = self.worker_name
        holders: dict[int, str | None] = {}
        available: list[Lease] = []
        for shard_id in shard_ids:
            lease = leases.get(shard_id)
            if lease is None:
                continue
            if shard_id in held:
                holders[shard_id] = me
            elif (
                lease.is_free()
                or lease.is_expired(now_ms, self.lease_timeout_ms)
                or lease.lease_owner == me  # a write of ours that we believed lost
            ):
                holders[shard_id] = None
                available.append(lease)
            else:
                holders[shard_id] = lease.lease_owner
        live = sorted({h for h in holders.values() if h is not None} | set(extra_live) | {me})
        # Free and expired leases by targets that every worker computes alike, so workers taking
        # a dead one's leases at once share them out; ties favour this worker only for steals.
        target = targets(live, holders, prefer=None if not steal else me)[me]
        need = target - sum(1 for holder in holders.values() if holder == me)
        if need <= 0:
            return TakePlan(target=target)
        # Own orphans first, then a spread order.
        available.sort(key=lambda lease: (lease.lease_owner != me, _spread_key(me, lease.shard_id)))
        take = available[:need]
        if not steal:
            return TakePlan(take=tuple(take), target=target)
        after = dict(holders) | {lease.shard_id: me for lease in take}
        moves = [
            shard for shard, worker in plan_moves(live, after, prefer=me).items() if worker == me
        ]
        take.extend(leases[shard] for shard in moves if after[shard] is None)
        stolen = [leases[shard] for shard in moves if after[shard] is not None]
        if self.steal_max_per_round is not None:
            stolen = stolen[: self.steal_max_per_round]  # most loaded first: the moves' order
        target = max(target, targets(live, after, prefer=me)[me])
        return TakePlan(take=tuple(take), steal=tuple(stolen), target=target)


class LeaseState(enum.Enum):
    """A lease this worker holds; the diagram is in the module docstring."""

    WAITING = "waiting"  # lease_owner is me; consumer_owner not yet (stolen, old holder's turn)
    CONSUMING = "consuming"  # lease_owner and consumer_owner are me


_VALID_PREVIOUS: dict[LeaseState, frozenset[LeaseState]] = {
    LeaseState.WAITING: frozenset(),
    LeaseState.CONSUMING: frozenset({LeaseState.WAITING}),
}


@dataclass
class HeldLease:
    """A lease this worker holds (mutable, owned by the renewer)."""

    shard_id: int
    lease_counter: int  # the counter our last winning write left
    state: LeaseState
    renewed_at_ms: int  # local monotonic time read just before our last winning write
    consume_from_ms: int  # WAITING: when we may set consumer_owner to ourselves

    def transition_to(self, state: LeaseState) -> None:
        if self.state not in _VALID_PREVIOUS[state]:
            raise IllegalTransition(f"shard {self.shard_id}: {self.state.value} -> {state.value}")
        self.state = state

    def may_consume(self, now_ms: int, lease_timeout_ms: int) -> bool:
        """Consumer, and within one lease timeout of the start of our last winning write: past
        that, somebody may already see the lease as expired and take it."""
        return self.state is LeaseState.CONSUMING and now_ms - self.renewed_at_ms < lease_timeout_ms


class LeaseRenewer:
    """The leases this worker holds: renews them, hands stolen ones over, releases them."""

    def __init__(self, store: LeaseStore, worker_name: str, lease_timeout_ms: int) -> None:
        self.store = store
        self.worker_name = worker_name
        self.lease_timeout_ms = lease_timeout_ms
        self.held: dict[int, HeldLease] = {}
        self.store_errors = 0

    def acquire(self, lease: Lease, now_ms: int, *, stolen: bool) -> bool:
        """Take or steal ``lease`` with a compare-and-set on the counter seen. Consumption is
        ours at once unless ``must_wait``."""
        record = lease.record
        wait = self.must_wait(lease, now_ms, stolen=stolen)
        consumer = None if wait else self.worker_name
        if not self.store.compare_and_set(
            record.shard_id, record.lease_counter, self.worker_name, consumer
        ):
            return False
        state = LeaseState.WAITING if wait else LeaseState.CONSUMING
        # The wait counts from after our write: the old holder's last winning write committed
        # before we read the counter we stole from, so its deadline is behind ours.
        consume_from_ms = now_ms + self.lease_timeout_ms if wait else now_ms
        self.held[record.shard_id] = HeldLease(
            record.shard_id, record.lease_counter + 1, state, now_ms, consume_from_ms
        )
        return True

    def must_wait(self, lease: Lease, now_ms: int, *, stolen: bool) -> bool:
        """Whether another worker may still be consuming: after a steal, or when a free lease's
        consumer_owner is someone else. An expired lease never waits: its holder's deadline
        passed before the lease looked expired here."""
        foreign_consumer = lease.record.consumer_owner not in ("", self.worker_name)
        return stolen or (foreign_consumer and not lease.is_expired(now_ms, self.lease_timeout_ms))

    def renew_all(self, clock: Clock) -> list[int]:
        """One renew round; returns the shards lost (a compare-and-set lost: stop consuming,
        save the checkpoint, let go). A store error leaves a lease held, its deadline running."""
        lost = []
        for shard_id, held in sorted(self.held.items()):
            now_ms = clock.monotonic_ms()  # before the write: our deadline counts from here
            handover = held.state is LeaseState.WAITING and now_ms >= held.consume_from_ms
            consumer = self.worker_name if handover else None
            try:
                won = self.store.compare_and_set(
                    shard_id, held.lease_counter, self.worker_name, consumer
                )
            except DatabaseError:
                self.store_errors += 1
                continue
            if not won:
                del self.held[shard_id]
                lost.append(shard_id)
                continue
            held.lease_counter += 1
            held.renewed_at_ms = now_ms
            if handover:
                held.transition_to(LeaseState.CONSUMING)
        return lost

    def release(self, shard_id: int) -> None:
        """Give a lease back (leaving, or the shard is finished). Clears consumer_owner only if
        it is ours: if we were still waiting, the old holder may still be consuming. A store
        error keeps the lease held (raises), so the caller can retry."""
        held = self.held[shard_id]
        consumer = "" if held.state is LeaseState.CONSUMING else None
        self.store.compare_and_set(shard_id, held.lease_counter, "", consumer)
        del self.held[shard_id]

    def may_consume(self, shard_id: int, now_ms: int) -> bool:
        held = self.held.get(shard_id)
        return held is not None and held.may_consume(now_ms, self.lease_timeout_ms)


@dataclass(frozen=True)
class Decisions:
    """What the consumer library should do after a ``tick``.

    ``start``: shards it may consume now: read their checkpoint (``read_checkpoint``) and start.
    ``stop``: shards to stop consuming now: stop fetching, write the final checkpoint
    (``checkpoint``, which raises LeaseLostError when too late), forget the shard.
    ``consuming``: every shard it may consume after this tick (``start`` included).
    ``waiting``: stolen shards it holds but may not consume yet.
    ``next_tick_ms``: the monotonic time by which ``tick`` should run again.
    """

    start: tuple[int, ...]
    stop: tuple[int, ...]
    consuming: tuple[int, ...]
    waiting: tuple[int, ...]
    next_tick_ms: int


@dataclass(frozen=True)
class LeaseStatistics:
    taker_rounds: int
    renew_rounds: int
    taken: int
    stolen: int
    lost: int
    store_errors: int


@dataclass
class _Counters:
    taker_rounds: int = 0
    renew_rounds: int = 0
    taken: int = 0
    stolen: int = 0
    lost: int = 0
    store_errors: int = 0


@dataclass
class _Schedule:
    next_renew_ms: int = 0
    next_take_ms: int = 0
    wanted: frozenset[int] = field(default_factory=frozenset)
    members: frozenset[str] = field(default_factory=frozenset)  # registered, heartbeating
    last_tick_ms: int = 0


class LeaseCoordinator:
    """One worker's side of the protocol. Drive it from one loop:

    ``start(shards)`` once, then ``tick(shards)`` at least by ``Decisions.next_tick_ms`` (and as
    often as you like: rounds run only when due); act on ``start``/``stop``; call
    ``may_consume(shard)`` before processing each batch (a paused process must not consume
    after its deadline even before its next tick); ``checkpoint(shard, cursor)`` to persist;
    on a clean exit stop every shard, write final checkpoints, then ``shutdown()``.

    ``shards`` are the shard ids the caller may consume now (for an ordered group, children
    only once their parents are finished). Drop a finished read-only shard from the list only
    after its last checkpoint is written: its lease is then released.
    """

    def __init__(
        self,
        store: LeaseStore,
        clock: Clock,
        worker_name: str,
        *,
        lease_timeout_ms: int = lease_timeout_ms_default,
        steal_max_per_round: int | None = None,
    ) -> None:
        if not 0 < len(worker_name) <= worker_name_length_max:
            raise ParameterInvalid(f"worker name must be 1..{worker_name_length_max} characters")
        if lease_timeout_ms < lease_timeout_ms_min:
            raise ParameterInvalid(f"lease timeout must be at least {lease_timeout_ms_min} ms")
        self.store = store
        self.clock = clock
        self.worker_name = worker_name
        self.lease_timeout_ms = lease_timeout_ms
        self.taker_interval_ms = taker_interval_lease_timeouts * lease_timeout_ms
        self.renew_interval_ms = lease_timeout_ms // renews_per_lease_timeout
        # A live worker heartbeats at every renew, so two renew intervals cover it; a dead one
        # drops out before its leases look expired, so nobody keeps a place for it.
        self.member_window_ms = 2 * self.renew_interval_ms
        self.taker = LeaseTaker(worker_name, lease_timeout_ms, steal_max_per_round)
        self.renewer = LeaseRenewer(store, worker_name, lease_timeout_ms)
        self._observed: dict[int, Lease] = {}
        self._reported: frozenset[int] = frozenset()
        self._schedule = _Schedule()
        self._counters = _Counters()
        self._started = False

    # -- what the consumer library calls -----------------------------------------------------

    def start(self, shard_ids: Collection[int]) -> Decisions:
        """Start-up: register, create missing leases, renew the leases already ours (a fast
        restart keeps its shards), then a first taker round that also counts workers with a
        recent heartbeat, so that a group starting together balances at once. A DatabaseError
        propagates: nothing was taken; call ``start`` again."""
        assert not self._started, "start once"
        wanted = self._wanted(shard_ids)
        self.store.register_worker(self.worker_name)
        self._refresh(wanted)
        now_ms = self.clock.monotonic_ms()
        for lease in sorted(self._observed.values(), key=lambda lease: lease.shard_id):
            if lease.lease_owner == self.worker_name and lease.shard_id in wanted:
                self.renewer.acquire(lease, now_ms, stolen=False)
        recent = frozenset(self.store.recent_workers(self.member_window_ms))
        self._schedule.members = recent
        self._schedule.last_tick_ms = now_ms
        self._started = True
        self._take_round(wanted, extra_live=recent, steal=True)
        self._schedule.next_renew_ms = now_ms + self.renew_interval_ms
        self._schedule.next_take_ms = now_ms + self.taker_interval_ms
        return self._decide(wanted)

    def tick(self, shard_ids: Collection[int]) -> Decisions:
        """Run the rounds that are due; store errors are counted, not raised (a lease survives
        two failed renews; after that it is stopped until a renew wins).

        No shard waits for a taker round when it need not: at every renew, free and expired
        leases are taken (a dead worker's shards move within a lease timeout plus a renew);
        shards new to ``shard_ids`` (children of a finished parent) are taken at this very
        tick; and a worker that has just registered makes everyone run a whole taker round
        (steals included) at their next renew, so a group that starts together balances in
        one round plus the thieves' wait of one lease timeout."""
        assert self._started, "call start first"
        schedule = self._schedule
        new = frozenset(shard_ids) - schedule.wanted
        grew = bool(new)
        wanted = self._wanted(shard_ids)
        now_ms = self.clock.monotonic_ms()
        renew_due = now_ms >= schedule.next_renew_ms
        expiry_due = self._next_expiry_ms(wanted, schedule.last_tick_ms) <= now_ms
        schedule.last_tick_ms = now_ms
        if renew_due:
            self._renew_round()
            schedule.next_renew_ms = now_ms + self.renew_interval_ms
        take_due = now_ms >= schedule.next_take_ms
        fresh = (renew_due or grew or take_due) and self._try_refresh(wanted)
        if fresh and grew:
            self._take_new(new)
        if fresh or expiry_due:
            members = self._try_members()
            joined = members is not None and not members <= schedule.members
            full = take_due or joined
            self._take_round(wanted, extra_live=members or schedule.members, steal=full)
            if full:
                schedule.next_take_ms = now_ms + self.taker_interval_ms
            if members is not None:
                schedule.members = members
        self._release_unwanted(wanted)
        return self._decide(wanted)

    def may_consume(self, shard_id: int) -> bool:
        """True while this worker may process data of ``shard_id`` (no I/O)."""
        return shard_id in self._schedule.wanted and self.renewer.may_consume(
            shard_id, self.clock.monotonic_ms()
        )

    def read_checkpoint(self, shard_id: int) -> str:
        """The stored checkpoint ("" when none: start from the configured position). Read it
        after ``start`` names the shard: nobody else can write it from then on."""
        record = self.store.get_lease(shard_id)
        return "" if record is None else record.checkpoint

    def checkpoint(self, shard_id: int, cursor: str) -> None:
        """Persist ``cursor`` for ``shard_id``. Raises LeaseLostError when this worker is no
        longer its consumer_owner (the shard moved on; the new consumer resumes from the last
        checkpoint written), DatabaseError when the database cannot be reached."""
        if len(cursor) > checkpoint_length_max:
            raise ParameterInvalid(f"checkpoint longer than {checkpoint_length_max} characters")
        if not self.store.write_checkpoint(shard_id, self.worker_name, cursor):
            raise LeaseLostError(f"{self.worker_name} no longer consumes shard {shard_id}")

    def shutdown(self) -> None:
        """Leave cleanly: release every lease (others take them at once) and deregister. Call
        after stopping every shard and writing its final checkpoint. Raises DatabaseError when
        the database cannot be reached (the leases then expire: slower, still safe)."""
        for shard_id in sorted(self.renewer.held):
            self.renewer.release(shard_id)
        self._reported = frozenset()
        self.store.remove_worker(self.worker_name)

    def statistics(self) -> LeaseStatistics:
        counters = self._counters
        return LeaseStatistics(
            taker_rounds=counters.taker_rounds,
            renew_rounds=counters.renew_rounds,
            taken=counters.taken,
            stolen=counters.stolen,
            lost=counters.lost,
            store_errors=counters.store_errors + self.renewer.store_errors,
        )

    # -- rounds ------------------------------------------------------------------------------

    def _wanted(self, shard_ids: Collection[int]) -> frozenset[int]:
        wanted = frozenset(shard_ids)
        if len(wanted) > shards_per_group_max:
            raise ParameterInvalid(f"more than {shards_per_group_max} shards in one group")
        self._schedule.wanted = wanted
        return wanted

    def _refresh(self, wanted: frozenset[int]) -> None:
        """Read every lease, note when each counter was first seen, create missing leases."""
        records = self.store.list_leases()
        self._observed = observe(self._observed, records, self.clock.monotonic_ms())
        missing = wanted - self._observed.keys()
        if missing:
            self.store.create_leases(sorted(missing))
            self._observed = observe(
                self._observed, self.store.list_leases(), self.clock.monotonic_ms()
            )

    def _try_refresh(self, wanted: frozenset[int]) -> bool:
        try:
            self._refresh(wanted)
        except DatabaseError:
            self._counters.store_errors += 1
            return False
        return True

    def _try_members(self) -> frozenset[str] | None:
        try:
            return frozenset(self.store.recent_workers(self.member_window_ms))
        except DatabaseError:
            self._counters.store_errors += 1
            return None

    def _renew_round(self) -> None:
        self._counters.renew_rounds += 1
        lost = self.renewer.renew_all(self.clock)
        self._counters.lost += len(lost)
        try:
            self.store.heartbeat(self.worker_name)
        except DatabaseError:
            self._counters.store_errors += 1

    def _take_round(
        self, wanted: frozenset[int], extra_live: Collection[str], *, steal: bool
    ) -> None:
        """One round (``steal`` False: free and expired leases only). A lost compare-and-set
        means our view is stale: read the table and plan again at once, up to
        ``take_attempts_max`` plans in all."""
        self._counters.taker_rounds += 1
        for _ in range(take_attempts_max):
            held = self.renewer.held.keys() & wanted
            plan = self.taker.plan(
                self._observed, wanted, held, self.clock.monotonic_ms(), extra_live, steal=steal
            )
            raced = False
            for lease, stolen in _with_kind(plan.take, plan.steal):
                try:
                    won = self.renewer.acquire(lease, self.clock.monotonic_ms(), stolen=stolen)
                except DatabaseError:
                    self._counters.store_errors += 1
                    return
                raced |= not won
                self._counters.stolen += won and stolen
                self._counters.taken += won and not stolen
            if not raced or not self._try_refresh(wanted):
                return

    def _take_new(self, new: frozenset[int]) -> None:
        """Shards that have just become consumable (the children of a parent this worker
        finished) are taken at once when never taken before, even above the target: a child
        should not sit idle while the others learn of it; a later round evens the counts out.
        Only counter 0: a lease that was ever held may still have a consumer finishing up."""
        for shard_id in sorted(new):
            lease = self._observed.get(shard_id)
            if lease is None or lease.record.lease_counter != 0 or shard_id in self.renewer.held:
                continue
            try:
                won = self.renewer.acquire(lease, self.clock.monotonic_ms(), stolen=False)
            except DatabaseError:
                self._counters.store_errors += 1
                return
            self._counters.taken += won

    def _release_unwanted(self, wanted: frozenset[int]) -> None:
        for shard_id in sorted(self.renewer.held.keys() - wanted):
            try:
                self.renewer.release(shard_id)
            except DatabaseError:
                self._counters.store_errors += 1

    def _decide(self, wanted: frozenset[int]) -> Decisions:
        now_ms = self.clock.monotonic_ms()
        held = self.renewer.held
        consuming = frozenset(
            s for s in held if s in wanted and self.renewer.may_consume(s, now_ms)
        )
        waiting = sorted(
            s for s, h in held.items() if h.state is LeaseState.WAITING and s in wanted
        )
        start, stop = consuming - self._reported, self._reported - consuming
        self._reported = consuming
        schedule = self._schedule
        return Decisions(
            start=tuple(sorted(start)),
            stop=tuple(sorted(stop)),
            consuming=tuple(sorted(consuming)),
            waiting=tuple(waiting),
            next_tick_ms=min(
                schedule.next_renew_ms, schedule.next_take_ms, self._next_expiry_ms(wanted, now_ms)
            ),
        )

    def _next_expiry_ms(self, wanted: frozenset[int], after_ms: int) -> int:
        """When the next lease of another worker expires (after ``after_ms``), as observed:
        a tick then takes it at once, instead of at the renew after. A renewed lease's counter
        moves at the next refresh, so in a healthy group this moment never comes."""
        me = self.worker_name
        moments = (
            lease.counter_seen_at_ms + self.lease_timeout_ms + 1
            for shard_id, lease in self._observed.items()
            if shard_id in wanted and lease.lease_owner not in ("", me)
        )
        return min((at_ms for at_ms in moments if at_ms > after_ms), default=_never_ms)


_never_ms = 2**63 - 1


def _with_kind(take: Sequence[Lease], steal: Sequence[Lease]) -> Iterable[tuple[Lease, bool]]:
    yield from ((lease, False) for lease in take)
    yield from ((lease, True) for lease in steal)
