"""The classic Kafka group coordinator, driven with a fake clock: joins, generations,
fencing, commits during a rebalance, session expiry, the rebalance timeout, and the bounds on
what it keeps (empty groups forgotten, unused member ids lapsing)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from loghub.kafka.coordinator import (
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    MEMBER_ID_REQUIRED,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    Coordinator,
    GroupState,
    members_per_group_max,
)
from loghub.testing import FakeClock

PROTOCOLS = [("range", b"meta")]


def _run(test: Callable[[Coordinator, FakeClock], Awaitable[None]]) -> None:
    clock = FakeClock()
    asyncio.run(test(Coordinator(clock, initial_rebalance_delay_ms=100), clock))


async def _join(coordinator: Coordinator, member_id: str, client: str = "c") -> dict[str, Any]:
    return await coordinator.join(
        "g", member_id, client, "127.0.0.1", None, 10_000, 20_000, "consumer", PROTOCOLS, True
    )


async def _settle(coordinator: Coordinator, clock: FakeClock, ms: int = 200) -> None:
    """Lets waiting tasks run, then moves time on and ticks."""
    for _ in range(3):
        await asyncio.sleep(0)
    clock.advance(ms)
    coordinator.tick()
    for _ in range(3):
        await asyncio.sleep(0)


async def _first_member(coordinator: Coordinator, clock: FakeClock) -> str:
    required = await _join(coordinator, "")
    assert required["ErrorCode"] == MEMBER_ID_REQUIRED
    joining = asyncio.ensure_future(_join(coordinator, required["MemberId"]))
    await _settle(coordinator, clock)  # the initial delay passes
    joined = await joining
    assert joined["GenerationId"] == 1 and joined["Leader"] == required["MemberId"]
    assert [m["MemberId"] for m in joined["Members"]] == [required["MemberId"]]
    member_id: str = required["MemberId"]
    return member_id


def test_a_second_member_makes_the_first_rejoin_and_only_the_leader_sees_the_members() -> None:
    async def test(coordinator: Coordinator, clock: FakeClock) -> None:
        first = await _first_member(coordinator, clock)
        assert (await coordinator.sync("g", 1, first, {first: b"all"}))[:2] == (0, b"all")
        second = (await _join(coordinator, "", "d"))["MemberId"]
        second_join = asyncio.ensure_future(_join(coordinator, second, "d"))
        await _settle(coordinator, clock)
        assert coordinator.heartbeat("g", 1, first) == REBALANCE_IN_PROGRESS
        # the first member commits what it read, then rejoins
        assert coordinator.check_commit("g", 1, first) == 0
        first_join = asyncio.ensure_future(_join(coordinator, first))
        await _settle(coordinator, clock)
        leader, follower = await first_join, await second_join
        assert leader["GenerationId"] == follower["GenerationId"] == 2
        assert leader["Leader"] == first and len(leader["Members"]) == 2
        assert follower["Members"] == []
        # between join and assignment a commit is refused; an old generation is fenced
        assert coordinator.check_commit("g", 2, second) == REBALANCE_IN_PROGRESS
        assert coordinator.check_commit("g", 1, first) == ILLEGAL_GENERATION
        waiting = asyncio.ensure_future(coordinator.sync("g", 2, second, {}))
        await _settle(coordinator, clock, 0)
        assert not waiting.done()  # a follower waits for the leader's assignment
        assert (await coordinator.sync("g", 2, first, {first: b"a", second: b"b"}))[1] == b"a"
        assert (await waiting)[1] == b"b"
        assert coordinator.groups["g"].state is GroupState.STABLE
        assert coordinator.check_commit("g", 2, second) == 0

    _run(test)


def test_a_silent_member_expires_and_the_group_rebalances_without_it() -> None:
    async def test(coordinator: Coordinator, clock: FakeClock) -> None:
        first = await _first_member(coordinator, clock)
        await coordinator.sync("g", 1, first, {first: b"all"})
        clock.advance(10_001)  # its session timeout
        coordinator.tick()
        assert coordinator.heartbeat("g", 1, first) == UNKNOWN_MEMBER_ID
        assert "g" not in coordinator.groups  # empty, and forgotten at once

    _run(test)


def test_a_member_that_does_not_rejoin_in_the_rebalance_timeout_is_dropped() -> None:
    async def test(coordinator: Coordinator, clock: FakeClock) -> None:
        first = await _first_member(coordinator, clock)
        await coordinator.sync("g", 1, first, {first: b"all"})
        second = (await _join(coordinator, "", "d"))["MemberId"]
        second_join = asyncio.ensure_future(_join(coordinator, second, "d"))
        waited_ms = 0
        while not second_join.done():  # the first member heartbeats but never rejoins
            await _settle(coordinator, clock, 5_000)
            waited_ms += 5_000
            coordinator.heartbeat("g", 1, first)
        assert waited_ms >= 20_000  # the rebalance timeout
        answer = await second_join
        assert answer["GenerationId"] == 2 and answer["Leader"] == second
        assert list(coordinator.groups["g"].members) == [second]

    _run(test)


def test_leaving_members_get_answers_and_an_unknown_one_is_told_so() -> None:
    async def test(coordinator: Coordinator, clock: FakeClock) -> None:
        first = await _first_member(coordinator, clock)
        assert coordinator.leave("g", [first, "nobody"]) == [0, UNKNOWN_MEMBER_ID]
        assert coordinator.groups["g"].state is GroupState.EMPTY
        assert (await _join(coordinator, "stale"))["ErrorCode"] == UNKNOWN_MEMBER_ID
        await _settle(coordinator, clock)
        assert "g" not in coordinator.groups
        assert (await _join(coordinator, first))["ErrorCode"] == UNKNOWN_MEMBER_ID
        assert await _first_member(coordinator, clock) != first  # a group anew

    _run(test)


def test_groups_made_up_per_run_are_forgotten_once_empty() -> None:
    """Console consumers and scripts make up a group id per run: the coordinator must not keep
    every group it ever saw (nor the broker its partition counts)."""

    async def test(coordinator: Coordinator, clock: FakeClock) -> None:
        for run in range(2_000):
            group = f"console-consumer-{run}"
            required = await coordinator.join(
                group, "", "c", "h", None, 10_000, 20_000, "consumer", PROTOCOLS, True
            )
            joining = asyncio.ensure_future(
                coordinator.join(
                    group, required["MemberId"], "c", "h", None, 10_000, 20_000, "consumer",
                    PROTOCOLS, True,
                )
            )  # fmt: skip
            await _settle(coordinator, clock)
            joined = await joining
            assert coordinator.leave(group, [joined["MemberId"]]) == [0]
        await _settle(coordinator, clock)
        assert coordinator.groups == {}

    _run(test)


def test_member_ids_handed_out_and_never_used_lapse_and_are_bounded() -> None:
    async def test(coordinator: Coordinator, clock: FakeClock) -> None:
        answers = [await _join(coordinator, "") for _ in range(members_per_group_max + 50)]
        required = [a for a in answers if a["ErrorCode"] == MEMBER_ID_REQUIRED]
        assert len(required) == members_per_group_max  # the rest are refused
        assert all(a["ErrorCode"] == INCONSISTENT_GROUP_PROTOCOL for a in answers[len(required) :])
        assert len(coordinator.groups["g"].pending_ids) == members_per_group_max
        await _settle(coordinator, clock, 5_000)
        assert len(coordinator.groups["g"].pending_ids) == members_per_group_max
        await _settle(coordinator, clock, 5_001)  # the session timeout they were asked with
        assert "g" not in coordinator.groups
        late = await _join(coordinator, required[0]["MemberId"])
        assert late["ErrorCode"] == UNKNOWN_MEMBER_ID
        assert (await _join(coordinator, ""))["ErrorCode"] == MEMBER_ID_REQUIRED  # room again

    _run(test)
