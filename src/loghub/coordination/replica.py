"""The replicas of one shard, Kafka's in-sync-replica (ISR) way, as pure functions.

Why pure: an acknowledged write is lost only when faults meet at the worst moment (a
follower restarts just before the leader dies, two leaders fail one after the other, a
deposed leader wakes up and acts on what it knew). Written without I/O and with time passed
in, the rules run under a seeded simulation (``loghub.testing.replica_sim``) that tries
thousands of such moments and replays any failure from its seed. The network, the disk and
etcd stay with the caller; ``docs/replication.md`` states the guarantee for users.

The rules, each a function below:

- **Epochs.** Every record carries the leader epoch it was appended in; each replica keeps
  an ``EpochCache`` of (epoch, start offset). A new leader's epoch starts at its log end.
- **Fetch.** A follower fetches at its log end with the latest epoch its log knows
  (``FetchRequest``). If that epoch's lineage leaves the leader's, the leader answers with
  the diverging epoch and where it ends on the leader (KIP-595); otherwise it returns the
  records from the fetch offset and notes the follower's *fsynced* end.
- **Truncation by lineage.** A follower cuts its log where its epochs leave the leader's,
  asking again until they agree, and never at its own high watermark (KIP-101, KIP-279).
- **High watermark** (HW) = the least fsynced end over the ISR (the leader's own included).
  It never decreases on a leader; reads stop at it; a follower's is min(leader's, own end).
- **Fsync.** Only fsynced records count toward the HW, so every ISR member has fsynced a
  record before it is acknowledged, and a crash, which loses the unfsynced tail, never
  loses an acknowledged record.
- **Ack.** A write is acknowledged once the HW has passed its end and the ISR has at least
  ``min_insync_replicas`` members; with fewer, the leader refuses writes
  (``NotEnoughReplicasError``).
- **ISR.** The leader drops a follower that has not fetched up to its log end for
  ``replica_lag_ms`` and adds one whose fsynced end reached both the HW and the leader's
  epoch start. Each change is a compare-and-swap on the control plane's record
  (``ShardLeadership``), whose version moves at every election, so a deposed leader's
  change fails with ``FencedError``.
- **Election.** A clean election picks only from the ISR of the record, bumps the epoch and
  keeps the live ISR members. ``unclean_election_may_lose_acknowledged_data`` is a separate,
  explicit act for an operator who accepts the loss.

A replica's role::

              restart                 elected: the record names it, in a new epoch
    OFFLINE ──────────> FOLLOWER ─────────────────────────────────────────────> LEADER
     ^  ^                 │  ^                                                   │  │
     │  └───── crash ─────┘  └─── deposed: a newer record, or its ISR change ────┘  │
     │                            refused (FencedError)                             │
     └─────────────────────────────────── crash ────────────────────────────────────┘

A replica that restarts (an unclean shutdown included) comes back as a follower, never as
the leader it was (KIP-966): leading again takes a new election and a new epoch.

Limits: a fetch returns at most ``fetch_records_max`` records, an append takes at most
``append_records_max``, an epoch is at most 2**32 - 1 (the record header's u32).

Thread-safety: every value is frozen and every function pure; share them freely.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

from loghub.errors import FencedError, IllegalTransition, NotEnoughReplicasError
from loghub.metadata.cluster_store import ShardLeadership

__all__ = [
    "LINEAGE_TRUNCATION",
    "PREVIOUS_ROLES",
    "UNDEFINED_EPOCH",
    "EpochCache",
    "EpochEndOffset",
    "FetchRequest",
    "FetchResponse",
    "FollowerProgress",
    "LeaderState",
    "LineageTruncation",
    "LogPosition",
    "Record",
    "ReplicaLog",
    "ReplicaRole",
    "TruncationRule",
    "advance_high_watermark",
    "append_as_leader",
    "append_records_max",
    "become_follower",
    "become_leader",
    "check_fetch_epoch",
    "clean_election",
    "compare_and_swap",
    "crash",
    "diverging_epoch",
    "fetch_records_max",
    "fetch_request",
    "follow_fetch_response",
    "follower_progress",
    "fsync",
    "handle_fetch",
    "is_acknowledged",
    "isr_change",
    "isr_changed",
    "isr_high_watermark",
    "lineage_cut",
    "next_role",
    "propose_isr",
    "readable_records",
    "truncate",
    "unclean_election_may_lose_acknowledged_data",
]

fetch_records_max = 1000
append_records_max = 1000
UNDEFINED_EPOCH = -1  # Kafka's UNDEFINED_EPOCH: no epoch known (also its offset's value)
_EPOCH_MAX = 2**32 - 1


class ReplicaRole(Enum):
    OFFLINE = "offline"  # crashed or not started: holds only what it fsynced
    FOLLOWER = "follower"  # fetches from the leader the record names
    LEADER = "leader"  # takes writes and fetches, in the epoch it was elected for


#: For each role, the roles a replica may come from (see the diagram above).
PREVIOUS_ROLES: dict[ReplicaRole, frozenset[ReplicaRole]] = {
    ReplicaRole.OFFLINE: frozenset({ReplicaRole.FOLLOWER, ReplicaRole.LEADER}),
    ReplicaRole.FOLLOWER: frozenset({ReplicaRole.OFFLINE, ReplicaRole.LEADER}),
    ReplicaRole.LEADER: frozenset({ReplicaRole.FOLLOWER}),
}


def next_role(current: ReplicaRole, wanted: ReplicaRole) -> ReplicaRole:
    """``wanted``, or ``IllegalTransition`` when the table does not allow the move (a
    restarted replica straight to leader, above all)."""
    if current not in PREVIOUS_ROLES[wanted]:
        raise IllegalTransition(f"replica role {current.value} -> {wanted.value} is not allowed")
    return wanted


# -- epochs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One record (a log group in LogHub) and the leader epoch it was appended in."""

    leader_epoch: int
    payload: bytes


@dataclass(frozen=True)
class EpochEndOffset:
    """Kafka's OffsetForLeaderEpoch answer: the largest epoch at or below the one asked that
    the log knows, and the offset where it ends (where the next known epoch starts, or the
    log end for the latest). ``UNDEFINED_EPOCH`` twice when the epoch asked is newer than
    every epoch known."""

    leader_epoch: int
    end_offset: int


_UNDEFINED = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH)


@dataclass(frozen=True)
class EpochCache:
    """Where each leader epoch began in one replica's log: the in-memory twin of the shard's
    ``leader-epochs`` file (``loghub.storage.leader_epochs``). Epochs and start offsets both
    strictly increase. The latest entry may have no record yet: a new leader's epoch starts
    at its log end before it appends anything."""

    entries: tuple[tuple[int, int], ...] = ()  # (leader epoch, start offset)

    def __post_init__(self) -> None:
        for (epoch, start), (next_epoch, next_start) in zip(
            self.entries, self.entries[1:], strict=False
        ):
            assert epoch < next_epoch and start < next_start, self.entries
        assert all(0 <= e <= _EPOCH_MAX and s >= 0 for e, s in self.entries), self.entries

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else UNDEFINED_EPOCH

    def end_offset_for_epoch(self, leader_epoch: int, log_end_offset: int) -> EpochEndOffset:
        """Where ``leader_epoch`` ends in this log, as Kafka's OffsetForLeaderEpoch answers:
        the latest epoch ends at the log end; an older one where the next known epoch
        starts, named by the largest known epoch at or below it (the epoch asked itself
        when it is older than every epoch known)."""
        if not self.entries or leader_epoch == UNDEFINED_EPOCH:
            return _UNDEFINED
        if leader_epoch == self.entries[-1][0]:
            return EpochEndOffset(leader_epoch, log_end_offset)
        higher = bisect_right(self.entries, leader_epoch, key=lambda entry: entry[0])
        if higher == len(self.entries):
            return _UNDEFINED  # newer than any epoch this log knows
        floor_epoch = self.entries[higher - 1][0] if higher else leader_epoch
        return EpochEndOffset(floor_epoch, self.entries[higher][1])

    def assign(self, leader_epoch: int, start_offset: int) -> EpochCache:
        """The cache with ``leader_epoch`` starting at ``start_offset``; entries starting at
        or after it give way (an epoch that appended nothing), as Kafka's ``assign`` does."""
        if leader_epoch == self.latest_epoch:
            return self
        kept = tuple(entry for entry in self.entries if entry[1] < start_offset)
        assert not kept or kept[-1][0] < leader_epoch, (self.entries, leader_epoch)
        return EpochCache((*kept, (leader_epoch, start_offset)))

    def truncate_from_end(self, end_offset: int) -> EpochCache:
        """The entries of a log cut at ``end_offset``: those starting at or after it go,
        an empty latest epoch included (a deposed leader's, which never appended)."""
        if not self.entries or self.entries[-1][1] < end_offset:
            return self
        return EpochCache(tuple(entry for entry in self.entries if entry[1] < end_offset))


# -- one replica's log ---------------------------------------------------------------------


class LogPosition(Protocol):
    """What the leader's and follower's rules read of a replica's log: its ends, its high
    watermark and its epochs, not its records. ``ReplicaLog`` is one; the data plane
    (``loghub.cluster.replication``) passes a snapshot of a real shard log, so both run
    the same rules."""

    @property
    def log_end_offset(self) -> int: ...

    @property
    def fsynced_end_offset(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def epochs(self) -> EpochCache: ...


@dataclass(frozen=True)
class ReplicaLog:
    """What one replica holds of the shard: its records, its epoch cache, how far it has
    fsynced, and its high watermark. Only ``records[:fsynced_end_offset]`` and the epochs
    below it survive a crash; the high watermark is checkpointed, so it survives too, but it
    is never a place to cut the log (KIP-101)."""

    records: tuple[Record, ...] = ()
    epochs: EpochCache = field(default_factory=EpochCache)
    fsynced_end_offset: int = 0
    high_watermark: int = 0

    def __post_init__(self) -> None:
        assert 0 <= self.high_watermark <= len(self.records), self
        assert 0 <= self.fsynced_end_offset <= len(self.records), self

    @property
    def log_end_offset(self) -> int:
        return len(self.records)


def fsync(log: ReplicaLog) -> ReplicaLog:
    """The log once its tail is durable: from here a crash keeps all of it."""
    if log.fsynced_end_offset == log.log_end_offset:
        return log
    return ReplicaLog(log.records, log.epochs, log.log_end_offset, log.high_watermark)


def crash(log: ReplicaLog) -> ReplicaLog:
    """What a replica finds after a crash (power loss included): its fsynced records only,
    with the epochs that still have records (as ``leader_epochs.fit_to_log`` does)."""
    return truncate(log, log.fsynced_end_offset)


def truncate(log: ReplicaLog, end_offset: int) -> ReplicaLog:
    """The log cut at ``end_offset`` (durably: the cut is fsynced with the file). The epoch
    cache is cut even when no record goes, to drop an epoch its replica led without
    appending, as Kafka's ``truncateTo`` does."""
    assert end_offset >= 0, end_offset
    cut = min(end_offset, log.log_end_offset)
    return ReplicaLog(
        records=log.records[:cut],
        epochs=log.epochs.truncate_from_end(cut),
        fsynced_end_offset=min(log.fsynced_end_offset, cut),
        high_watermark=min(log.high_watermark, cut),
    )


def readable_records(log: ReplicaLog, offset: int, records_max: int) -> tuple[Record, ...]:
    """What a consumer may read from ``offset``: never above the high watermark, since a
    failover may remove what lies above it. Empty at or beyond the high watermark."""
    assert offset >= 0 and records_max >= 1, (offset, records_max)
    return log.records[offset : min(log.high_watermark, offset + records_max)]


def _append(log: ReplicaLog, records: Sequence[Record]) -> ReplicaLog:
    """``records`` appended at the log end; an epoch newer than the cache's latest starts
    at the first record that carries it."""
    epochs = log.epochs
    offset = log.log_end_offset
    for record in records:
        assert record.leader_epoch >= epochs.latest_epoch, (record, epochs)
        epochs = epochs.assign(record.leader_epoch, offset)
        offset += 1
    return ReplicaLog(
        log.records + tuple(records), epochs, log.fsynced_end_offset, log.high_watermark
    )


# -- the leader ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FetchRequest:
    """A follower's fetch: its log end, the latest epoch its log knows, how far it has fsynced
    (the acknowledgement: the leader counts only this toward the high watermark), and the
    leader epoch it believes current (KIP-320), so that a stale leader or follower is
    refused."""

    replica_id: str
    leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    fsynced_end_offset: int

    def __post_init__(self) -> None:
        assert 0 <= self.fsynced_end_offset <= self.fetch_offset, self


@dataclass(frozen=True)
class FetchResponse:
    """Either ``diverging`` (cut your log by this answer and ask again) or the records from
    the fetch offset, with the leader's high watermark."""

    leader_epoch: int
    high_watermark: int
    diverging: EpochEndOffset | None
    records: tuple[Record, ...]


@dataclass(frozen=True)
class FollowerProgress:
    """What the leader knows of one follower from its last valid fetch in this epoch."""

    fsynced_end_offset: int
    caught_up_ms: int  # last time it had everything the leader had (Kafka's lastCaughtUpTime)
    last_fetch_ms: int
    last_fetch_leader_end_offset: int  # the leader's log end at that fetch


@dataclass(frozen=True)
class LeaderState:
    """A leader's memory for one epoch: the control-plane record it acts on (its election,
    or its last successful ISR change), where its epoch started, when it took over, and its
    followers' progress. Lost with the process; a restarted replica starts as a follower."""

    replica_id: str
    record: ShardLeadership
    epoch_start_offset: int
    since_ms: int
    followers: Mapping[str, FollowerProgress] = field(default_factory=dict)

    @property
    def leader_epoch(self) -> int:
        return self.record.leader_epoch


def become_leader(
    log: ReplicaLog, record: ShardLeadership, replica_id: str, now_ms: int
) -> tuple[ReplicaLog, LeaderState]:
    """Take over the epoch ``record`` elected this replica for. The epoch starts at the log
    end as it is now, unfsynced tail included: everything a previous leader acknowledged
    while this replica still fetched is below it. The high watermark starts at this
    replica's own and rises once every ISR member has fetched in the new epoch."""
    assert record.leader == replica_id, (record, replica_id)
    assert record.leader_epoch > log.epochs.latest_epoch, (record, log.epochs)
    epochs = log.epochs.assign(record.leader_epoch, log.log_end_offset)
    leader = LeaderState(replica_id, record, log.log_end_offset, now_ms)
    return replace(log, epochs=epochs), leader


def append_as_leader(
    log: ReplicaLog, leader: LeaderState, payloads: Sequence[bytes], min_insync_replicas: int
) -> tuple[ReplicaLog, int]:
    """The log with ``payloads`` appended in the leader's epoch, and the end offset their
    acknowledgement waits for. ``NotEnoughReplicasError`` when the ISR is too small for
    the write ever to be acknowledged."""
    assert 1 <= len(payloads) <= append_records_max, len(payloads)
    assert log.epochs.latest_epoch == leader.leader_epoch, (log.epochs, leader.leader_epoch)
    if len(leader.record.isr) < min_insync_replicas:
        raise NotEnoughReplicasError(
            f"{leader.replica_id} has {len(leader.record.isr)} in-sync replicas "
            f"{list(leader.record.isr)}, fewer than min_insync_replicas={min_insync_replicas}"
        )
    records = [Record(leader.leader_epoch, payload) for payload in payloads]
    appended = _append(log, records)
    return appended, appended.log_end_offset


def is_acknowledged(
    log: ReplicaLog, leader: LeaderState, end_offset: int, min_insync_replicas: int
) -> bool:
    """Whether a write ending at ``end_offset`` may be acknowledged: every ISR member has
    fsynced it (the high watermark passed it) and the ISR is still large enough."""
    return log.high_watermark >= end_offset and len(leader.record.isr) >= min_insync_replicas


def handle_fetch(
    log: ReplicaLog,
    leader: LeaderState,
    request: FetchRequest,
    now_ms: int,
    records_max: int = fetch_records_max,
) -> tuple[ReplicaLog, LeaderState, FetchResponse]:
    """Answer a follower's fetch (the log comes back with its high watermark advanced).

    ``FencedError`` when the request is for another epoch than the leader's, or comes from
    a log that knows a newer one: the follower or this leader is stale. A fetch whose last
    epoch diverges from this log gets the diverging epoch and nothing else is noted; a valid
    one notes the follower's progress."""
    assert 1 <= records_max <= fetch_records_max, records_max
    check_fetch_epoch(leader, request)
    assert request.replica_id != leader.replica_id, request
    diverging = diverging_epoch(log, request)
    if diverging is not None:
        return log, leader, FetchResponse(leader.leader_epoch, log.high_watermark, diverging, ())
    progress = follower_progress(leader, log, request, now_ms)
    leader = replace(leader, followers={**leader.followers, request.replica_id: progress})
    log = advance_high_watermark(log, leader)
    end = request.fetch_offset + records_max
    records = log.records[request.fetch_offset : end]
    return log, leader, FetchResponse(leader.leader_epoch, log.high_watermark, None, records)


def check_fetch_epoch(leader: LeaderState, request: FetchRequest) -> None:
    """``FencedError`` when a fetch is for another epoch than the leader's, or comes from a
    log that knows a newer one: the follower or this leader is stale."""
    if (
        request.leader_epoch != leader.leader_epoch
        or request.last_fetched_epoch > leader.leader_epoch
    ):
        raise FencedError(
            f"fetch by {request.replica_id} for leader epoch {request.leader_epoch} (its log "
            f"has epoch {request.last_fetched_epoch}), but {leader.replica_id} leads epoch "
            f"{leader.leader_epoch}"
        )


def diverging_epoch(log: LogPosition, request: FetchRequest) -> EpochEndOffset | None:
    """The answer to a fetch whose last epoch leaves this log's lineage (KIP-595), or None
    when the follower's log is a prefix of this one."""
    if request.last_fetched_epoch == UNDEFINED_EPOCH:
        assert request.fetch_offset == 0, request  # records always come with an epoch
        return None
    answer = log.epochs.end_offset_for_epoch(request.last_fetched_epoch, log.log_end_offset)
    if answer.leader_epoch < request.last_fetched_epoch or answer.end_offset < request.fetch_offset:
        return answer
    return None


def follower_progress(
    leader: LeaderState, log: LogPosition, request: FetchRequest, now_ms: int
) -> FollowerProgress:
    """Kafka's rule for "caught up": the follower had fetched the leader's whole log, as it
    is now or as it was at its previous fetch (so that a steady stream of writes does not
    make a follower that keeps up look behind). Judged on what it fetched, not on what it
    fsynced, so that a follower that fetches before its fsync completes is not dropped for
    it; the high watermark, which decides acknowledgements, counts only fsynced records."""
    previous = leader.followers.get(request.replica_id)
    fetched = request.fetch_offset
    if fetched >= log.log_end_offset:
        caught_up_ms = now_ms
    elif previous is None:
        caught_up_ms = leader.since_ms
    elif fetched >= previous.last_fetch_leader_end_offset:
        caught_up_ms = max(previous.caught_up_ms, previous.last_fetch_ms)
    else:
        caught_up_ms = previous.caught_up_ms
    return FollowerProgress(request.fsynced_end_offset, caught_up_ms, now_ms, log.log_end_offset)


def advance_high_watermark(log: ReplicaLog, leader: LeaderState) -> ReplicaLog:
    """The log with the leader's high watermark raised to the least fsynced end over the
    ISR, once every ISR member has fetched in this epoch. Never lowered: what consumers
    were allowed to read stays readable."""
    high_watermark = isr_high_watermark(leader, log.fsynced_end_offset)
    if high_watermark is None or high_watermark <= log.high_watermark:
        return log
    return ReplicaLog(log.records, log.epochs, log.fsynced_end_offset, high_watermark)


def isr_high_watermark(leader: LeaderState, own_fsynced_end_offset: int) -> int | None:
    """The least fsynced end over the ISR (the leader's own ``own_fsynced_end_offset``
    included), or None while an ISR member has not fetched in this epoch (its log is
    unknown). The caller raises its high watermark to it, never lowers it."""
    fsynced_ends = [own_fsynced_end_offset]
    for member in leader.record.isr:
        if member != leader.replica_id:
            progress = leader.followers.get(member)
            if progress is None:
                return None
            fsynced_ends.append(progress.fsynced_end_offset)
    return min(fsynced_ends)


def isr_change(
    log: LogPosition, leader: LeaderState, now_ms: int, replica_lag_ms: int
) -> tuple[str, ...] | None:
    """The ISR the leader should propose, or None when it is right as it is.

    A follower goes when it has not been caught up for ``replica_lag_ms``; one comes in
    when its fsynced end reached the high watermark and the epoch's start (below which lie
    all the records earlier leaders may have acknowledged, even where this leader's high
    watermark is still behind them) and it is caught up now."""
    assert replica_lag_ms > 0, replica_lag_ms
    isr = leader.record.isr
    since = leader.since_ms
    kept = [
        member
        for member in isr
        if member == leader.replica_id
        or now_ms - _caught_up_ms(leader.followers.get(member), since) <= replica_lag_ms
    ]
    floor = max(log.high_watermark, leader.epoch_start_offset)
    joining = [
        replica_id
        for replica_id, progress in sorted(leader.followers.items())
        if replica_id not in isr
        and progress.fsynced_end_offset >= floor
        and now_ms - progress.caught_up_ms <= replica_lag_ms
    ]
    if len(kept) == len(isr) and not joining:
        return None
    return (*kept, *joining)


def _caught_up_ms(progress: FollowerProgress | None, since_ms: int) -> int:
    return since_ms if progress is None else progress.caught_up_ms


def propose_isr(leader: LeaderState, isr: Sequence[str]) -> ShardLeadership:
    """The record the leader asks the control plane to swap in for its own: the same
    leader and epoch, the next version. It is conditioned on the version the leader acts
    on, which every election moves, so ``compare_and_swap`` refuses it once the epoch is
    over."""
    assert leader.replica_id in isr and len(set(isr)) == len(isr), (leader.replica_id, isr)
    return replace(leader.record, isr=tuple(isr), version=leader.record.version + 1)


def isr_changed(
    log: ReplicaLog, leader: LeaderState, record: ShardLeadership
) -> tuple[ReplicaLog, LeaderState]:
    """The leader after its ISR change went through: it acts on the new record, and a
    smaller ISR may let the high watermark rise."""
    assert record.leader == leader.replica_id and record.leader_epoch == leader.leader_epoch
    assert record.version > leader.record.version, (record, leader.record)
    leader = replace(leader, record=record)
    return advance_high_watermark(log, leader), leader


# -- the follower ---------------------------------------------------------------------------


class TruncationRule(Protocol):
    """Where a follower cuts its log. Injectable so that a test can plug in a broken rule
    (Kafka before KIP-101 cut at the follower's high watermark) and see the simulation
    catch it."""

    def on_follow(self, log: ReplicaLog) -> int | None:
        """Where to cut when the replica starts following a leader (None: nowhere yet)."""
        ...

    def on_diverging(self, log: ReplicaLog, answer: EpochEndOffset) -> int:
        """Where to cut on a leader's diverging-epoch answer."""
        ...


class LineageTruncation:
    """Cut only where the epoch lineage leaves the leader's (KIP-101, KIP-279, KIP-595).

    Nothing is cut on becoming a follower: only the leader knows where the lineages part.
    On its answer (epoch e ends at offset o on the leader), cut at the lesser of o and
    where e ends here. When this log does not know e, the lineages parted earlier: cut at
    the end of this log's last epoch before e, and the next fetch asks again."""

    def on_follow(self, log: ReplicaLog) -> int | None:
        return None

    def on_diverging(self, log: LogPosition, answer: EpochEndOffset) -> int:
        return lineage_cut(log, answer)


def lineage_cut(log: LogPosition, answer: EpochEndOffset) -> int:
    """Where the lineage rule cuts ``log`` on the leader's answer (see
    ``LineageTruncation``)."""
    own = log.epochs.end_offset_for_epoch(answer.leader_epoch, log.log_end_offset)
    if own.leader_epoch == UNDEFINED_EPOCH:
        return 0  # no epoch at all: an empty log
    if own.leader_epoch == answer.leader_epoch:
        return min(answer.end_offset, own.end_offset)
    return own.end_offset


LINEAGE_TRUNCATION = LineageTruncation()


def become_follower(log: ReplicaLog, rule: TruncationRule = LINEAGE_TRUNCATION) -> ReplicaLog:
    """The log as a replica starts following a (new) leader: untouched by the lineage rule,
    which waits for the leader's answer to the first fetch."""
    cut = rule.on_follow(log)
    return log if cut is None else truncate(log, cut)


def fetch_request(log: ReplicaLog, replica_id: str, leader_epoch: int) -> FetchRequest:
    """The next fetch: from the log end, with the latest epoch this log knows."""
    return FetchRequest(
        replica_id,
        leader_epoch,
        log.log_end_offset,
        log.epochs.latest_epoch,
        log.fsynced_end_offset,
    )


def follow_fetch_response(
    log: ReplicaLog,
    request: FetchRequest,
    response: FetchResponse,
    rule: TruncationRule = LINEAGE_TRUNCATION,
) -> ReplicaLog:
    """The follower's log after the leader's answer to ``request``: cut by ``rule`` on a
    diverging answer, else the records appended (to be fsynced before they count) and the
    high watermark raised to min(leader's, own log end). An answer to a request made from
    another log end or epoch is stale and changes nothing."""
    assert response.leader_epoch == request.leader_epoch, (request, response)
    if (
        log.log_end_offset != request.fetch_offset
        or log.epochs.latest_epoch != request.last_fetched_epoch
    ):
        return log
    if response.diverging is not None:
        return truncate(log, rule.on_diverging(log, response.diverging))
    appended = _append(log, response.records) if response.records else log
    high_watermark = min(response.high_watermark, appended.log_end_offset)
    if high_watermark <= appended.high_watermark:
        return appended
    return ReplicaLog(
        appended.records, appended.epochs, appended.fsynced_end_offset, high_watermark
    )


# -- the controller -------------------------------------------------------------------------


def clean_election(record: ShardLeadership, live: Sequence[str]) -> ShardLeadership | None:
    """The record of a clean election: the first of ``live`` (the replicas the controller
    sees alive, in its order of preference) that is in the record's ISR leads the next
    epoch, and the ISR keeps its live members. None when no ISR member is live: the shard
    waits for one rather than lose acknowledged records."""
    assert record.leader_epoch < _EPOCH_MAX, record
    leader = next((replica_id for replica_id in live if replica_id in record.isr), None)
    if leader is None:
        return None
    isr = (leader, *(member for member in record.isr if member in live and member != leader))
    return ShardLeadership(leader, record.leader_epoch + 1, isr, record.version + 1)


def unclean_election_may_lose_acknowledged_data(
    record: ShardLeadership, leader: str
) -> ShardLeadership:
    """The record making ``leader`` the leader in the next epoch, alone in the ISR, **even
    when it is not in the ISR**. Acknowledged records it does not hold are lost for good,
    and followers cut their logs to its lineage. Only for an operator who chose
    availability over the data (every in-sync replica is gone); never done automatically."""
    assert record.leader_epoch < _EPOCH_MAX, record
    return ShardLeadership(leader, record.leader_epoch + 1, (leader,), record.version + 1)


def compare_and_swap(current: ShardLeadership, proposed: ShardLeadership) -> ShardLeadership:
    """The control plane's rule (a linearizable compare-and-swap register, as etcd's
    transactions are): ``proposed`` replaces ``current`` only if it was made from the
    version now stored; else ``FencedError``. Every election moves the version, so a
    change made from a deposed leader's record always fails."""
    if proposed.version != current.version + 1:
        raise FencedError(
            f"the shard's record is at version {current.version} (leader {current.leader}, "
            f"epoch {current.leader_epoch}); a change made from version "
            f"{proposed.version - 1} is refused"
        )
    return proposed
