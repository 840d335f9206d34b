"""What a history and the final read of every shard say about the cluster.

Inputs are plain: the merged history (history.py) and the observations of the final reads,
``(shard, sequence, index, value)``, made after healing through every node. A position is
(shard, sequence of the log group, index of the log in it). Findings:

- **lost** (acknowledged but missing): an ``ok`` write with a value absent from the final
  read. The server said the write was durable and it is gone. Exit status 1.
- **inconsistent offsets**: one position seen with two different values, across the final
  reads through different nodes and the reads made during the run. A consumer that read
  one value there, and one that reads another later, disagree about the log. Exit status 1.
- **duplicates**: a value at two positions, counted per client kind. Possible with the
  official SDK, which retries a 5xx or a broken connection itself. LogHub's own writers
  send a write whose outcome they did not learn again under the same write id (idempotent
  writes), so a duplicate of theirs is a broken promise: the run is invalid.
- **unexpected**: a value present that no write ever carried (corruption, or a torn record
  served).
- **failed but present**: a ``fail`` write whose value is there: the client was told "not
  written" (a 4xx) and it was.
- **indeterminate resolved**: each ``info`` write found (whole), partly found, or not found;
  either outcome is allowed, the figures say what the timeouts hid.
- **read then lost / above the final HW**: a value the reader saw during the run that the
  final read lacks, or a read of a sequence at or past the shard's final end (today the high
  watermark is the end of the log; with replication, a read past the HW is a read of data a
  failover may take back).
- **failover**: for each fault, seconds from the fault to the first acknowledged
  write invoked after it (any range, and in the hash ranges the victim held), and the
  longest stretch without an acknowledged write in those ranges until the fault was lifted
  and a few seconds more.
- **replicas** (replicated runs): after healing, every shard's ISR must hold all its
  replicas, and every replica's segment files must be byte-identical to the leader's (the
  writers have stopped, so the high watermark is the log end). An ISR that never fills, or a
  copy that differs, makes the run invalid.
- **flipped bytes**: each byte the nemesis flipped in a follower's copy must be found by
  that node (its log names the records lost to damage); the replica comparison says whether
  the copy was repaired.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from history import Op, complete
from segments import Copy, copy_difference

__all__ = [
    "LEADER_LOSS_FAULTS",
    "FailoverFigure",
    "Report",
    "check",
    "check_flips",
    "check_handovers",
    "check_replicas",
    "check_torn_tails",
    "format_report",
    "percentile",
]

Position = tuple[int, int, int]
Observation = tuple[int, int, int, str]
# faults after which the victim's leaderships answer nothing until they are elected elsewhere
# (it is killed, paused or cut from everyone): their "fault -> first ack in the victim's
# ranges" is a failover time. Not a cut from etcd alone: the victim goes on acknowledging
# until its lease ends, so the first ack there says nothing of the election
LEADER_LOSS_FAULTS = (
    "kill_node",
    "kill_busiest",
    "kill_leader",
    "pause_node",
    "torn_tail",
    "flip_follower_byte",
    "isolate_node",
)
AFTER_LIFT_NS = 5_000_000_000  # the failover window runs this long past the fault's end
EXAMPLES_MAX = 10


@dataclass
class FailoverFigure:
    fault: str
    node: str
    started_s: float  # since the first op of the history
    first_ack_s: float | None  # any write invoked after the fault
    first_ack_in_ranges_s: float | None  # a write routed to a range the victim held
    longest_gap_in_ranges_s: float | None


@dataclass
class Report:
    invoked: int = 0
    ok: int = 0
    failed: int = 0
    info: int = 0
    by_kind: dict[str, Counter[str]] = field(default_factory=dict)  # client -> outcome -> n
    acked_values: int = 0
    lost: list[str] = field(default_factory=list)
    lost_during_handover: list[str] = field(default_factory=list)  # see check_handovers
    inconsistent: dict[Position, list[str]] = field(default_factory=dict)
    duplicates: dict[str, list[str]] = field(default_factory=dict)  # client kind -> values
    duplicates_retried: Counter[str] = field(default_factory=Counter)  # errors -> count
    duplicates_unexplained: list[str] = field(default_factory=list)  # no retry to explain
    unexpected: list[str] = field(default_factory=list)
    failed_but_present: list[str] = field(default_factory=list)
    info_found: int = 0
    info_partly_found: int = 0
    info_not_found: int = 0
    info_errors: dict[str, Counter[str]] = field(default_factory=dict)  # found/not -> errors
    read_then_lost: list[str] = field(default_factory=list)
    reads_above_final_hw: list[str] = field(default_factory=list)
    failover: list[FailoverFigure] = field(default_factory=list)
    longest_ack_gap_s: float = 0.0
    unreadable_after_heal: list[str] = field(default_factory=list)  # "n0: shard 24: ..."
    torn_tails_cut_right: int = 0
    torn_tails_wrong: list[str] = field(default_factory=list)
    # replicated runs: the replica comparison after healing (check_replicas)
    replicated: bool = False
    replica_shards: int = 0
    replica_shards_identical: int = 0
    replica_differences: dict[tuple[int, str], str] = field(default_factory=dict)
    isr_not_full: list[str] = field(default_factory=list)
    replica_wait_s: float = 0.0
    flips: int = 0
    flips_detected: int = 0
    flips_repaired: int = 0
    flip_findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """No acknowledged write lost, no position with two values, no write of LogHub's
        idempotent client stored twice and, replicated, every shard's ISR full and its
        replicas byte-identical after healing."""
        return (
            not self.lost
            and not self.inconsistent
            and not self.duplicates.get("loghub")
            and not self.replica_differences
            and not self.isr_not_full
        )

    def summary(self) -> dict[str, Any]:
        in_ranges = [f.first_ack_in_ranges_s for f in self.failover]
        known = [t for t in in_ranges if t is not None]
        return {
            "valid": self.valid,
            "ops": {"invoked": self.invoked, "ok": self.ok, "fail": self.failed,
                    "info": self.info},
            "by_client": {k: dict(c) for k, c in sorted(self.by_kind.items())},
            "acked_values": self.acked_values,
            "lost": len(self.lost),
            "lost_during_handover": len(self.lost_during_handover),
            "inconsistent_offsets": len(self.inconsistent),
            "duplicates": {kind: len(v) for kind, v in sorted(self.duplicates.items())},
            "duplicates_unexplained": len(self.duplicates_unexplained),
            "unexpected": len(self.unexpected),
            "failed_but_present": len(self.failed_but_present),
            "info_found": self.info_found,
            "info_partly_found": self.info_partly_found,
            "info_not_found": self.info_not_found,
            "read_then_lost": len(self.read_then_lost),
            "reads_above_final_hw": len(self.reads_above_final_hw),
            "unreadable_after_heal": len(self.unreadable_after_heal),
            "failover_in_ranges_s": {
                "n": len(in_ranges), "never": len(in_ranges) - len(known),
                "p50": percentile(known, 50), "max": percentile(known, 100),
            },
            "leader_loss_failover_s": leader_loss_failover(self.failover),
            "longest_ack_gap_s": round(self.longest_ack_gap_s, 2),
            "torn_tails": {"cut_right": self.torn_tails_cut_right,
                           "wrong": len(self.torn_tails_wrong)},
            **({"replicas": {"shards": self.replica_shards,
                             "identical": self.replica_shards_identical,
                             "differing_copies": len(self.replica_differences),
                             "isr_not_full": len(self.isr_not_full)},
                "flipped_bytes": {"n": self.flips, "detected": self.flips_detected,
                                  "repaired": self.flips_repaired}}
               if self.replicated else {}),
        }  # fmt: skip


def leader_loss_failover(figures: list[FailoverFigure]) -> dict[str, Any]:
    """Fault to the first acknowledged write in the victim's ranges, over the faults that
    took leaderships away (LEADER_LOSS_FAULTS) from a victim that led a writable shard."""
    times = [f.first_ack_in_ranges_s for f in figures if f.fault in LEADER_LOSS_FAULTS]
    known = [t for t in times if t is not None]
    return {"n": len(times), "never": len(times) - len(known), "p50": percentile(known, 50),
            "p99": percentile(known, 99), "max": percentile(known, 100)}  # fmt: skip


def percentile(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    if pct == 100:
        return round(max(values), 2)
    if pct == 50:
        return round(statistics.median(values), 2)
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(pct / 100 * len(ordered)))], 2)


def check(ops: list[Op], final: Iterable[Observation]) -> Report:
    report = Report()
    final_places: dict[str, set[Position]] = defaultdict(set)
    seen_at: dict[Position, set[str]] = defaultdict(set)
    ends: dict[int, int] = defaultdict(int)
    for shard, sequence, index, value in final:
        final_places[value].add((shard, sequence, index))
        seen_at[(shard, sequence, index)].add(value)
        ends[shard] = max(ends[shard], sequence + 1)
    writes = [(i, c) for i, c in complete(ops) if i.f == "write"]
    _outcomes(report, writes, final_places)
    _duplicates_and_unexpected(report, writes, final_places)
    _reads(report, ops, final_places, seen_at, ends)
    report.inconsistent = {
        position: sorted(values) for position, values in sorted(seen_at.items()) if len(values) > 1
    }
    _failover(report, ops, writes)
    return report


def _outcomes(
    report: Report, writes: list[tuple[Op, Op]], final_places: dict[str, set[Position]]
) -> None:
    report.invoked = len(writes)
    for invoke, done in writes:
        present = [v for v in invoke.values if v in final_places]
        report.by_kind.setdefault(invoke.client or "?", Counter())[done.type] += 1
        if done.type == "ok":
            report.ok += 1
            report.acked_values += len(invoke.values)
            report.lost += [v for v in invoke.values if v not in final_places]
        elif done.type == "fail":
            report.failed += 1
            report.failed_but_present += present
        else:
            report.info += 1
            outcome = (
                "found" if len(present) == len(invoke.values) else "partly" if present else "not"
            )
            report.info_found += outcome == "found"
            report.info_partly_found += outcome == "partly"
            report.info_not_found += outcome == "not"
            report.info_errors.setdefault(outcome, Counter())[done.error or "?"] += 1


def _duplicates_and_unexpected(
    report: Report, writes: list[tuple[Op, Op]], final_places: dict[str, set[Position]]
) -> None:
    op_of = {value: (invoke, done) for invoke, done in writes for value in invoke.values}
    for value, places in sorted(final_places.items()):
        if value not in op_of:
            report.unexpected.append(value)
            continue
        if len(places) < 2:
            continue
        invoke, done = op_of[value]
        report.duplicates.setdefault(invoke.client or "?", []).append(value)
        retried = done.detail.get("retried_after")
        if retried:  # the client sent it again after an error: the first one was written
            report.duplicates_retried[_runs(retried)] += 1
        else:
            where = ", ".join(f"shard {s} seq {q}" for s, q, _ in sorted(places))
            report.duplicates_unexplained.append(f"{value} ({done.type}) at {where}")


def _reads(
    report: Report,
    ops: list[Op],
    final_places: dict[str, set[Position]],
    seen_at: dict[Position, set[str]],
    ends: dict[int, int],
) -> None:
    read_values: set[str] = set()
    for op in ops:
        if op.f != "read" or op.type != "ok":
            continue
        for shard, sequence, index, value in op.observations:
            seen_at[(shard, sequence, index)].add(value)
            read_values.add(value)
            if sequence >= ends.get(shard, 0):
                report.reads_above_final_hw.append(f"{value} at shard {shard} seq {sequence}")
    report.read_then_lost = sorted(read_values - final_places.keys())


def _in_ranges(hash_key: str, ranges: list[list[str]] | list[tuple[str, str]]) -> bool:
    key = hash_key.lower()
    return any(begin.lower() <= key < end.lower() for begin, end in ranges)


def _failover(report: Report, ops: list[Op], writes: list[tuple[Op, Op]]) -> None:
    acks = sorted((done.time_ns, invoke) for invoke, done in writes if done.type == "ok")
    ack_times = [t for t, _ in acks]
    report.longest_ack_gap_s = max(
        ((b - a) / 1e9 for a, b in zip(ack_times, ack_times[1:], strict=False)), default=0.0
    )
    faults = [(i, c) for i, c in complete(ops) if i.process == "nemesis"]
    time_zero = ops[0].time_ns if ops else 0
    for invoke, lifted in faults:
        start = invoke.time_ns
        # no "ranges": the fault hits every range (etcd); empty: the victim held no writable
        # shard, so no write waited for it
        ranges = invoke.detail.get("ranges", [["", "g"]])
        if not ranges:
            continue
        after = [(t, w) for t, w in acks if w.time_ns >= start]
        in_ranges = [t for t, w in after if _in_ranges(w.hash_key, ranges)]
        window_end = lifted.time_ns + AFTER_LIFT_NS
        marks = [start, *[t for t in in_ranges if t <= window_end], window_end]
        report.failover.append(
            FailoverFigure(
                invoke.f,
                str(invoke.detail.get("node", "")),
                (start - time_zero) / 1e9,
                (after[0][0] - start) / 1e9 if after else None,
                (in_ranges[0] - start) / 1e9 if in_ranges else None,
                max((b - a) / 1e9 for a, b in zip(marks, marks[1:], strict=False)),
            )
        )


HANDOVER_MARK = " takes its range on "
HANDOVER_SLACK_NS = 1_000_000_000


def check_handovers(report: Report, ops: list[Op], server_logs: dict[str, str]) -> None:
    """Which lost writes were in flight while a node handed a shard over (the server logs
    ``shard N sealed at E; shard M takes its range on n1``): a diagnosis, not an excuse.
    Server logs carry wall-clock times; the history's ``clock`` op pairs the two clocks."""
    clock = next((op for op in ops if op.f == "clock"), None)
    if clock is None or not report.lost:
        return
    offset_ns = clock.time_ns - int(clock.detail["wall_ns"])
    seals = []
    for text in server_logs.values():
        for line in text.splitlines():
            if HANDOVER_MARK in line and " sealed at " in line:
                try:
                    wall = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                except ValueError:
                    continue
                seals.append(int(wall.timestamp() * 1e9) + offset_ns)
    lost = set(report.lost)
    for invoke, done in complete(ops):
        if invoke.f != "write" or not lost.intersection(invoke.values):
            continue
        if any(
            invoke.time_ns - HANDOVER_SLACK_NS <= seal <= done.time_ns + HANDOVER_SLACK_NS
            for seal in seals
        ):
            report.lost_during_handover += [v for v in invoke.values if v in lost]


def check_torn_tails(report: Report, ops: list[Op], server_logs: dict[str, str]) -> None:
    """Each torn tail must have been cut exactly where the intact records ended: at the
    file's length before the torn record was appended. The server logs each cut as
    ``<file>: cut N bytes at position P``; a cut elsewhere took intact records with it (or
    left torn bytes behind)."""
    for op in ops:
        torn = op.detail.get("torn") if op.process == "nemesis" and op.type == "ok" else None
        if not torn:
            continue
        text = server_logs.get(str(op.detail.get("node")), "")
        marker = f"{torn['file']}: cut "
        cuts = [line.split(marker, 1)[1] for line in text.splitlines() if marker in line]
        expected = f"at position {torn['file_bytes_before']} "
        if any(expected in cut for cut in cuts):
            report.torn_tails_cut_right += 1
        else:
            report.torn_tails_wrong.append(f"{torn['file']}: expected a cut {expected}, "
                                           f"the server logged {cuts or 'no cut'}")  # fmt: skip


def check_replicas(
    report: Report,
    leaders: dict[int, str],
    copies: dict[int, dict[str, Copy | None]],
    isr_not_full: list[str],
    waited_s: float,
) -> None:
    """The replicas after healing: ``copies[shard][node]`` is the node's copy of the shard
    (its segment files in name order; None when it has no directory for it), compared with
    the leader's; ``isr_not_full`` names the shards whose ISR did not fill in time."""
    report.replicated = True
    report.replica_wait_s = waited_s
    report.isr_not_full = list(isr_not_full)
    for shard, by_node in sorted(copies.items()):
        report.replica_shards += 1
        leader = leaders[shard]
        reference = by_node.get(leader)
        identical = True
        for node, copy in sorted(by_node.items()):
            if node == leader:
                continue
            if reference is None or copy is None:
                missing = leader if reference is None else node
                difference: str | None = f"{missing} has no directory for the shard"
            else:
                difference = copy_difference(reference, copy)
            if difference is not None:
                identical = False
                report.replica_differences[(shard, node)] = (
                    f"shard {shard}: {node}'s copy differs from leader {leader}'s: {difference}"
                )
        report.replica_shards_identical += identical


def check_flips(
    report: Report, ops: list[Op], server_logs: dict[str, str], final_values: set[str]
) -> None:
    """Each flipped byte: found by its node (the server logs ``shard log <dir>: N records
    (a..b) lost to damage on disk`` with the record's sequence in a..b, on open or when a
    read meets it), its record's values readable after healing, its copy repaired (identical
    to the leader's after healing: check_replicas ran first)."""
    acked = {v for invoke, done in complete(ops) if done.type == "ok" for v in invoke.values}
    for op in ops:
        if op.process != "nemesis" or op.type != "ok" or op.f != "flip_follower_byte":
            continue
        flipped = op.detail.get("flipped")
        if not flipped:
            continue
        report.flips += 1
        node, sequence = str(op.detail.get("node")), int(flipped["sequence"])
        shard = int(op.detail["shard"])
        what = f"{node} shard {shard} seq {sequence} ({flipped['file']} byte {flipped['position']})"
        found = False
        for line in server_logs.get(node, "").splitlines():
            if f"{flipped['dir']}: " not in line or "lost to damage" not in line:
                continue
            match = _LOST_RANGE.search(line)
            if match and int(match[1]) <= sequence <= int(match[2]):
                found = True
        report.flips_detected += found
        if not found:
            report.flip_findings.append(f"not detected by the node: {what}")
        values = list(flipped.get("values") or [])
        missing = [v for v in values if v not in final_values]
        if missing:
            report.flip_findings.append(
                f"values of the damaged record unreadable after healing: {what}: {missing} "
                f"(acknowledged: {[v for v in missing if v in acked]})"
            )
        if (shard, node) in report.replica_differences:
            report.flip_findings.append(f"not repaired: {what}")
        elif report.replicated and not report.isr_not_full:
            report.flips_repaired += 1


_LOST_RANGE = re.compile(r"records \((\d+)\.\.(\d+)\) lost to damage")


def _runs(errors: list[str]) -> str:
    """``a, a, a, b`` as ``a x3 then b``."""
    parts: list[tuple[str, int]] = []
    for error in errors:
        if parts and parts[-1][0] == error:
            parts[-1] = (error, parts[-1][1] + 1)
        else:
            parts.append((error, 1))
    return " then ".join(e if n == 1 else f"{e} x{n}" for e, n in parts)


def _examples(values: list[str]) -> str:
    shown = ", ".join(values[:EXAMPLES_MAX])
    return shown + (f" ... ({len(values)} in all)" if len(values) > EXAMPLES_MAX else "")


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def format_report(report: Report) -> str:
    """The report for a person: the verdict first, then each finding with examples."""
    lines = [
        f"{'VALID' if report.valid else 'INVALID'}: {report.invoked} writes invoked, "
        f"{report.ok} ok ({report.acked_values} values), {report.failed} fail, "
        f"{report.info} info",
        "  by client: "
        + "; ".join(
            f"{kind} " + ", ".join(f"{t} {n}" for t, n in sorted(c.items()))
            for kind, c in sorted(report.by_kind.items())
        ),
        f"  acknowledged but missing: {len(report.lost)}",
        f"  inconsistent offsets:     {len(report.inconsistent)}",
    ]
    if report.lost:
        lines.append(f"    lost: {_examples(report.lost)}")
        lines.append(f"    of which in flight while a node handed a shard over: "
                     f"{len(report.lost_during_handover)}")  # fmt: skip
    for position, values in list(report.inconsistent.items())[:EXAMPLES_MAX]:
        lines.append(f"    shard {position[0]} seq {position[1]} log {position[2]}: {values}")
    for kind in ("loghub", "sdk"):
        values = report.duplicates.get(kind, [])
        lines.append(f"  duplicates ({kind}):{' ' * (11 - len(kind))}{len(values)}"
                     + (f"  e.g. {_examples(values)}" if values else ""))  # fmt: skip
    for errors, count in report.duplicates_retried.most_common(EXAMPLES_MAX):
        lines.append(f"    {count} written again by the client's own retry after {errors}")
    lines += [f"    no retry explains {d}" for d in report.duplicates_unexplained[:EXAMPLES_MAX]]
    lines += [
        f"  unexpected values:        {len(report.unexpected)}"
        + (f"  e.g. {_examples(report.unexpected)}" if report.unexpected else ""),
        f"  failed but present:       {len(report.failed_but_present)}"
        + (f"  e.g. {_examples(report.failed_but_present)}" if report.failed_but_present else ""),
        f"  indeterminate: {report.info_found} found, {report.info_partly_found} partly, "
        f"{report.info_not_found} not found",
    ]
    for outcome, counts in sorted(report.info_errors.items()):
        lines.append(f"    {outcome}: " + ", ".join(f"{e} x{n}" for e, n in counts.most_common(6)))
    lines += [
        f"  read during the run, then lost: {len(report.read_then_lost)}"
        + (f"  e.g. {_examples(report.read_then_lost)}" if report.read_then_lost else ""),
        f"  reads above the final HW:       {len(report.reads_above_final_hw)}"
        + (f"  e.g. {_examples(report.reads_above_final_hw)}" if report.reads_above_final_hw
           else ""),
        f"  shards unreadable after healing:  {len(report.unreadable_after_heal)}",
        *[f"    {what}" for what in report.unreadable_after_heal[:EXAMPLES_MAX]],
        f"  longest gap between acknowledged writes: {report.longest_ack_gap_s:.2f} s",
        f"  torn tails cut where the intact records end: {report.torn_tails_cut_right}, "
        f"elsewhere: {len(report.torn_tails_wrong)}",
        *[f"    {wrong}" for wrong in report.torn_tails_wrong],
    ]  # fmt: skip
    if report.replicated:
        lines += [
            f"  replicas byte-identical after healing: {report.replica_shards_identical} of "
            f"{report.replica_shards} shards (ISR waited {report.replica_wait_s:.1f} s)",
            *[f"    ISR never full: {what}" for what in report.isr_not_full],
            *[f"    {what}" for what in report.replica_differences.values()],
        ]
        if report.flips:
            lines.append(f"  flipped bytes: {report.flips}, found by the node "
                         f"{report.flips_detected}, repaired {report.flips_repaired}")  # fmt: skip
            lines += [f"    {finding}" for finding in report.flip_findings]
    if report.failover:
        lines.append("  failover (fault -> first ack; in the victim's ranges; longest gap there):")
    for figure in report.failover:
        lines.append(
            f"    {figure.fault:<18} {figure.node:<4} at {figure.started_s:9.2f}: "
            f"{_seconds(figure.first_ack_s)}; {_seconds(figure.first_ack_in_ranges_s)}; "
            f"{_seconds(figure.longest_gap_in_ranges_s)}"
        )
    if any(f.fault in LEADER_LOSS_FAULTS for f in report.failover):
        figures = leader_loss_failover(report.failover)
        lines.append(
            f"  failover after a leader's loss ({figures['n']} faults, {figures['never']} "
            f"never): p50 {_seconds(figures['p50'])}, p99 {_seconds(figures['p99'])}, "
            f"max {_seconds(figures['max'])}"
        )
    lines += [f"  note: {note}" for note in report.notes]
    return "\n".join(lines)
