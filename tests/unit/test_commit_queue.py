"""CommitQueue: group commit across shards for appends made on an event loop.

Real shard logs in tmp_path. The commit thread is held inside a round (its sync waits for a
gate) while more appends arrive, so what a round holds does not depend on timing.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from loghub._clock import SystemClock
from loghub.errors import LogSealedError
from loghub.server.commit import CommitQueue
from loghub.storage import ShardLog, StagedAppend, StorageConfig


def _logs(tmp_path: Path, count: int, policy: str = "always") -> list[ShardLog]:
    config = StorageConfig(fsync_policy=policy)  # type: ignore[arg-type]
    return [ShardLog.open(tmp_path / str(i), config, SystemClock()) for i in range(count)]


def _gate_first_completion(log: ShardLog, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Makes the log's next complete_append wait until the returned event is set."""
    gate, real = threading.Event(), log.complete_append
    calls = {"count": 0}

    def gated(staged: StagedAppend) -> int:
        calls["count"] += 1
        if calls["count"] == 1:
            assert gate.wait(10)
        return real(staged)

    monkeypatch.setattr(log, "complete_append", gated)
    return gate


def test_appends_that_arrive_during_a_sync_share_the_next_round_across_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = logs = _logs(tmp_path, 2)
    gate = _gate_first_completion(first, monkeypatch)

    async def scenario() -> tuple[int, list[int], CommitQueue]:
        queue = CommitQueue(asyncio.get_running_loop())
        held = asyncio.ensure_future(queue.append(first, b"first", 1000))
        while queue.rounds < 1:  # the thread has taken round 1 and waits in its sync
            await asyncio.sleep(0.001)
        later = [
            asyncio.ensure_future(queue.append(logs[i % 2], f"p{i}".encode(), 1000))
            for i in range(40)
        ]
        await asyncio.sleep(0.05)
        assert not held.done() and not any(task.done() for task in later)
        gate.set()
        sequences = await asyncio.gather(*later)
        return await held, sequences, queue

    held_seq, sequences, queue = asyncio.run(scenario())
    queue.close()
    assert queue.rounds == 2  # every append that waited went out in one round
    assert held_seq == 0
    assert sequences[0::2] == list(range(1, 21))  # first shard: after the held one, in order
    assert sequences[1::2] == list(range(20))
    # one fdatasync per shard per round, not one per append
    assert first.statistics().fsync_count == 2
    assert second.statistics().fsync_count == 1
    assert first.read(1, 100, 1 << 20).data == b"".join(f"p{i}".encode() for i in range(0, 40, 2))
    for log in logs:
        log.close()


def test_a_failing_shard_fails_only_its_own_appends(tmp_path: Path) -> None:
    sealed, healthy = logs = _logs(tmp_path, 2)
    sealed.seal()

    async def scenario() -> list[int | BaseException]:
        queue = CommitQueue(asyncio.get_running_loop())
        results = await asyncio.gather(
            queue.append(sealed, b"a", 1000),
            queue.append(healthy, b"b", 1000),
            return_exceptions=True,
        )
        queue.close()
        return results

    refused, stored = asyncio.run(scenario())
    assert isinstance(refused, LogSealedError)
    assert stored == 0
    for log in logs:
        log.close()


def test_a_cancelled_request_does_not_cancel_its_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (log,) = _logs(tmp_path, 1)
    gate = _gate_first_completion(log, monkeypatch)

    async def scenario() -> int:
        queue = CommitQueue(asyncio.get_running_loop())
        leaving = asyncio.ensure_future(queue.append(log, b"left", 1000))
        staying = asyncio.ensure_future(queue.append(log, b"stayed", 1000))
        while queue.rounds < 1:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        leaving.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        sequence = await staying
        queue.close()
        return sequence

    assert asyncio.run(scenario()) in (0, 1)
    assert log.end_seq == 2  # the cancelled one was written all the same (as before)
    log.close()


def test_interval_policy_publishes_without_a_sync_per_round(tmp_path: Path) -> None:
    (log,) = _logs(tmp_path, 1, "interval")

    async def scenario() -> list[int]:
        queue = CommitQueue(asyncio.get_running_loop())
        sequences = [await queue.append(log, f"p{i}".encode(), 1000) for i in range(5)]
        queue.close()
        return sequences

    assert asyncio.run(scenario()) == [0, 1, 2, 3, 4]
    assert log.statistics().fsync_count == 0
    log.close()
