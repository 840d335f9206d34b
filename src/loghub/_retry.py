"""One retry helper: call, and on a retryable error wait with capped exponential backoff.

Which errors are worth a retry is decided once, here, from the error tree: the server could
not be reached (``TransportError``), is at a capacity bound or out of disk (``ServerBusy``,
``StorageFull``), a per-shard quota said "slow down" (``QuotaError``, a 403), or the reply was
a 5xx. Everything else is the caller's mistake or a fact (a missing logstore, a bad key, data
lost to damage) that asking again cannot change.

Waiting is an argument (``sleep``), so tests drive it without sleeping. Thread-safe: the
helper keeps no state between calls.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from loghub.errors import (
    DataCorrupted,
    LogHubError,
    QuotaError,
    ServerBusy,
    StorageFull,
    TransportError,
)

__all__ = ["RetryPolicy", "is_retryable", "retry_call"]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts_max`` calls at most; waits start at ``backoff_initial_s``, double, and stop
    growing at ``backoff_max_s``; each wait is jittered down to half so that many clients
    refused together do not come back together."""

    attempts_max: int = 8
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0

    def __post_init__(self) -> None:
        assert self.attempts_max >= 1, self.attempts_max
        assert 0 <= self.backoff_initial_s <= self.backoff_max_s, self

    def backoff_s(self, attempt: int) -> float:
        """The wait after failed attempt number ``attempt`` (1-based), before jitter."""
        return float(min(self.backoff_max_s, self.backoff_initial_s * 2 ** (attempt - 1)))


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, DataCorrupted):
        return False  # the records are gone; asking again returns the same 410
    if isinstance(exc, TransportError | ServerBusy | StorageFull | QuotaError):
        return True
    return isinstance(exc, LogHubError) and exc.status is not None and exc.status >= 500


def retry_call(
    call: Callable[[], T],
    policy: RetryPolicy,
    *,
    retryable: Callable[[BaseException], bool] = is_retryable,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``'s result; a retryable error is retried up to the policy's attempts, then
    raised as it came. ``on_retry(attempt, error, wait_s)`` hears of each retry."""
    attempt = 1
    while True:
        try:
            return call()
        except Exception as exc:
            if attempt >= policy.attempts_max or not retryable(exc):
                raise
            wait_s = policy.backoff_s(attempt) * random.uniform(0.5, 1.0)  # noqa: S311
            if on_retry is not None:
                on_retry(attempt, exc, wait_s)
            sleep(wait_s)
            attempt += 1
