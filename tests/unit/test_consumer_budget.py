"""The memory budget (reserve before a pull, fair turns) and the pull sizing rules."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from loghub.consumer.budget import MemoryBudget
from loghub.consumer.sizing import (
    GroupSizeEstimate,
    batch_bytes_per_raw_byte,
    batch_cost_bytes,
    pull_count,
    pull_raw_bytes_max,
    pull_raw_bytes_target,
)


def test_a_reservation_that_does_not_fit_waits_until_bytes_are_released() -> None:
    budget = MemoryBudget(100)
    assert budget.try_reserve(1, 60)
    assert not budget.try_reserve(2, 60), "60 + 60 is over the cap"
    assert budget.used_bytes == 60 and budget.waiting == (2,)
    budget.release(60)
    assert budget.try_reserve(2, 60)
    assert budget.waiting == () and budget.high_water_bytes == 60


def test_waiting_shards_take_turns_in_the_order_they_asked() -> None:
    budget = MemoryBudget(100)
    assert budget.try_reserve(1, 90)
    assert not budget.try_reserve(2, 50)  # first in the queue
    assert not budget.try_reserve(3, 5), "5 would fit, but shard 2 asked first"
    budget.release(90)
    assert not budget.try_reserve(3, 5), "still shard 2's turn"
    assert budget.try_reserve(2, 50)
    assert budget.try_reserve(3, 5)


def test_a_shard_that_no_longer_wants_a_pull_does_not_hold_up_the_queue() -> None:
    budget = MemoryBudget(100)
    budget.join(2)
    assert budget.try_reserve(1, 90)
    assert not budget.try_reserve(2, 50)
    assert not budget.try_reserve(3, 5)
    budget.withdraw(2)
    assert budget.try_reserve(3, 5)
    assert not budget.try_reserve(2, 50)
    budget.leave(2)
    assert budget.waiting == ()


def test_a_pull_bigger_than_the_whole_budget_goes_when_nothing_else_is_held() -> None:
    budget = MemoryBudget(100)
    assert budget.try_reserve(1, 500)
    assert not budget.try_reserve(2, 1)
    budget.release(500)
    assert budget.try_reserve(2, 1)


def test_settling_charges_what_the_pull_really_brought() -> None:
    budget = MemoryBudget(100)
    assert budget.try_reserve(1, 40)
    budget.settle(40, 10)
    assert budget.used_bytes == 10
    assert budget.try_reserve(1, 40)
    budget.settle(40, 95)  # more than reserved: charged, and the next ones wait
    assert budget.used_bytes == 105 and budget.high_water_bytes == 105
    assert not budget.try_reserve(2, 1)


def test_the_share_divides_the_budget_among_the_shards_consumed() -> None:
    budget = MemoryBudget(120)
    assert budget.share_bytes() == 120
    for shard in (1, 2, 3):
        budget.join(shard)
    assert budget.share_bytes() == 40
    budget.leave(3)
    assert budget.share_bytes() == 60


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 400), st.integers(0, 400)),
        min_size=1,
        max_size=200,
    )
)
def test_reserved_bytes_never_pass_the_cap_and_every_waiter_gets_its_turn(
    steps: list[tuple[int, int, int]],
) -> None:
    """Shards ask for pulls of random sizes; a granted pull is held for a while, settled to a
    size no larger than reserved, then released. The count stays within the cap, and a
    waiting shard is granted before any shard that started waiting after it."""
    budget = MemoryBudget(500)
    held: list[tuple[int, int]] = []  # (shard, bytes)
    asked_at: dict[int, int] = {}
    grants: list[tuple[int, int]] = []  # (asked at, granted at)
    for step, (shard, size, actual) in enumerate(steps):
        if held and (step % 3 == 0 or shard in {s for s, _ in held}):
            budget.release(held.pop(0)[1])
            continue
        asked_at.setdefault(shard, step)
        before = budget.used_bytes
        if budget.try_reserve(shard, size):
            assert before == 0 or before + size <= budget.bytes_max
            settled = min(size, actual)
            budget.settle(size, settled)
            held.append((shard, settled))
            grants.append((asked_at.pop(shard), step))
        assert budget.used_bytes <= budget.bytes_max, "no single pull here exceeds the cap"
    # first come, first served among the waiters
    granted_order = [asked for asked, _ in grants]
    waited = [asked for asked, granted in grants if granted > asked]
    assert waited == sorted(waited), granted_order


def test_a_batch_is_charged_for_its_decoded_form_not_only_its_wire_size() -> None:
    assert batch_cost_bytes(100, 1000) == 100 + int(1000 * batch_bytes_per_raw_byte)
    assert batch_bytes_per_raw_byte >= 4, "decoded messages are about 3.3 x the raw bytes"


def test_pulls_are_sized_so_that_every_batch_of_a_shard_fits_its_share() -> None:
    share = 8 * 1024 * 1024 // 16
    target = pull_raw_bytes_target(share, 3)
    assert 3 * batch_cost_bytes(target, target) <= share
    assert pull_raw_bytes_target(10**12, 3) == pull_raw_bytes_max
    assert pull_raw_bytes_target(1, 3) == 1, "at least one byte: the server sends one group"


def test_the_log_group_count_adapts_to_the_bytes_per_group_seen() -> None:
    estimate = GroupSizeEstimate()
    assert pull_count(100_000, estimate.group_bytes, 1000) == 1, "unknown size: one group"
    estimate.add(20_000, 10)  # 2,000 bytes per group
    assert pull_count(100_000, estimate.group_bytes, 1000) == 50
    assert pull_count(100_000_000, estimate.group_bytes, 1000) == 1000
    estimate.add(100_000, 5)  # groups got ten times bigger: the estimate follows quickly
    assert estimate.group_bytes is not None and estimate.group_bytes > 10_000
    assert pull_count(100_000, estimate.group_bytes, 1000) < 10
    assert pull_count(100, estimate.group_bytes, 1000) == 1
    assert estimate.expected_raw_bytes(100) == math.ceil(estimate.group_bytes)
