"""The lease protocol under chaos: many seeds, invariants after every worker's action.

A failure prints ``LOGHUB_SEED=<seed>``; ``LOGHUB_SEED=<seed> pytest <this file>`` runs only
that seed (with every seed's test replaying it).
"""

from __future__ import annotations

import os

import pytest

from loghub._clock import Clock
from loghub.coordination.lease import (
    Lease,
    LeaseCoordinator,
    LeaseRenewer,
    LeaseState,
    LeaseStore,
)
from loghub.testing.lease_sim import (
    CoordinatorFactory,
    InvariantViolation,
    LeaseSimulation,
    SimConfig,
)

SEEDS = 24
STEPS = 2_000


def _seeds() -> list[int]:
    replay = os.environ.get("LOGHUB_SEED")
    return [int(replay)] if replay else list(range(SEEDS))


@pytest.mark.parametrize("seed", _seeds())
def test_lease_protocol_keeps_its_invariants_under_chaos(seed: int) -> None:
    simulation = LeaseSimulation(seed)
    simulation.run(STEPS)
    # Every run reached quiet spells and was found balanced, not only chaos.
    assert simulation.balance_checks >= 3, f"LOGHUB_SEED={seed}"


class _EagerRenewer(LeaseRenewer):
    """Broken on purpose: consumes a stolen lease at once."""

    def must_wait(self, lease: Lease, now_ms: int, *, stolen: bool) -> bool:
        return False


class _DeadlineBlindRenewer(LeaseRenewer):
    """Broken on purpose: a holder goes on consuming past its deadline (after a pause)."""

    def may_consume(self, shard_id: int, now_ms: int) -> bool:
        held = self.held.get(shard_id)
        return held is not None and held.state is LeaseState.CONSUMING


def _with_renewer(renewer: type[LeaseRenewer]) -> CoordinatorFactory:
    def factory(store: LeaseStore, clock: Clock, name: str, timeout_ms: int) -> LeaseCoordinator:
        coordinator = LeaseCoordinator(store, clock, name, lease_timeout_ms=timeout_ms)
        coordinator.renewer = renewer(store, name, timeout_ms)
        return coordinator

    return factory


@pytest.mark.parametrize("renewer", [_EagerRenewer, _DeadlineBlindRenewer])
def test_the_checkers_catch_a_broken_rule(renewer: type[LeaseRenewer]) -> None:
    caught = 0
    busy = SimConfig(event_probability=0.1)  # more pauses and steals, to be caught sooner
    for seed in range(5):
        simulation = LeaseSimulation(seed, busy, coordinator_factory=_with_renewer(renewer))
        try:
            simulation.run(STEPS)
        except InvariantViolation as violation:
            assert f"LOGHUB_SEED={seed}" in str(violation)
            caught += 1
    assert caught == 5


def test_a_seed_replays_exactly() -> None:
    config = SimConfig(chaos_steps_max=50)
    first = LeaseSimulation(7, config)
    second = LeaseSimulation(7, config)
    first.run(300)
    second.run(300)
    assert first.inner.list_leases() == second.inner.list_leases()
    assert first.delivered_upto == second.delivered_upto
