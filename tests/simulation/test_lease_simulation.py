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
    renews_per_lease_timeout,
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


@pytest.mark.parametrize("seed", range(24))
def test_a_crashed_workers_shards_are_consumed_again_within_a_timeout_two_renews_and_a_step(
    seed: int,
) -> None:
    """Survivors take expired leases at every renew, not at their next taker round (every
    two timeouts). The bound has a second renew: each survivor takes only its share, judged
    from its own last reading of the table, so with many workers a last shard may wait for
    the next renew of a survivor still short of its share. (With 4 workers on 16 shards, in
    ``tests/integration/test_lease_balance.py``, one renew is enough.)"""
    simulation = LeaseSimulation(seed)
    simulation.set_faults(False)
    assert simulation.settle(2_000), f"LOGHUB_SEED={seed}"
    config = simulation.config
    bound_ms = (
        config.lease_timeout_ms
        + 2 * (config.lease_timeout_ms // renews_per_lease_timeout)
        + config.step_ms
    )
    victim = sorted(simulation.workers)[0]
    held = [r.shard_id for r in simulation.inner.list_leases() if r.lease_owner == victim]
    simulation.crash(victim)
    crashed_ms = simulation.clock.monotonic_ms()

    def orphaned() -> list[int]:
        """The victim's shards that no live worker consumes yet."""
        records = [simulation.inner.get_lease(s) for s in held]
        return [
            r.shard_id
            for r in records
            if r is not None and r.consumer_owner not in simulation.workers
        ]

    while orphaned():
        elapsed_ms = simulation.clock.monotonic_ms() - crashed_ms
        assert elapsed_ms <= bound_ms, f"{orphaned()} after {elapsed_ms} ms, LOGHUB_SEED={seed}"
        simulation.step()
