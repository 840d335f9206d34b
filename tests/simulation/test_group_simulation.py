"""The consumer group under a simulated cluster: faults, splits, merges, checkers every step.

A failure names its seed; replay one with ``LOGHUB_SEED=<seed> pytest <this file>``.
"""

from __future__ import annotations

import os

import pytest

from loghub.coordination.group import ConsumerGroup
from loghub.testing.group_sim import GroupSimulation, SimulationFaults

_REPLAY = os.environ.get("LOGHUB_SEED")
SEEDS = [int(_REPLAY)] if _REPLAY else list(range(12))
STEPS = 2000


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
@pytest.mark.parametrize("seed", SEEDS)
def test_group_keeps_every_invariant_under_faults(seed: int, ordered: bool) -> None:
    stats = GroupSimulation(seed, consumers=10, shards=64, ordered=ordered, steps=STEPS).run()
    # the run exercised what it claims to
    assert stats.heartbeats > 1000 and stats.grants > 100
    assert stats.crashes + stats.leaves + stats.pauses > 0
    assert stats.splits + stats.merges > 0 and stats.shards_finished > 0
    assert stats.intruder_checkpoints_refused > 0 and stats.quiet_checks > 0


def test_a_run_replays_exactly_from_its_seed() -> None:
    first = GroupSimulation(7, steps=300).run()
    assert GroupSimulation(7, steps=300).run() == first
    assert GroupSimulation(8, steps=300).run() != first


def test_without_faults_the_group_converges_and_never_redelivers() -> None:
    calm = SimulationFaults(
        join=0,
        leave=0,
        crash=0,
        pause=0,
        split=0,
        merge=0,
        delete=0,
        restart=0,
        heartbeat_request_lost=0,
        heartbeat_reply_lost=0,
        heartbeat_delayed=0,
    )
    stats = GroupSimulation(3, steps=600, faults=calm).run()
    assert stats.positions_redelivered == 0 and stats.self_fences == 0
    assert stats.quiet_checks > 400


def _first_failure(seeds: range) -> str:
    for seed in seeds:
        try:
            GroupSimulation(seed, steps=1500).run()
        except AssertionError as exc:
            return str(exc)
    pytest.fail("the checkers missed a broken group")


def test_the_checkers_catch_a_group_that_hands_on_shards_still_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ConsumerGroup, "_claimed_by_another", lambda *_: False)
    message = _first_failure(range(5))
    assert "LOGHUB_SEED=" in message


def test_the_checkers_catch_a_group_that_never_rebalances(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ConsumerGroup, "_balance", lambda *_: None)
    message = _first_failure(range(5))
    assert "quiet" in message and "LOGHUB_SEED=" in message


def test_the_checkers_catch_a_group_that_forgets_replies_on_the_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only reports count as claims: a shard granted in a reply still travelling is handed on."""

    def reports_only(self: ConsumerGroup) -> dict[int, set[str]]:
        claims: dict[int, set[str]] = {}
        for name, entry in self._consumers.items():
            for shard_id in entry.reported:
                claims.setdefault(shard_id, set()).add(name)
        return claims

    monkeypatch.setattr(ConsumerGroup, "_claims", reports_only)
    assert "still reports" in _first_failure(range(5))
