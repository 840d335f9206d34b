"""Helpers for deterministic tests, shipped so users can test their own code the same way.

``FakeClock`` drives time by hand; ``GroupSimulation`` runs many simulated SDK-like consumers
against a server-side consumer group, and ``LeaseSimulation`` many workers over the lease
protocol, both with injected faults, checking their invariants after every step and
replayable from a seed (``LOGHUB_SEED``). ``MemoryLeaseStore`` and ``FaultyLeaseStore`` are
lease stores for tests of your own. ``replica_sim.ReplicaSimulation`` does the same for one
shard's replicas under failovers; import it by module, as ``loghub.coordination.replica``.
"""

from loghub.testing.clock import FakeClock
from loghub.testing.group_sim import GroupSimulation, SimulationFaults, SimulationStatistics
from loghub.testing.lease_sim import InvariantViolation, LeaseSimulation, SimConfig
from loghub.testing.lease_store import FaultyLeaseStore, MemoryLeaseStore

__all__ = [
    "FakeClock",
    "FaultyLeaseStore",
    "GroupSimulation",
    "InvariantViolation",
    "LeaseSimulation",
    "MemoryLeaseStore",
    "SimConfig",
    "SimulationFaults",
    "SimulationStatistics",
]
