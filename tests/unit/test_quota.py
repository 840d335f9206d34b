"""Per-shard quotas (server/quotas.py) on a FakeClock: token buckets, no sleeping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loghub.errors import ShardReadQuotaExceed, ShardWriteQuotaExceed
from loghub.server.quotas import ShardQuota, ShardQuotas
from loghub.testing import FakeClock

SHARD = ("p", "s", 0)
OTHER = ("p", "s", 1)


def test_writes_within_one_second_of_burst_pass_and_the_next_is_refused() -> None:
    quotas = ShardQuotas(FakeClock())
    quota = ShardQuota(write_bytes_per_s=1000)
    for _ in range(3):  # 1000 -> 600 -> 200 -> -200: admitted while any tokens are left
        quotas.admit_write(SHARD, quota, 400)
    with pytest.raises(ShardWriteQuotaExceed, match="1000 bytes/s; retry in 201 ms"):
        quotas.admit_write(SHARD, quota, 1)


def test_a_refused_write_takes_nothing_and_time_refills_the_bucket() -> None:
    clock = FakeClock()
    quotas = ShardQuotas(clock)
    quota = ShardQuota(write_bytes_per_s=1000)
    quotas.admit_write(SHARD, quota, 1500)  # a request larger than the bucket goes into debt
    clock.advance(499)
    for _ in range(5):
        with pytest.raises(ShardWriteQuotaExceed):
            quotas.admit_write(SHARD, quota, 10)
    clock.advance(2)  # the debt of 500 bytes is refilled after 500 ms, refusals or not
    quotas.admit_write(SHARD, quota, 10)


def test_write_requests_per_second_counts_requests_not_bytes() -> None:
    clock = FakeClock()
    quotas = ShardQuotas(clock)
    quota = ShardQuota(write_requests_per_s=5)
    for _ in range(5):
        quotas.admit_write(SHARD, quota, 10_000_000)
    with pytest.raises(ShardWriteQuotaExceed, match="5 requests/s"):
        quotas.admit_write(SHARD, quota, 0)
    clock.advance(200)  # one request's worth
    quotas.admit_write(SHARD, quota, 0)
    with pytest.raises(ShardWriteQuotaExceed):
        quotas.admit_write(SHARD, quota, 0)


def test_shards_have_buckets_of_their_own() -> None:
    quotas = ShardQuotas(FakeClock())
    quota = ShardQuota(write_bytes_per_s=100, read_bytes_per_s=100)
    quotas.admit_write(SHARD, quota, 100)
    quotas.charge_read(SHARD, quota, 100)
    with pytest.raises(ShardWriteQuotaExceed):
        quotas.admit_write(SHARD, quota, 1)
    with pytest.raises(ShardReadQuotaExceed):
        quotas.admit_read(SHARD, quota)
    quotas.admit_write(OTHER, quota, 100)
    quotas.admit_read(OTHER, quota)


def test_a_read_is_admitted_until_the_bytes_it_served_put_the_bucket_in_debt() -> None:
    clock = FakeClock()
    quotas = ShardQuotas(clock)
    quota = ShardQuota(read_bytes_per_s=1000)
    quotas.admit_read(SHARD, quota)
    quotas.charge_read(SHARD, quota, 3000)
    with pytest.raises(ShardReadQuotaExceed, match="retry in 2001 ms"):
        quotas.admit_read(SHARD, quota)
    clock.advance(2001)
    quotas.admit_read(SHARD, quota)


def test_no_quota_tracks_nothing() -> None:
    quotas = ShardQuotas(FakeClock())
    for _ in range(1000):
        quotas.admit_write(SHARD, ShardQuota(), 10**9)
        quotas.admit_read(SHARD, ShardQuota())
        quotas.charge_read(SHARD, ShardQuota(), 10**9)
    assert quotas.tracked() == 0
    assert not ShardQuota().enabled


def test_a_lowered_quota_caps_the_burst_at_once() -> None:
    quotas = ShardQuotas(FakeClock())
    quotas.admit_write(SHARD, ShardQuota(write_bytes_per_s=10_000), 100)  # 9900 left
    lowered = ShardQuota(write_bytes_per_s=50)
    quotas.admit_write(SHARD, lowered, 60)  # only 50 of the 9900 are kept
    with pytest.raises(ShardWriteQuotaExceed):
        quotas.admit_write(SHARD, lowered, 1)


def test_tracked_shards_are_bounded_and_the_least_recently_used_is_forgotten() -> None:
    quotas = ShardQuotas(FakeClock(), buckets_max=3)
    quota = ShardQuota(write_bytes_per_s=10)
    for shard_id in range(3):
        quotas.admit_write(("p", "s", shard_id), quota, 10)
    quotas.admit_write(("p", "s", 3), quota, 10)  # pushes out shard 0
    assert quotas.tracked() == 3
    quotas.admit_write(("p", "s", 0), quota, 10)  # starts with a full bucket again
    with pytest.raises(ShardWriteQuotaExceed):
        quotas.admit_write(("p", "s", 3), quota, 10)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(
    rate=st.integers(1, 10_000),
    steps=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 5000)), max_size=60),
)
def test_admitted_bytes_never_exceed_rate_times_time_plus_burst_plus_one_request(
    rate: int, steps: list[tuple[int, int]]
) -> None:
    clock = FakeClock()
    quotas = ShardQuotas(clock)
    quota = ShardQuota(write_bytes_per_s=rate)
    admitted, largest = 0, 0
    for wait_ms, size in steps:
        clock.advance(wait_ms)
        try:
            quotas.admit_write(SHARD, quota, size)
        except ShardWriteQuotaExceed:
            continue
        admitted += size
        largest = max(largest, size)
        allowed = rate * clock.monotonic_ms() / 1000 + rate + largest
        assert admitted <= allowed + 1e-6
