"""How long a group of consumers takes to rebalance 64 shards, in simulated time.

Scenarios: 2 -> 8 workers (six join at once), and 8 -> 2 (six crash, or six leave cleanly).
Policies, in the same simulation (FakeClock, MemoryLeaseStore, every worker ticking every
100 ms, no faults):

  one-round steal   this repository's lease protocol (spec/lease-protocol.md);
  one per round     the same protocol stealing at most one lease per taker round, the common
                    default elsewhere (KCL's maxLeasesToStealAtOneTime = 1).

"Balanced" means every shard is held and consumed (consumer_owner = lease_owner) by a live
worker and any two live workers' counts differ by at most 1. Time is simulated; rounds are that
time divided by the taker interval (2 x lease timeout).

    python benchmarks/rebalance.py [--shards 64,1024] [--phases 8] [--smoke]

Saves the figures to benchmarks/results/rebalance.json.
"""

from __future__ import annotations

import argparse
from collections import Counter

from _common import load_average, machine_summary
from _group_driver import rebalance_ms
from _results import Reference, Row, save

from loghub.coordination.lease import (
    LeaseCoordinator,
    lease_timeout_ms_default,
    taker_interval_lease_timeouts,
)
from loghub.testing.clock import FakeClock
from loghub.testing.lease_store import MemoryLeaseStore

SHARDS = list(range(64))
TICK_MS = 100
LIMIT_MS = 3_600_000  # give up after one simulated hour
TAKER_INTERVAL_MS = taker_interval_lease_timeouts * lease_timeout_ms_default
PHASES = 8


class _Group:
    def __init__(self, steal_max_per_round: int | None) -> None:
        self.clock = FakeClock()
        self.store = MemoryLeaseStore(self.clock)
        self.steal_max_per_round = steal_max_per_round
        self.workers: dict[str, LeaseCoordinator] = {}

    def join(self, names: list[str]) -> None:
        """Workers starting together: all registered before anyone's first taker round."""
        for name in names:
            self.store.register_worker(name)
        for name in names:
            worker = LeaseCoordinator(
                self.store,
                self.clock,
                name,
                lease_timeout_ms=lease_timeout_ms_default,
                steal_max_per_round=self.steal_max_per_round,
            )
            worker.start(SHARDS)
            self.workers[name] = worker

    def crash(self, names: list[str]) -> None:
        for name in names:
            del self.workers[name]

    def leave(self, names: list[str]) -> None:
        for name in names:
            self.workers.pop(name).shutdown()

    def balanced(self) -> bool:
        records = self.store.list_leases()
        if any(
            r.lease_owner not in self.workers or r.consumer_owner != r.lease_owner for r in records
        ):
            return False
        counts = Counter({name: 0 for name in self.workers})
        counts.update(r.lease_owner for r in records)
        return max(counts.values()) - min(counts.values()) <= 1

    def run_for(self, duration_ms: int) -> None:
        for _ in range(duration_ms // TICK_MS):
            self.tick()

    def tick(self) -> None:
        self.clock.advance(TICK_MS)
        for worker in self.workers.values():
            worker.tick(SHARDS)

    def run_until_balanced(self) -> int:
        """Simulated ms until balanced."""
        started_ms = self.clock.monotonic_ms()
        while not self.balanced():
            assert self.clock.monotonic_ms() - started_ms < LIMIT_MS, "never balanced"
            self.tick()
        return self.clock.monotonic_ms() - started_ms


def measure(steal_max_per_round: int | None, scenario: str, offset_ms: int) -> int:
    """Simulated ms from the event to a balanced group; the event comes ``offset_ms`` into a
    quiet spell, so that runs see the taker rounds at different phases."""
    group = _Group(steal_max_per_round)
    before, after = (2, 8) if scenario == "join" else (8, 2)
    group.join([f"w{i}" for i in range(before)])
    group.run_until_balanced()
    group.run_for(offset_ms)
    if scenario == "join":
        group.join([f"w{i}" for i in range(before, after)])
    elif scenario == "crash":
        group.crash([f"w{i}" for i in range(after, before)])
    else:
        group.leave([f"w{i}" for i in range(after, before)])
    return group.run_until_balanced()


# --- heartbeat (server-side consumer group) mode --------------------------------------------
# The server's ConsumerGroup driven by SDK-like consumers (_group_driver): heartbeats every
# lease timeout / 2 and a group timeout of one lease timeout, the SDK's ratio, so that both
# modes notice a dead consumer after the same time.
def heartbeat_mode_rebalance_ms(scenario: str) -> int | None:
    return rebalance_ms(
        scenario,
        shard_count=len(SHARDS),
        heartbeat_interval_ms=lease_timeout_ms_default // 2,
        timeout_ms=lease_timeout_ms_default,
    )


SCENARIOS = {
    "join": "2 -> 8 workers (6 join)",
    "crash": "8 -> 2 workers (6 crash)",
    "leave": "8 -> 2 workers (6 leave cleanly)",
}
POLICIES = {"one-round steal (spec)": None, "one steal per round (KCL default)": 1}


def main() -> None:
    global SHARDS, PHASES
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", default="64", help="shard counts, comma-separated (64)")
    parser.add_argument("--phases", type=int, default=PHASES, help="runs of each case (8)")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.shards, args.phases = "8", 1
    PHASES = args.phases
    print(f"{machine_summary()}; {load_average()}")
    rows: list[Row] = []
    for count in [int(c) for c in args.shards.split(",")]:
        SHARDS = list(range(count))
        rows += measure_all()
    print(f"saved {save('rebalance', 'Rebalance time (simulated)', rows)}")


def measure_all() -> list[Row]:
    rows = []
    print(
        f"{len(SHARDS)} shards, lease timeout {lease_timeout_ms_default / 1000:g} s, "
        f"taker round {TAKER_INTERVAL_MS / 1000:g} s, ticks every {TICK_MS} ms (simulated)"
    )
    offsets_ms = [TAKER_INTERVAL_MS * i // PHASES for i in range(PHASES)]
    print(f"each figure: mean and worst of {PHASES} runs, the event at phases of a taker round")
    header = (
        f"{'scenario':34} {'policy':34} {'mean s':>7} {'worst s':>8} {'rounds':>7} {'worst':>6}"
    )
    print(header)
    for scenario, label in SCENARIOS.items():
        seconds: dict[str, list[float]] = {}
        for policy, steal_max in POLICIES.items():
            times_ms = [measure(steal_max, scenario, offset) for offset in offsets_ms]
            seconds[policy] = [t / 1000 for t in times_ms]
            mean_ms, worst_ms = sum(times_ms) / len(times_ms), max(times_ms)
            print(
                f"{label:34} {policy:34} {mean_ms / 1000:>7.1f} {worst_ms / 1000:>8.1f} "
                f"{mean_ms / TAKER_INTERVAL_MS:>7.2f} {worst_ms / TAKER_INTERVAL_MS:>6.2f}"
            )
        spec, other = list(POLICIES)
        rows.append(
            Row(
                f"{len(SHARDS)} shards, {label}, lease mode", "s to balance", seconds[spec],
                reference=Reference(other, seconds[other]), higher_is_better=False,
            )
        )  # fmt: skip
    measured = {scenario: heartbeat_mode_rebalance_ms(scenario) for scenario in SCENARIOS}
    if all(value is None for value in measured.values()):
        print("heartbeat mode: (not measured here)")
    else:
        for scenario, elapsed_ms in measured.items():
            shown = "n/a" if elapsed_ms is None else f"{elapsed_ms / 1000:.1f} s"
            print(
                f"heartbeat mode, {SCENARIOS[scenario]}: {shown} (heartbeat "
                f"{lease_timeout_ms_default // 2000} s, group timeout "
                f"{lease_timeout_ms_default // 1000} s)"
            )
            if elapsed_ms is not None:
                rows.append(
                    Row(
                        f"{len(SHARDS)} shards, {SCENARIOS[scenario]}, heartbeat mode",
                        "s to balance", [elapsed_ms / 1000], higher_is_better=False,
                    )
                )  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
