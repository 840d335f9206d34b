"""ShardConsumer, driven step by step: a fake LogHub, a fake assignment, a fake clock, and
tasks run only when the test says so (so "in flight" is a state a test can look at)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from loghub.client import PulledBody, ShardInfo
from loghub.consumer import Checkpointer, ConsumerConfig, ConsumerProcessor, ShardState
from loghub.consumer.budget import MemoryBudget
from loghub.consumer.shard_consumer import (
    VALID_PREVIOUS,
    ShardConsumer,
    ShardContext,
    ShardCounters,
    batches_queued_max,
)
from loghub.consumer.sizing import batch_cost_bytes, pull_raw_bytes_target
from loghub.errors import (
    ConsumerGroupAlreadyExist,
    IllegalTransition,
    InvalidCursor,
    LeaseLostError,
    TransportError,
)
from loghub.testing import FakeClock
from loghub.wire.cursor import decode_cursor, encode_cursor
from loghub.wire.logs import make_log_group
from loghub.wire.proto import LogGroup, LogGroupList


class FakeLogHub:
    """The client calls a worker makes, over in-memory shards; one log {"n": ...} per group."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock
        self.groups: dict[int, list[LogGroup]] = {}
        self.begin: dict[int, int] = {}
        self.shard_infos: dict[int, ShardInfo] = {}
        self.pulls: list[tuple[int, str]] = []
        self.checkpoints: dict[int, str] = {}
        self.checkpoint_calls: list[tuple[int, str, str, bool]] = []
        self.fenced: set[int] = set()  # update_checkpoint(force=False) answers ConsumerNotMatch
        self.grants: list[int] = []
        self.reports: list[list[int]] = []
        self.heartbeat_failures = 0
        self.heartbeat_ms = 0  # how long a heartbeat takes, on the fake clock
        self.groups_created: list[tuple[str, int, bool]] = []
        self.events: list[str] = []
        self.honours_bytes = True
        # LogHub holds a pull at the end of a shard (loghub_wait_ms); the hosted service and
        # this fake by default do not
        self.honours_wait = False
        self.waits: list[int | None] = []  # the wait_ms each pull asked for
        self.pull_requests: list[tuple[int, int, int | None]] = []  # (shard, count, bytes_max)

    def add_shard(self, shard_id: int, logs: int = 0, *, parents: tuple[int, ...] = ()) -> None:
        self.groups[shard_id] = []
        self.begin[shard_id] = 0
        self.shard_infos[shard_id] = ShardInfo(shard_id, "readwrite", "", "", 0, parents)
        self.write(shard_id, logs)

    def write(self, shard_id: int, logs: int) -> None:
        first = len(self.groups[shard_id])
        for n in range(first, first + logs):
            self.groups[shard_id].append(make_log_group([(1, {"n": str(n)})]))

    def close_shard(self, shard_id: int, *, report_end: bool = True) -> None:
        info = self.shard_infos[shard_id]
        end = encode_cursor(len(self.groups[shard_id])) if report_end else None
        self.shard_infos[shard_id] = ShardInfo(
            shard_id, "readonly", "", "", 0, info.parents, end_cursor=end
        )

    # -- LogHubClient ----------------------------------------------------------------------

    def get_cursor(self, project: str, logstore: str, shard_id: int, position: Any) -> str:
        if position == "begin":
            return encode_cursor(self.begin[shard_id])
        return encode_cursor(len(self.groups[shard_id]))

    def pull_logs_body(
        self,
        project: str,
        logstore: str,
        shard_id: int,
        cursor: str,
        count: int = 1000,
        *,
        bytes_max: int | None = None,
        wait_ms: int | None = None,
    ) -> PulledBody:
        """As LogHub answers (the byte bound honoured), or, with ``honours_bytes`` False, as
        the hosted service does (the bound ignored); bodies go uncompressed."""
        self.pulls.append((shard_id, cursor))
        self.pull_requests.append((shard_id, count, bytes_max))
        self.waits.append(wait_ms)
        position = decode_cursor(cursor)
        groups = self.groups[shard_id]
        if not self.begin[shard_id] <= position <= len(groups):
            raise InvalidCursor(f"cursor {cursor} out of range")
        applied = bytes_max if self.honours_bytes else None
        group_list = LogGroupList()
        for group in groups[position : position + count]:
            size = group.ByteSize() + 2  # as framed in the list
            if (
                applied is not None
                and group_list.LogGroups
                and (group_list.ByteSize() + size > applied)
            ):
                break
            group_list.LogGroups.append(group)
        body = group_list.SerializeToString()
        taken = len(group_list.LogGroups)
        waited = wait_ms if self.honours_wait else None
        next_cursor = encode_cursor(position + taken)
        return PulledBody(body, None, next_cursor, taken, len(body), applied, waited)

    def list_shards(self, project: str, logstore: str) -> list[ShardInfo]:
        return [self.shard_infos[s] for s in sorted(self.shard_infos)]

    def create_consumer_group(
        self, project: str, logstore: str, group: str, timeout_s: int, ordered: bool = False
    ) -> None:
        if self.groups_created:
            raise ConsumerGroupAlreadyExist("exists")
        self.groups_created.append(("create", timeout_s, ordered))

    def update_consumer_group(
        self, project: str, logstore: str, group: str, timeout_s: int, ordered: bool
    ) -> None:
        self.groups_created.append(("update", timeout_s, ordered))

    def heartbeat(
        self, project: str, logstore: str, group: str, consumer: str, held: Sequence[int]
    ) -> list[int]:
        if self.clock is not None:
            self.clock.advance(self.heartbeat_ms)
        if self.heartbeat_failures:
            self.heartbeat_failures -= 1
            raise TransportError("network down")
        self.reports.append(list(held))
        self.events.append(f"heartbeat {list(held)}")
        return list(self.grants)

    def update_checkpoint(
        self,
        project: str,
        logstore: str,
        group: str,
        shard_id: int,
        cursor: str,
        consumer: str = "",
        force: bool = True,
    ) -> None:
        from loghub.errors import ConsumerNotMatch

        if not force and shard_id in self.fenced:
            raise ConsumerNotMatch("not yours")
        self.checkpoint_calls.append((shard_id, cursor, consumer, force))
        self.events.append(f"checkpoint {shard_id} {decode_cursor(cursor)}")
        self.checkpoints[shard_id] = cursor

    def get_checkpoints(
        self, project: str, logstore: str, group: str, shard_id: int | None = None
    ) -> dict[int, str]:
        return {shard_id: self.checkpoints.get(shard_id, "")} if shard_id is not None else {}

    def close(self) -> None:
        pass


class FakeAssignment:
    def __init__(self) -> None:
        self.checkpoints: dict[int, str] = {}
        self.writes: list[tuple[int, int]] = []  # (shard, sequence)
        self.consumable = True
        self.lost: set[int] = set()
        self.write_failures = 0

    def read_checkpoint(self, shard_id: int) -> str:
        return self.checkpoints.get(shard_id, "")

    def write_checkpoint(self, shard_id: int, cursor: str) -> None:
        if shard_id in self.lost:
            raise LeaseLostError("gone")
        if self.write_failures:
            self.write_failures -= 1
            raise TransportError("database down")
        self.checkpoints[shard_id] = cursor
        self.writes.append((shard_id, decode_cursor(cursor)))

    def may_consume(self, shard_id: int) -> bool:
        return self.consumable


class Tasks:
    """The worker's pool, run by hand: ``run()`` runs what is queued, in order."""

    def __init__(self) -> None:
        self.queue: list[Callable[[], None]] = []

    def submit(self, task: Callable[[], None]) -> None:
        self.queue.append(task)

    def run(self) -> int:
        ran = 0
        while self.queue:
            self.queue.pop(0)()
            ran += 1
        return ran


class Recorder(ConsumerProcessor):
    """Records the numbers it sees; saves each batch (``persistent`` as asked); can fail or
    roll back on chosen calls."""

    def __init__(self, persistent: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.persistent = persistent
        self.fail_calls: set[int] = set()
        self.rollback_calls: dict[int, str] = {}
        self.calls = 0
        self.shut_down = 0

    def process(self, log_groups: Sequence[LogGroup], checkpointer: Checkpointer) -> str | None:
        self.calls += 1
        if self.calls in self.fail_calls:
            raise RuntimeError("processor bug")
        self.batches.append([int(g.Logs[0].Contents[0].Value) for g in log_groups])
        if self.calls in self.rollback_calls:
            return self.rollback_calls[self.calls]
        checkpointer.save(persistent=self.persistent)
        return None

    def shutdown(self, checkpointer: Checkpointer) -> None:
        self.shut_down += 1

    def seen(self) -> list[int]:
        return [n for batch in self.batches for n in batch]


class Harness:
    def __init__(self, logs: int = 0, *, count: int = 10, budget_bytes: int = 1 << 20,
                 **config: Any) -> None:  # fmt: skip
        self.clock = FakeClock()
        self.hub = FakeLogHub()
        self.hub.add_shard(0, logs)
        self.assignment = FakeAssignment()
        self.tasks = Tasks()
        self.processor = Recorder()
        self.budget = MemoryBudget(budget_bytes)
        settings = {"checkpoint_interval_ms": 60_000, "fetch_interval_ms": 500} | config
        self.config = ConsumerConfig(
            "127.0.0.1:1", "proj", "logs", "grp", "w1", fetch_log_groups_max=count, **settings
        )
        self.context = ShardContext(
            client=self.hub,  # type: ignore[arg-type]
            config=self.config,
            assignment=self.assignment,  # type: ignore[arg-type]
            budget=self.budget,
            clock=self.clock,
            processor_factory=lambda: self.processor,
            submit=self.tasks.submit,
            wake=lambda: None,
            counters=ShardCounters(),
        )
        # a worker that knows its server honours the byte bound (LogHub): pulls take
        # ``count`` groups from the first; tests of the other case clear this
        self.context.pull_bytes_honoured.set()
        self.consumer = ShardConsumer(0, self.context)

    def settle(self, rounds: int = 100) -> None:
        """Step and run tasks until nothing more happens at this time."""
        for _ in range(rounds):
            self.consumer.step(self.clock.monotonic_ms())
            if not self.tasks.run():
                return
        raise AssertionError("the consumer never settles")

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.settle()


# -- the state machine -------------------------------------------------------------------------


def test_the_table_allows_only_the_documented_moves() -> None:
    expected = {
        ShardState.INITIALIZING: frozenset(),
        ShardState.PROCESSING: {ShardState.INITIALIZING},
        ShardState.STOPPING: {ShardState.INITIALIZING, ShardState.PROCESSING},
        ShardState.STOP_COMPLETED: {ShardState.STOPPING},
    }
    assert expected == VALID_PREVIOUS


def test_a_shard_goes_initializing_processing_stopping_stop_completed() -> None:
    h = Harness(logs=3)
    assert h.consumer.state is ShardState.INITIALIZING
    h.consumer.step(0)
    assert h.consumer.state is ShardState.INITIALIZING  # the initialise task is in flight
    h.tasks.run()
    assert h.consumer.state is ShardState.PROCESSING
    h.settle()
    assert h.processor.seen() == [0, 1, 2]
    h.consumer.request_stop()
    h.consumer.step(0)
    assert h.consumer.state is ShardState.STOPPING
    h.settle()
    assert h.consumer.state is ShardState.STOP_COMPLETED and h.consumer.done
    assert h.processor.shut_down == 1


def test_an_illegal_move_raises() -> None:
    h = Harness()
    with pytest.raises(IllegalTransition):
        h.consumer.transition_to(ShardState.STOP_COMPLETED)  # not from INITIALIZING
    h.settle()
    with pytest.raises(IllegalTransition):
        h.consumer.transition_to(ShardState.INITIALIZING)


def test_a_stop_before_the_shard_started_skips_the_processor() -> None:
    h = Harness(logs=3)
    h.consumer.request_stop()
    h.settle()
    assert h.consumer.done
    assert h.processor.calls == 0 and h.processor.shut_down == 0
    assert h.assignment.writes == []


def test_process_never_runs_concurrently_with_itself() -> None:
    h = Harness(logs=30, count=5)
    h.consumer.step(0)
    h.tasks.run()  # initialised
    h.consumer.step(0)
    h.tasks.run()  # the first pull
    for _ in range(5):
        h.consumer.step(0)
        process_tasks = [
            t for t in h.tasks.queue if getattr(t, "func", None) == h.consumer._process
        ]
        assert len(process_tasks) <= 1
        h.tasks.run()
    h.settle()
    assert h.processor.seen() == list(range(30))


# -- checkpoints -------------------------------------------------------------------------------


def test_saves_stay_in_memory_until_the_flush_interval_passes() -> None:
    h = Harness(logs=3, checkpoint_interval_ms=1_000)
    h.settle()
    assert h.processor.seen() == [0, 1, 2]
    assert h.assignment.writes == []
    h.advance(999)
    assert h.assignment.writes == []
    h.advance(1)
    assert h.assignment.writes == [(0, 3)]
    h.advance(5_000)
    assert h.assignment.writes == [(0, 3)], "an unchanged checkpoint is not written again"


def test_a_persistent_save_is_written_at_once() -> None:
    h = Harness(logs=3)
    h.processor.persistent = True
    h.settle()
    assert h.assignment.writes == [(0, 3)]


def test_a_release_writes_the_in_memory_checkpoint() -> None:
    h = Harness(logs=4, count=2)
    h.settle()
    assert h.assignment.writes == []
    h.consumer.request_stop()
    h.settle()
    assert h.assignment.writes == [(0, 4)]
    assert h.consumer.done and not h.consumer.finished


def test_a_shard_resumes_from_its_checkpoint() -> None:
    h = Harness(logs=5)
    h.assignment.checkpoints[0] = encode_cursor(3)
    h.settle()
    assert h.processor.seen() == [3, 4]


def test_a_failed_final_checkpoint_is_retried_then_given_up() -> None:
    h = Harness(logs=2)
    h.settle()
    h.assignment.write_failures = 1
    h.consumer.request_stop()
    h.settle()
    assert not h.consumer.done  # waiting to retry
    h.advance(500)
    assert h.consumer.done and h.assignment.writes == [(0, 2)]


def test_a_lost_shard_stops_without_retrying_its_final_checkpoint() -> None:
    h = Harness(logs=2)
    h.settle()
    h.assignment.lost.add(0)
    h.consumer.request_stop()
    h.settle()
    assert h.consumer.done and h.assignment.writes == []


# -- processor errors and rollbacks -------------------------------------------------------------


def test_a_failing_batch_is_retried_from_the_last_checkpoint_not_skipped() -> None:
    h = Harness(logs=6, count=2, process_retry_backoff_ms=1_000)
    h.processor.fail_calls = {2}  # the batch [2, 3] fails once
    h.settle()
    assert h.processor.seen() == [0, 1]
    assert h.context.counters.process_errors == 1
    h.advance(999)
    assert h.processor.seen() == [0, 1], "the retry waits for its backoff"
    h.advance(1)
    assert h.processor.seen() == [0, 1, 2, 3, 4, 5]


def test_consecutive_failures_back_off_exponentially() -> None:
    h = Harness(logs=2, process_retry_backoff_ms=100)
    h.processor.fail_calls = {1, 2, 3}
    h.settle()
    h.advance(100)  # second try fails
    h.advance(199)
    assert h.processor.calls == 2
    h.advance(1)  # third try, after 200 ms, fails
    assert h.processor.calls == 3
    h.advance(400)
    assert h.processor.seen() == [0, 1]


def test_the_skip_policy_reports_the_error_and_moves_on() -> None:
    h = Harness(logs=6, count=2, on_process_error="skip")
    h.processor.fail_calls = {2}
    h.settle()
    assert h.processor.seen() == [0, 1, 4, 5]
    assert h.context.counters.process_errors == 1


def test_a_returned_cursor_rolls_the_shard_back() -> None:
    h = Harness(logs=6, count=3)
    h.processor.rollback_calls = {2: encode_cursor(1)}  # after [3, 4, 5]: back to 1
    h.settle()
    assert h.processor.batches[:3] == [[0, 1, 2], [3, 4, 5], [1, 2, 3]]
    h.consumer.request_stop()
    h.settle()
    assert h.assignment.writes[-1] == (0, 6)


def test_a_rollback_moves_the_checkpoint_back_to_where_the_shard_resumes() -> None:
    h = Harness(logs=3, count=3)
    h.processor.persistent = True
    h.settle()
    assert h.assignment.writes == [(0, 3)]
    h.hub.write(0, 1)
    h.processor.rollback_calls = {2: encode_cursor(1)}
    h.clock.advance(500)
    h.consumer.step(h.clock.monotonic_ms())
    h.tasks.run()  # the pull of [3]
    h.consumer.step(h.clock.monotonic_ms())
    h.tasks.run()  # process: rolls back to 1
    h.consumer.request_stop()
    h.settle()
    assert h.processor.batches == [[0, 1, 2], [3]]
    assert h.assignment.writes == [(0, 3), (0, 1)], "the next holder starts at the rollback"


# -- fetching, memory and the assignment -------------------------------------------------------


def test_a_pull_starts_only_once_its_expected_cost_is_reserved() -> None:
    h = Harness(logs=40, count=4, budget_bytes=64 * 1024)
    h.consumer.step(0)
    h.tasks.run()  # initialised
    assert h.budget.try_reserve(99, 60 * 1024), "another shard holds most of the budget"
    h.consumer.step(0)
    kinds = [getattr(t, "func", t).__name__ for t in h.tasks.queue]
    assert kinds == [] and h.hub.pulls == [], "no pull while its reservation does not fit"
    assert h.budget.waiting == (0,)
    h.budget.release(60 * 1024)
    h.settle()
    assert h.processor.seen() == list(range(40))
    assert h.budget.used_bytes == 0 and h.budget.waiting == ()
    assert h.budget.high_water_bytes <= h.budget.bytes_max


def test_a_batch_is_charged_its_decoded_cost_until_processed() -> None:
    h = Harness(logs=40, count=4)
    h.consumer.step(0)
    h.tasks.run()  # initialised
    h.consumer.step(0)
    h.tasks.run()  # one pull of 4 groups, queued
    (batch,) = h.consumer._progress.queue
    assert batch.cost_bytes == batch_cost_bytes(len(batch.pulled.body), batch.pulled.raw_size)
    assert h.budget.used_bytes == batch.cost_bytes > 4 * batch.pulled.raw_size
    h.assignment.consumable = False
    h.settle()
    assert h.budget.used_bytes > 0, "queued batches stay charged"
    h.assignment.consumable = True
    h.advance(100)
    h.consumer.request_stop()
    h.settle()
    assert h.budget.used_bytes == 0


def test_pulls_ask_a_loghub_server_for_the_shards_share_in_bytes() -> None:
    one_group_bytes = make_log_group([(1, {"n": "0"})]).ByteSize() + 2
    budget_bytes = 3 * batch_cost_bytes(5 * one_group_bytes, 5 * one_group_bytes) + 3
    h = Harness(logs=40, count=1000, budget_bytes=budget_bytes)
    h.settle()
    assert h.processor.seen() == list(range(40))
    _shard, count, bytes_max = h.hub.pull_requests[0]
    assert count == 1000 and bytes_max == pull_raw_bytes_target(budget_bytes, 3)
    assert max(len(batch) for batch in h.processor.batches) == 5, "sized by bytes, not count"
    assert h.budget.high_water_bytes <= budget_bytes


def test_against_a_server_without_the_byte_bound_the_count_adapts_to_group_sizes() -> None:
    one_group_bytes = make_log_group([(1, {"n": "0"})]).ByteSize() + 2
    budget_bytes = 3 * batch_cost_bytes(5 * one_group_bytes, 5 * one_group_bytes) + 3
    h = Harness(logs=40, count=1000, budget_bytes=budget_bytes)
    h.hub.honours_bytes = False  # the hosted service ignores loghub_max_bytes
    h.context.pull_bytes_honoured.clear()
    h.settle()
    assert h.processor.seen() == list(range(40))
    counts = [count for _shard, count, _bytes in h.hub.pull_requests]
    assert counts[0] == 1, "the group size is not known yet: one group"
    assert set(counts[1:-1]) <= {4, 5}, counts  # "n" grows by a digit at 10
    assert not h.context.pull_bytes_honoured.is_set()
    assert h.budget.high_water_bytes <= budget_bytes


def test_a_body_that_does_not_decode_is_pulled_again_not_skipped() -> None:
    h = Harness(logs=6, count=3)
    original = h.hub.pull_logs_body
    broken = [True]

    def pull(*args: Any, **kwargs: Any) -> PulledBody:
        pulled = original(*args, **kwargs)
        if broken and pulled.count:
            broken.clear()
            return dataclasses.replace(pulled, body=b"\xff" * len(pulled.body))
        return pulled

    h.hub.pull_logs_body = pull  # type: ignore[method-assign]
    h.settle()
    assert h.context.counters.fetch_errors == 1 and h.processor.seen() == []
    h.advance(1_000)
    assert h.processor.seen() == [0, 1, 2, 3, 4, 5]
    assert h.budget.used_bytes == 0


def test_at_most_a_few_batches_are_pulled_ahead() -> None:
    h = Harness(logs=100, count=5)
    h.settle()
    h.assignment.consumable = False  # processing waits
    h.processor.calls = 0
    for _ in range(10):
        h.consumer.step(0)
        h.tasks.run()
    assert len(h.consumer._progress.queue) <= batches_queued_max


def test_nothing_is_processed_while_the_assignment_cannot_vouch_for_the_shard() -> None:
    h = Harness(logs=3)
    h.assignment.consumable = False
    h.settle()
    assert h.processor.calls == 0
    h.assignment.consumable = True
    h.advance(100)
    assert h.processor.seen() == [0, 1, 2]


def test_an_idle_shard_is_polled_every_fetch_interval() -> None:
    h = Harness(logs=0, fetch_interval_ms=500)
    h.settle()
    pulls = len(h.hub.pulls)
    h.advance(499)
    assert len(h.hub.pulls) == pulls
    h.advance(1)
    assert len(h.hub.pulls) == pulls + 1


def test_against_a_long_polling_server_an_empty_pull_is_followed_by_the_next_at_once() -> None:
    h = Harness(logs=0, fetch_interval_ms=500)
    h.hub.honours_wait = True
    h.consumer.step(0)
    h.tasks.run()  # initialised
    for _ in range(3):  # each pull waited on the server already: no pause in between
        h.consumer.step(h.clock.monotonic_ms())
        h.tasks.run()
    assert len(h.hub.pulls) == 3
    assert h.hub.waits == [500, 500, 500], "pulls ask the server to wait fetch_interval_ms"


def test_data_after_a_long_poll_is_processed_without_a_pause() -> None:
    h = Harness(logs=0, fetch_interval_ms=500)
    h.hub.honours_wait = True
    h.consumer.step(0)
    h.tasks.run()
    h.consumer.step(0)
    h.tasks.run()  # an empty long poll
    h.hub.write(0, 2)
    for _ in range(4):  # the next pull (at once) brings them; processing follows
        h.consumer.step(h.clock.monotonic_ms())
        h.tasks.run()
    assert h.processor.seen() == [0, 1]
    assert h.clock.monotonic_ms() == 0, "no time had to pass"


def test_a_pull_long_polls_only_with_a_free_slot_and_gives_it_back() -> None:
    h = Harness(logs=0, fetch_interval_ms=500)
    h.hub.honours_wait = True
    slots = threading.Semaphore(1)
    h.context = dataclasses.replace(h.context, long_polls=slots)
    h.consumer = ShardConsumer(0, h.context)
    for _ in range(3):  # initialise, then two pulls
        h.consumer.step(0)
        h.tasks.run()
    assert h.hub.waits == [500, 500], "the slot came back after each pull"
    assert slots.acquire(blocking=False)  # now another shard holds the only slot
    h.consumer.step(0)
    h.tasks.run()
    assert h.hub.waits == [500, 500, None], "no slot: a pull that does not wait"
    h.settle()
    h.advance(499)
    assert len(h.hub.pulls) == 3, "...followed by the pause, as without long polling"
    h.advance(1)
    assert len(h.hub.pulls) == 4


def test_a_full_batch_is_followed_by_another_pull_at_once() -> None:
    h = Harness(logs=25, count=10, fetch_interval_ms=500)
    h.settle()
    assert h.processor.seen() == list(range(25)), "no pause after full batches"


def test_a_checkpoint_behind_retention_resumes_from_the_oldest_data() -> None:
    h = Harness(logs=10)
    h.assignment.checkpoints[0] = encode_cursor(2)
    h.hub.begin[0] = 5
    h.settle()
    assert h.processor.seen() == [5, 6, 7, 8, 9]


def test_a_failed_pull_is_retried_after_a_backoff() -> None:
    h = Harness(logs=3)
    h.settle()
    h.hub.write(0, 2)
    original = h.hub.pull_logs_body
    h.hub.pull_logs_body = lambda *a, **k: (_ for _ in ()).throw(TransportError("down"))  # type: ignore[method-assign]
    h.advance(500)
    assert h.context.counters.fetch_errors == 1
    h.hub.pull_logs_body = original  # type: ignore[method-assign]
    h.advance(999)
    assert h.processor.seen() == [0, 1, 2]
    h.advance(1)
    assert h.processor.seen() == [0, 1, 2, 3, 4]


# -- the end of a read-only shard ---------------------------------------------------------------


def test_a_read_only_shard_read_to_its_end_writes_its_end_and_finishes() -> None:
    h = Harness(logs=5, count=2)
    h.hub.close_shard(0)
    h.consumer.set_end_cursor(h.hub.shard_infos[0].end_cursor)
    h.settle()
    assert h.processor.seen() == [0, 1, 2, 3, 4]
    assert h.consumer.done and h.consumer.finished
    assert h.assignment.writes[-1] == (0, 5)
    assert h.processor.shut_down == 1


def test_an_empty_read_only_shard_finishes_too() -> None:
    h = Harness(logs=0)
    h.hub.close_shard(0)
    h.consumer.set_end_cursor(h.hub.shard_infos[0].end_cursor)
    h.settle()
    assert h.consumer.finished and h.assignment.writes == [(0, 0)]


def test_a_shard_that_turns_read_only_finishes_once_its_end_is_known() -> None:
    h = Harness(logs=3)
    h.settle()
    h.hub.write(0, 2)
    h.hub.close_shard(0)
    h.advance(500)
    assert h.processor.seen() == [0, 1, 2, 3, 4] and not h.consumer.done
    h.consumer.set_end_cursor(h.hub.shard_infos[0].end_cursor)
    h.settle()
    assert h.consumer.finished and h.assignment.writes[-1] == (0, 5)


def test_a_shard_whose_processor_did_not_save_is_not_finished() -> None:
    h = Harness(logs=3)

    class Forgetful(Recorder):
        def process(self, log_groups: Sequence[LogGroup], checkpointer: Checkpointer) -> None:
            self.calls += 1

    h.processor = Forgetful()
    h.hub.close_shard(0)
    h.consumer.set_end_cursor(h.hub.shard_infos[0].end_cursor)
    h.settle()
    assert h.consumer.done and not h.consumer.finished
    assert h.assignment.writes == []


def test_a_stop_does_not_wait_for_a_pending_retry() -> None:
    h = Harness(logs=2, process_retry_backoff_ms=30_000)
    h.processor.fail_calls = {1}
    h.settle()
    h.consumer.request_stop()
    h.settle()
    assert h.consumer.done and h.processor.shut_down == 1
