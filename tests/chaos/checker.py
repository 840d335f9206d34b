"""What a chaos run did to the data: acknowledged logs lost, duplicates and their causes,
order violations in ordered groups, recovery times.

Inputs are plain: what the producer had acknowledged (and when), what each consumer process
recorded (``loghub_consumer_worker.py``: batches processed, checkpoints written durably,
CLOCK_MONOTONIC nanoseconds), the faults with their times, and what the server still stores.

A duplicate is one log processed again. It is *explained* when either
- it is the same stored group (shard, sequence) processed again after a crash-like fault
  (SIGKILL or pause of the process that processed it first, or a server crash, a broken
  PostgreSQL connection, a full disk: anything that can lose a checkpoint in flight), and
  its first processing was at or after the shard's last durable checkpoint at that moment
  (a paused process counts until shortly after it resumed: it may finish the batch it held);
- or it was stored twice because the producer retried a write that had failed (a failed
  write may still have been stored).
Anything else is *unexplained*, and counted as such.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from delivery_events import Delivery, deliveries, durable_checkpoint
from faults import Fault

# faults that hit every process
CRASH_LIKE = {"kill_server", "pause_server", "flip_byte", "break_postgres", "fill_disk"}
RESUME_GRACE_NS = 3_000_000_000  # a heartbeat interval (1 s) and a batch, with room to spare


@dataclass
class GroupReport:
    name: str
    processed: int = 0
    lost: list[tuple[str, int]] = field(default_factory=list)
    redelivered_explained: int = 0
    stored_twice_explained: int = 0
    unexplained: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)


def check_group(name: str, events: list[dict[str, Any]], acked: dict[tuple[str, int], int],
                failed: set[tuple[str, int]], faults: list[Fault]) -> GroupReport:  # fmt: skip
    report = GroupReport(name)
    delivered = deliveries(events)
    report.processed = len(delivered)
    by_log: dict[tuple[str, int], list[Delivery]] = defaultdict(list)
    for delivery in delivered:
        by_log[(delivery.key, delivery.n)].append(delivery)
    report.lost = sorted(acked.keys() - by_log.keys())
    for log, copies in by_log.items():
        for i, later in enumerate(copies[1:], 1):
            same_group = [c for c in copies[:i] if (c.shard, c.seq) == (later.shard, later.seq)]
            if not same_group:
                if log in failed:
                    report.stored_twice_explained += 1
                else:
                    report.unexplained.append(f"{log} stored twice, never a failed write: {copies}")
                continue
            earlier = same_group[-1]
            if _explained_redelivery(earlier, later, events, faults):
                report.redelivered_explained += 1
            else:
                report.unexplained.append(f"{log} processed again with no crash to explain it: "
                                          f"{earlier} then {later}")  # fmt: skip
    report.order_violations = _order_violations(by_log)
    return report


def _explained_redelivery(earlier: Delivery, later: Delivery, events: list[dict[str, Any]],
                          faults: list[Fault]) -> bool:  # fmt: skip
    for fault in faults:
        hits = fault.kind in CRASH_LIKE or fault.pid == earlier.pid
        # a paused process may finish the batch it held when it resumes, before it learns
        # that its shard has moved on (the next heartbeat tells it)
        grace_ns = RESUME_GRACE_NS if fault.kind == "pause_consumer" else 0
        if hits and earlier.t < fault.lifted_ns + grace_ns and fault.started_ns <= later.t:
            # the checkpoint a successor starts from: the last one written before the fault
            checkpoint = durable_checkpoint(events, earlier.shard, fault.started_ns)
            if earlier.seq >= checkpoint:
                return True
    return False


def _order_violations(by_log: dict[tuple[str, int], list[Delivery]]) -> list[str]:
    """Each key's logs must first be processed in write order (n ascending)."""
    firsts: dict[str, list[Delivery]] = defaultdict(list)
    for copies in by_log.values():
        firsts[copies[0].key].append(copies[0])
    violations = []
    for key, logs in firsts.items():
        logs.sort(key=lambda d: (d.t, d.index))
        for before, after in zip(logs, logs[1:], strict=False):
            if after.n < before.n:
                violations.append(f"{key}: n={after.n} processed after n={before.n}: "
                                  f"{before} then {after}")  # fmt: skip
    return violations


def recovery_times_s(
    faults: list[Fault],
    acked: dict[tuple[str, int], int],
    group_events: dict[str, list[dict[str, Any]]],
) -> dict[str, list[float]]:
    """Per fault kind: seconds from the moment the fault was lifted until the producers had a
    write acknowledged and every group had processed a log acknowledged after that moment
    (the slowest of these); a fault the system never recovered from counts as infinity."""
    ack_times = sorted(acked.values())
    firsts: dict[str, list[tuple[int, int]]] = {}
    for name, events in group_events.items():
        first: dict[tuple[str, int], int] = {}
        for d in deliveries(events):
            first.setdefault((d.key, d.n), d.t)
        firsts[name] = sorted((acked[log], t) for log, t in first.items() if log in acked)
    times: dict[str, list[float]] = defaultdict(list)
    for fault in faults:
        lifted = fault.lifted_ns
        next_ack = next((t for t in ack_times if t > lifted), None)
        ends = [next_ack]
        for pairs in firsts.values():
            ends.append(min((t for ack, t in pairs if ack > lifted), default=None))
        if any(end is None for end in ends):
            times[fault.kind].append(float("inf"))
        else:
            times[fault.kind].append(max(e for e in ends if e is not None) / 1e9 - lifted / 1e9)
    return times


def summary(values: list[float]) -> str:
    finite = [v for v in values if v != float("inf")]
    text = f"n={len(values)}"
    if finite:
        text += f" median {statistics.median(finite):.1f} s, max {max(finite):.1f} s"
    if len(finite) < len(values):
        text += f", {len(values) - len(finite)} never recovered"
    return text
