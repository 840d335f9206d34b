"""Drives a server-side ConsumerGroup (the pure logic) with SDK-like consumers on a fake clock.

Each consumer heartbeats every `heartbeat_interval_ms` (phases spread over the interval), lets
go at once of shards the reply leaves out, and reports what it holds. Used by rebalance.py
(time to balance, heartbeat mode) and groups.py (join to balance, pure-logic CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loghub.coordination import ConsumerGroup, ShardView


@dataclass
class SimConsumer:
    name: str
    phase_ms: int
    held: set[int] = field(default_factory=set)
    alive: bool = True


def balanced(group: ConsumerGroup, shard_count: int, live: list[str]) -> bool:
    granted = group.assignments()
    counts = [len(granted.get(name, [])) for name in live]
    return sum(counts) == shard_count and max(counts) - min(counts) <= 1


def run_until_balanced(
    group: ConsumerGroup,
    consumers: list[SimConsumer],
    views: list[ShardView],
    start_ms: int,
    heartbeat_interval_ms: int,
    tick_ms: int = 10,
    limit_ms: int = 600_000,
) -> int:
    """Advances time from start_ms until the live consumers are balanced; returns the time."""
    now_ms = start_ms
    live = [c.name for c in consumers if c.alive]
    while now_ms - start_ms < limit_ms:
        for consumer in consumers:
            if consumer.alive and (now_ms - consumer.phase_ms) % heartbeat_interval_ms == 0:
                granted = group.heartbeat(consumer.name, consumer.held, views, now_ms)
                consumer.held = set(granted)  # SDK-like: lets go at once of what is left out
        if balanced(group, len(views), live):
            return now_ms
        now_ms += tick_ms
    raise AssertionError("no balance within the limit")


def rebalance_ms(
    scenario: str,
    shard_count: int = 64,
    heartbeat_interval_ms: int = 5_000,
    timeout_ms: int = 10_000,
    tick_ms: int = 10,
) -> int:
    """Simulated ms from the change to a balanced group: "join" (2 -> 8 consumers),
    "crash" or "leave" (8 -> 2; the SDK sends no goodbye, so both end by the timeout)."""
    views = [ShardView(s, (), False) for s in range(shard_count)]
    before, after = (2, 8) if scenario == "join" else (8, 2)
    group = ConsumerGroup("bench", timeout_ms, False, 0)
    spread = heartbeat_interval_ms // 8 // tick_ms * tick_ms
    consumers = [SimConsumer(f"c{i}", i * spread) for i in range(before)]
    now_ms = run_until_balanced(group, consumers, views, 0, heartbeat_interval_ms, tick_ms)
    change_ms = now_ms + tick_ms
    if scenario == "join":
        consumers += [
            SimConsumer(f"c{i}", (change_ms + i * spread) % heartbeat_interval_ms)
            for i in range(before, after)
        ]
    else:
        for consumer in consumers[after:]:
            consumer.alive = False
    done_ms = run_until_balanced(group, consumers, views, change_ms, heartbeat_interval_ms, tick_ms)
    return done_ms - change_ms
