"""The in-flight body budget: bodies within it go at once, others wait in arrival order, a
body larger than the whole budget goes alone, and a wait that runs out is ServerBusy."""

from __future__ import annotations

import asyncio

import pytest

from loghub.errors import ServerBusy
from loghub.server.admission import BodyBudget


async def _hold(budget: BodyBudget, size: int, order: list[int], release: asyncio.Event) -> None:
    async with budget.room(size):
        order.append(size)
        await release.wait()


def test_bodies_within_the_budget_go_at_once_and_others_wait_in_order() -> None:
    async def scenario() -> None:
        budget = BodyBudget(100, wait_s=5)
        order: list[int] = []
        first, rest = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold(budget, 60, order, first))
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(_hold(budget, size, order, rest)) for size in (50, 10)]
        await asyncio.sleep(0.01)
        # 10 would fit, but waits behind 50: arrival order, so large bodies are not starved
        assert order == [60]
        first.set()
        await holder
        await asyncio.sleep(0.01)
        assert order == [60, 50, 10]
        assert budget.in_use_bytes == 60
        rest.set()
        await asyncio.gather(*waiting)
        assert budget.in_use_bytes == 0

    asyncio.run(scenario())


def test_a_body_larger_than_the_budget_goes_alone() -> None:
    async def scenario() -> None:
        budget = BodyBudget(100, wait_s=5)
        async with budget.room(500):
            assert budget.in_use_bytes == 500
        assert budget.in_use_bytes == 0

    asyncio.run(scenario())


def test_a_wait_that_runs_out_is_server_busy_and_frees_its_place() -> None:
    async def scenario() -> None:
        budget = BodyBudget(100, wait_s=0.05)
        release = asyncio.Event()
        holder = asyncio.create_task(_hold(budget, 100, [], release))
        await asyncio.sleep(0)
        with pytest.raises(ServerBusy):
            async with budget.room(1):
                raise AssertionError("let in over the budget")
        release.set()
        await holder
        async with budget.room(100):  # nothing left behind by the wait that gave up
            assert budget.in_use_bytes == 100

    asyncio.run(scenario())


def test_bodyless_requests_take_no_room() -> None:
    async def scenario() -> None:
        budget = BodyBudget(1, wait_s=0.01)
        async with budget.room(1), budget.room(0):
            assert budget.in_use_bytes == 1

    asyncio.run(scenario())
