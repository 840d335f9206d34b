"""One shard's replicas under a simulated cluster: faults, failovers, checkers every step.

The default run tries 1,000 seeds in chunks of 50 (each chunk a test, each failure naming
its seed); ``-m slow`` tries the next 20,000. Every run takes the same number of steps, so
``LOGHUB_SEED=<seed> pytest <this file>`` replays a failure of either.
"""

from __future__ import annotations

import os
from dataclasses import asdict

import pytest

from loghub.coordination.replica import (
    EpochEndOffset,
    LineageTruncation,
    ReplicaLog,
    TruncationRule,
)
from loghub.testing.replica_sim import NO_FAULTS, HighWatermarkTruncation, ReplicaSimulation

_REPLAY = os.environ.get("LOGHUB_SEED")
CHUNK = 50
SEEDS = 1_000
STEPS = 200
SLOW_SEEDS = 20_000
SLOW_CHUNK = 1_000


def _chunks(first: int, count: int, size: int) -> list[range]:
    if _REPLAY:
        return [range(int(_REPLAY), int(_REPLAY) + 1)]
    return [
        range(start, min(start + size, first + count))
        for start in range(first, first + count, size)
    ]


def _run(seeds: range, steps: int) -> dict[str, int]:
    """The statistics of every seed summed; every seed acknowledged writes on its own."""
    totals: dict[str, int] = {}
    for seed in seeds:
        stats = ReplicaSimulation(seed, steps=steps).run()
        assert stats.acks > 0, f"LOGHUB_SEED={seed} acknowledged nothing"
        for name, value in asdict(stats).items():
            totals[name] = totals.get(name, 0) + value
    return totals


def _assert_exercised(totals: dict[str, int]) -> None:
    """The run went through what it claims to: every kind of fault and its consequences."""
    for name in (
        "crashes",
        "records_lost_in_crashes",
        "pauses",
        "cut_offs",
        "links_down",
        "messages_lost",
        "elections",
        "double_failovers",
        "depositions",
        "stale_leader_appends",
        "stale_cas_refused",
        "fetches_fenced",
        "diverging_answers",
        "truncations",
        "isr_shrinks",
        "isr_expands",
        "writes_refused",
        "writes_indeterminate",
        "records_read",
    ):
        assert totals[name] > 0, f"no {name} in {totals}"


@pytest.mark.parametrize("seeds", _chunks(0, SEEDS, CHUNK), ids=lambda r: f"{r.start}-{r.stop - 1}")
def test_replicas_keep_every_invariant_under_faults(seeds: range) -> None:
    totals = _run(seeds, STEPS)
    if len(seeds) == CHUNK:
        _assert_exercised(totals)


@pytest.mark.slow
@pytest.mark.parametrize(
    "seeds", _chunks(SEEDS, SLOW_SEEDS, SLOW_CHUNK), ids=lambda r: f"{r.start}-{r.stop - 1}"
)
def test_replicas_keep_every_invariant_under_faults_wide(seeds: range) -> None:
    totals = _run(seeds, STEPS)
    if len(seeds) == SLOW_CHUNK:
        _assert_exercised(totals)


def test_a_run_replays_exactly_from_its_seed() -> None:
    first = ReplicaSimulation(7, steps=150).run()
    assert ReplicaSimulation(7, steps=150).run() == first
    assert ReplicaSimulation(8, steps=150).run() != first


def test_without_faults_every_write_is_acknowledged_and_nothing_moves() -> None:
    stats = ReplicaSimulation(3, steps=300, faults=NO_FAULTS).run()
    assert stats.writes > 300 and stats.acks == stats.writes
    assert stats.writes_refused == stats.writes_indeterminate == 0
    assert stats.elections == stats.truncations == stats.diverging_answers == 0
    assert stats.isr_shrinks == stats.isr_expands == 0
    assert stats.records_read > 0


def _first_failure(seeds: range, truncation: TruncationRule) -> tuple[int, str]:
    for seed in seeds:
        try:
            ReplicaSimulation(seed, steps=STEPS, truncation=truncation).run()
        except AssertionError as exc:
            return seed, str(exc)
    pytest.fail(f"the checkers missed a broken truncation rule: {truncation}")


def test_the_checkers_catch_truncation_at_the_followers_high_watermark() -> None:
    """The cut removes acknowledged records from an ISR member: the next clean leader
    might be the one that lost them."""
    seed, message = _first_failure(range(40), HighWatermarkTruncation())
    assert "ISR member" in message and "acknowledged among them" in message, message
    assert f"LOGHUB_SEED={seed}" in message


def test_without_the_isr_checker_the_same_rule_loses_an_acknowledged_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loss is real, not an artefact of checker 2: without it, an ISR member that cut
    acknowledged records becomes leader, and they are gone from the shard (other records
    take their offsets, or the leader's log ends before them)."""
    monkeypatch.setattr(ReplicaSimulation, "_check_isr_holds_committed", lambda self: None)
    seed, message = _first_failure(range(100), HighWatermarkTruncation())
    overwritten = "two records at offset" in message and "acknowledged among them" in message
    assert overwritten or "lacks acknowledged offsets" in message, message
    assert f"LOGHUB_SEED={seed}" in message


class _OffsetOnlyTruncation(LineageTruncation):
    """Broken on purpose, as KIP-101's first answer was before KIP-279: cut at the offset
    the leader names, without checking that this log knows the epoch it names."""

    def on_diverging(self, log: ReplicaLog, answer: EpochEndOffset) -> int:
        return min(answer.end_offset, log.log_end_offset)


def test_the_checkers_catch_a_cut_that_ignores_which_epoch_the_leader_named() -> None:
    """After a fast double failover, the cut keeps records the leader does not have below
    where it cut; every later fetch diverges again, and the follower never rejoins."""
    seed, message = _first_failure(range(300), _OffsetOnlyTruncation())
    assert "no convergence" in message and f"LOGHUB_SEED={seed}" in message, message
