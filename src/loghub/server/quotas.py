"""Per-shard rate quotas, as the hosted service has: write bytes and write requests per
second, read bytes per second, each a token bucket per shard.

Why buckets: a shard's quota is an average rate with room for a short burst. A bucket holds
at most one second of its rate (``rate_per_s`` tokens), refills continuously, and admits a
request while it holds any tokens at all; the request then takes its whole size, so the
bucket may go below zero. A large request is therefore never refused outright (it could never
fit otherwise), but the shard pays for it: later requests wait until the debt is refilled.
Over any interval a shard gets at most ``rate * seconds + one second's burst + one request``.

A rate of 0 means no quota. Reads cannot know their size before they are served, so
``admit_read`` only checks that the bucket is not in debt and ``charge_read`` takes the
bytes afterwards.

Time is a ``Clock`` passed in (``monotonic_ms``), so tests drive the buckets with a
``FakeClock``. Memory is bounded: at most ``buckets_max`` shards are tracked; past that the
least recently used bucket is forgotten (which forgives its debt: a forgotten bucket starts
full, as a fresh one does).

Thread-safety: every method may be called from any thread (one lock; the work under it is a
few arithmetic operations).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from loghub._clock import Clock
from loghub.errors import ShardReadQuotaExceed, ShardWriteQuotaExceed

__all__ = ["ShardQuota", "ShardQuotas", "buckets_max_default", "rate_per_s_max"]

# A rate above this is refused when configured (it would mean no quota in practice, and the
# arithmetic stays in exact float range).
rate_per_s_max = 2**40
buckets_max_default = 100_000

ShardKey = tuple[str, str, int]  # (project, logstore, shard id)


@dataclass(frozen=True)
class ShardQuota:
    """The rates one shard may use; 0 means no quota. The hosted service's figures are
    5 MB/s and 500 requests/s for writes and 10 MB/s for reads."""

    write_bytes_per_s: int = 0
    write_requests_per_s: int = 0
    read_bytes_per_s: int = 0

    def __post_init__(self) -> None:
        for rate in (self.write_bytes_per_s, self.write_requests_per_s, self.read_bytes_per_s):
            assert 0 <= rate <= rate_per_s_max, f"quota rate {rate} out of range"

    @property
    def enabled(self) -> bool:
        return bool(self.write_bytes_per_s or self.write_requests_per_s or self.read_bytes_per_s)


class _Bucket:
    """Tokens refilled at ``rate_per_s`` up to ``rate_per_s`` (one second of burst)."""

    __slots__ = ("rate_per_s", "tokens", "updated_ms")

    def __init__(self, rate_per_s: int, now_ms: int) -> None:
        self.rate_per_s = rate_per_s
        self.tokens = float(rate_per_s)
        self.updated_ms = now_ms

    def refill(self, rate_per_s: int, now_ms: int) -> None:
        if rate_per_s != self.rate_per_s:  # the quota was changed: keep the debt, not the cap
            self.rate_per_s = rate_per_s
            self.tokens = min(self.tokens, float(rate_per_s))
        elapsed_ms = max(0, now_ms - self.updated_ms)
        self.tokens = min(float(rate_per_s), self.tokens + elapsed_ms * rate_per_s / 1000)
        self.updated_ms = now_ms

    @property
    def open(self) -> bool:
        return self.tokens > 0

    def wait_ms(self) -> int:
        """How long until the bucket admits again (0 if it does now)."""
        if self.tokens > 0:
            return 0
        return int(-self.tokens * 1000 / self.rate_per_s) + 1


class _ShardBuckets:
    __slots__ = ("read_bytes", "write_bytes", "write_requests")

    def __init__(self) -> None:
        self.write_bytes: _Bucket | None = None
        self.write_requests: _Bucket | None = None
        self.read_bytes: _Bucket | None = None


class ShardQuotas:
    """The buckets of every shard that has been written or read under a quota."""

    def __init__(self, clock: Clock, buckets_max: int = buckets_max_default) -> None:
        assert buckets_max >= 1
        self._clock = clock
        self._buckets_max = buckets_max
        self._lock = threading.Lock()
        self._shards: OrderedDict[ShardKey, _ShardBuckets] = OrderedDict()

    def admit_write(self, shard: ShardKey, quota: ShardQuota, raw_bytes: int) -> None:
        """Takes one request and ``raw_bytes`` from the shard's write buckets, or raises
        ShardWriteQuotaExceed (taking nothing) when either bucket is empty."""
        assert raw_bytes >= 0
        if not (quota.write_bytes_per_s or quota.write_requests_per_s):
            return
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            buckets = self._entry(shard)
            size = _bucket(buckets, "write_bytes", quota.write_bytes_per_s, now_ms)
            count = _bucket(buckets, "write_requests", quota.write_requests_per_s, now_ms)
            for bucket, unit in ((size, "bytes"), (count, "requests")):
                if bucket is not None and not bucket.open:
                    raise ShardWriteQuotaExceed(
                        f"shard {shard[2]} is over its write quota of {bucket.rate_per_s} "
                        f"{unit}/s; retry in {bucket.wait_ms()} ms"
                    )
            if size is not None:
                size.tokens -= raw_bytes
            if count is not None:
                count.tokens -= 1

    def admit_read(self, shard: ShardKey, quota: ShardQuota) -> None:
        """Raises ShardReadQuotaExceed while the shard's read bucket is in debt."""
        if not quota.read_bytes_per_s:
            return
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            bucket = _bucket(self._entry(shard), "read_bytes", quota.read_bytes_per_s, now_ms)
            assert bucket is not None
            if not bucket.open:
                raise ShardReadQuotaExceed(
                    f"shard {shard[2]} is over its read quota of {bucket.rate_per_s} bytes/s; "
                    f"retry in {bucket.wait_ms()} ms"
                )

    def charge_read(self, shard: ShardKey, quota: ShardQuota, raw_bytes: int) -> None:
        """Takes the bytes a read served (after ``admit_read`` let it in)."""
        assert raw_bytes >= 0
        if not quota.read_bytes_per_s:
            return
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            bucket = _bucket(self._entry(shard), "read_bytes", quota.read_bytes_per_s, now_ms)
            assert bucket is not None
            bucket.tokens -= raw_bytes

    def tracked(self) -> int:
        """How many shards have buckets now (bounded by ``buckets_max``)."""
        with self._lock:
            return len(self._shards)

    def _entry(self, shard: ShardKey) -> _ShardBuckets:
        buckets = self._shards.get(shard)
        if buckets is None:
            buckets = self._shards[shard] = _ShardBuckets()
            while len(self._shards) > self._buckets_max:
                self._shards.popitem(last=False)
        else:
            self._shards.move_to_end(shard)
        return buckets


def _bucket(buckets: _ShardBuckets, name: str, rate_per_s: int, now_ms: int) -> _Bucket | None:
    """The named bucket refilled to ``now_ms``; None (and forgotten) when the rate is 0."""
    if not rate_per_s:
        setattr(buckets, name, None)
        return None
    bucket: _Bucket | None = getattr(buckets, name)
    if bucket is None:
        bucket = _Bucket(rate_per_s, now_ms)
        setattr(buckets, name, bucket)
    else:
        bucket.refill(rate_per_s, now_ms)
    return bucket
