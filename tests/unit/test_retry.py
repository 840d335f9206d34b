"""The one retry helper: what is retried, how long it waits, when it gives up."""

from __future__ import annotations

import pytest

from loghub._retry import RetryPolicy, is_retryable, retry_call
from loghub.errors import (
    DataCorrupted,
    LogHubError,
    LogStoreNotExist,
    ParameterInvalid,
    ServerBusy,
    ServerError,
    ShardWriteQuotaExceed,
    SignatureNotMatch,
    StorageFull,
    TransportError,
)


@pytest.mark.parametrize(
    "error",
    [
        TransportError("connection refused"),
        ServerBusy("busy", status=503),
        StorageFull("disk full", status=507),
        ShardWriteQuotaExceed("slow down", status=403),
        LogHubError("oops", status=500),
        ServerError("BadGateway", "unknown code", status=502),
    ],
)
def test_transient_errors_are_retried(error: Exception) -> None:
    assert is_retryable(error)


@pytest.mark.parametrize(
    "error",
    [
        LogStoreNotExist("missing", status=404),
        SignatureNotMatch("wrong key", status=401),
        ParameterInvalid("bad", status=400),
        DataCorrupted("lost to damage", status=410),
        LogHubError("a local failure, not a reply"),
        ValueError("a bug"),
    ],
)
def test_mistakes_and_facts_are_not_retried(error: Exception) -> None:
    assert not is_retryable(error)


def test_retries_until_success_with_growing_capped_waits() -> None:
    outcomes: list[Exception | None] = [TransportError("down")] * 4 + [None]
    waits: list[float] = []

    def call() -> str:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return "sent"

    policy = RetryPolicy(attempts_max=5, backoff_initial_s=1.0, backoff_max_s=3.0)
    assert retry_call(call, policy, sleep=waits.append) == "sent"
    assert len(waits) == 4
    for wait_s, full_s in zip(waits, (1.0, 2.0, 3.0, 3.0), strict=True):
        assert full_s / 2 <= wait_s <= full_s  # jittered down to at most half


def test_gives_up_after_the_last_attempt_with_the_last_error() -> None:
    calls = []

    def call() -> None:
        calls.append(1)
        raise ServerBusy(f"busy {len(calls)}", status=503)

    with pytest.raises(ServerBusy, match="busy 3"):
        retry_call(call, RetryPolicy(attempts_max=3), sleep=lambda _s: None)
    assert len(calls) == 3


def test_a_mistake_is_raised_at_once() -> None:
    calls = []

    def call() -> None:
        calls.append(1)
        raise LogStoreNotExist("missing", status=404)

    with pytest.raises(LogStoreNotExist):
        retry_call(call, RetryPolicy(), sleep=lambda _s: pytest.fail("slept"))
    assert calls == [1]
