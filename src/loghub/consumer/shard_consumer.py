"""ShardConsumer: one shard's life inside a worker, as an explicit state machine.

::

    INITIALIZING ──(checkpoint read, processor initialised)──> PROCESSING
         │                                                       │ released, lost, worker
         │ stop before it started                                │ stopping, or read-only
         v                                                       v shard read to its end
      STOPPING <─────────────────────────────────────────────────┘
         │ batch in flight done, the rest dropped; processor.shutdown; checkpoint written
         v
    STOP_COMPLETED   (the worker forgets the shard; only now may another worker get it)

Every step runs as a task on the worker's bounded thread pool; ``step()``, called by the
worker's loop, decides which tasks to submit. Per shard at most one *main* task runs at a
time (initialise, process, shut down, final flush), so ``process`` never runs concurrently
with itself and ``shutdown`` never overlaps it. Beside it, one pull (prefetch, up to
``batches_queued_max`` batches ahead) and one background checkpoint flush may run.

Memory: a pull starts only once the worker's ``MemoryBudget`` has granted what it is
expected to cost (``loghub.consumer.sizing``); the batch keeps that charge, settled to its
real cost when it arrives, until ``process`` returns or the batch is dropped. A batch waits
in the queue as the compressed reply body and is decompressed and parsed only when its turn
to be processed comes, on the pool thread that processes it.

What happens when things fail:

- ``process`` raises: reported (logged, counted), and with ``on_process_error="retry"`` the
  shard resumes from its last saved checkpoint after a backoff that doubles up to
  ``process_retry_backoff_ms_max``: a batch is never skipped silently. With ``"skip"`` the
  error is reported and the next batch follows.
- ``process`` returns a cursor: a rollback. Batches fetched after it are dropped, the next
  pull starts there, and the in-memory checkpoint moves there too.
- A pull fails, or its body cannot be parsed: retried after ``fetch_error_backoff_ms``.
  ``InvalidCursor`` (the checkpoint fell behind retention) restarts from the oldest data
  kept, with a warning.
- The assignment says the shard may not be consumed now (``may_consume``): the batch waits.
- The final checkpoint cannot be written: retried ``final_flush_attempts`` times, unless the
  shard has moved to another worker already (``LeaseLostError``), which resumes from the last
  checkpoint written.

End of a read-only shard: when the shard is read-only and the cursor after the last pull is
its end (also for a shard that never held data), the shard stops after its last batch; once
the end checkpoint is written it is *finished* and the worker releases it, so its children
can start.

Thread-safety: ``step``, ``request_stop`` and ``set_end_cursor`` are called by the worker's
loop; tasks run on pool threads. One lock guards the fields; it is never held across I/O or
user code.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from loghub._clock import Clock
from loghub.client import LogHubClient, PulledBody
from loghub.consumer.assignment import Assignment
from loghub.consumer.budget import MemoryBudget
from loghub.consumer.checkpoint import Checkpointer, CheckpointListener, CheckpointTracker
from loghub.consumer.config import ConsumerConfig
from loghub.consumer.processor import ConsumerProcessor, ProcessorFactory
from loghub.consumer.sizing import (
    GroupSizeEstimate,
    batch_cost_bytes,
    pull_count,
    pull_raw_bytes_target,
)
from loghub.errors import IllegalTransition, InvalidCursor, LeaseLostError, LogHubError
from loghub.wire.proto import LogGroup

__all__ = [
    "VALID_PREVIOUS",
    "ShardConsumer",
    "ShardContext",
    "ShardCounters",
    "ShardState",
    "batches_queued_max",
    "consume_check_interval_ms",
    "fetch_error_backoff_ms",
    "final_flush_attempts",
    "final_flush_retry_ms",
    "init_error_backoff_ms",
    "long_poll_wait_ms_max",
    "process_retry_backoff_ms_max",
]

logger = logging.getLogger(__name__)

# Batches pulled ahead per shard: one queued while one is processed keeps the processor busy;
# more only holds memory.
batches_queued_max = 2
# After a failed pull or initialisation: a server restart or a network blip is over by then.
fetch_error_backoff_ms = 1_000
init_error_backoff_ms = 1_000
# A long poll waits at most this long (fetch_interval_ms when shorter): well inside the
# client's HTTP timeout (at least 5 s), and a shard handed over or a worker shutting down is
# not held up by its pull in flight for longer.
long_poll_wait_ms_max = 2_000
# While the assignment cannot vouch for the shard (a heartbeat or renew is late).
consume_check_interval_ms = 100
# The final checkpoint is worth a few tries: without it the next holder repeats data.
final_flush_attempts = 3
final_flush_retry_ms = 500
# A processor that keeps failing is retried at most this far apart.
process_retry_backoff_ms_max = 30_000


class ShardState(enum.Enum):
    INITIALIZING = "initializing"
    PROCESSING = "processing"
    STOPPING = "stopping"
    STOP_COMPLETED = "stop_completed"


#: For each state, the states a shard consumer may come from.
VALID_PREVIOUS: dict[ShardState, frozenset[ShardState]] = {
    ShardState.INITIALIZING: frozenset(),
    ShardState.PROCESSING: frozenset({ShardState.INITIALIZING}),
    ShardState.STOPPING: frozenset({ShardState.INITIALIZING, ShardState.PROCESSING}),
    ShardState.STOP_COMPLETED: frozenset({ShardState.STOPPING}),
}


class ShardCounters:
    """Worker-wide counts, added to by every shard consumer. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.batches = 0
        self.log_groups = 0
        self.process_errors = 0
        self.fetch_errors = 0

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, count in counts.items():
                setattr(self, name, getattr(self, name) + count)


@dataclass(frozen=True)
class ShardContext:
    """What every shard consumer of one worker shares."""

    client: LogHubClient
    config: ConsumerConfig
    assignment: Assignment
    budget: MemoryBudget
    clock: Clock
    processor_factory: ProcessorFactory
    submit: Callable[[Callable[[], None]], None]  # run a task on the worker's pool
    wake: Callable[[], None]  # something changed: run the worker's loop now
    listener: CheckpointListener | None = None
    counters: ShardCounters = field(default_factory=ShardCounters)
    # Set while the server's replies show that it honours the pull byte bound (LogHub does;
    # the hosted service does not): pulls are then sized by bytes alone.
    pull_bytes_honoured: threading.Event = field(default_factory=threading.Event)
    # Pulls that may long-poll at once (None: every one). A long poll holds a pool thread
    # while the server waits, so the worker keeps some threads for processing; a pull that
    # finds no slot free pulls without waiting and pauses fetch_interval_ms, as before.
    long_polls: threading.Semaphore | None = None


@dataclass(frozen=True)
class _Batch:
    pulled: PulledBody  # still compressed: decoded only when processed
    cursor: str
    next_cursor: str
    cost_bytes: int  # charged to the budget until processed or dropped
    count: int


@dataclass(frozen=True)
class _Unreadable:
    """A pulled body that did not decompress or parse: pulled again, never skipped."""

    error: LogHubError


@dataclass(frozen=True)
class _PullPlan:
    count: int
    raw_bytes_max: int
    reserved_bytes: int


@dataclass
class _Progress:
    """Where the shard is (guarded by the consumer's lock)."""

    cursor: str = ""  # the next pull starts here
    last_processed: str = ""  # the resume point after the last batch processed
    end_cursor: str | None = None  # set once the shard is known to be read-only
    generation: int = 0  # bumped by a rollback or a retry: older pulls are dropped
    queue: deque[_Batch] = field(default_factory=deque)
    next_fetch_ms: int = 0
    retry_at_ms: int = 0  # the next main task may not start before this
    failures: int = 0  # consecutive process failures (for the backoff)


class ShardConsumer:
    def __init__(self, shard_id: int, context: ShardContext) -> None:
        self.shard_id = shard_id
        self._ctx = context
        self._lock = threading.Lock()
        self._state = ShardState.INITIALIZING
        self._progress = _Progress()
        self._busy = False  # a main task is in flight
        self._fetching = False
        self._flushing = False
        self._stop_requested = False
        self._finishing = False  # reached the end of a read-only shard
        self._finished = False  # ... and its end checkpoint is written
        self._processor: ConsumerProcessor | None = None
        self._initialized = False  # processor.initialize returned
        self._processor_closed = False
        self._final_flush_tries = 0
        self._final_flushed = False
        self._tracker: CheckpointTracker | None = None
        self._checkpointer: Checkpointer | None = None
        self._group_size = GroupSizeEstimate()

    # -- the worker's loop ---------------------------------------------------------------------

    @property
    def state(self) -> ShardState:
        with self._lock:
            return self._state

    @property
    def done(self) -> bool:
        return self.state is ShardState.STOP_COMPLETED

    @property
    def finished(self) -> bool:
        """Read-only, read to the end, end checkpoint written."""
        with self._lock:
            return self._finished

    def request_stop(self) -> None:
        with self._lock:
            self._stop_requested = True

    def set_end_cursor(self, end_cursor: str | None) -> None:
        """The shard is read-only and ends at ``end_cursor`` (None: writable, or unknown)."""
        with self._lock:
            self._progress.end_cursor = end_cursor

    def step(self, now_ms: int) -> int | None:
        """Submit the tasks that are due; returns when to step again at the latest (None:
        only when a task completes or the assignment changes)."""
        with self._lock:
            if self._state is ShardState.INITIALIZING:
                tasks = self._plan_initializing(now_ms)
            elif self._state is ShardState.PROCESSING:
                tasks = self._plan_processing(now_ms)
            elif self._state is ShardState.STOPPING:
                tasks = self._plan_stopping(now_ms)
            else:
                tasks = []
            due_ms = self._due_ms(now_ms)
        for task in tasks:
            self._ctx.submit(task)
        return due_ms

    # -- planning (the lock is held) -----------------------------------------------------------

    def transition_to(self, state: ShardState) -> None:
        """Move to ``state``, or raise ``IllegalTransition`` when ``VALID_PREVIOUS`` does not
        allow it. The consumer moves itself (from ``step`` and its tasks, holding its lock)."""
        if self._state not in VALID_PREVIOUS[state]:
            raise IllegalTransition(f"shard {self.shard_id}: {self._state.value} -> {state.value}")
        logger.debug("shard %d: %s -> %s", self.shard_id, self._state.value, state.value)
        self._state = state

    def _begin_stopping(self) -> None:
        self.transition_to(ShardState.STOPPING)
        self._ctx.budget.leave(self.shard_id)
        self._progress.retry_at_ms = 0  # a pending retry's backoff must not delay the stop

    def _plan_initializing(self, now_ms: int) -> list[Callable[[], None]]:
        if self._busy:
            return []
        if self._stop_requested:
            self._begin_stopping()
            return self._plan_stopping(now_ms)
        if now_ms < self._progress.retry_at_ms:
            return []
        self._busy = True
        return [self._initialize]

    def _plan_processing(self, now_ms: int) -> list[Callable[[], None]]:
        progress = self._progress
        at_end = progress.end_cursor is not None and progress.cursor == progress.end_cursor
        if at_end and not progress.queue and not self._busy and not self._fetching:
            self._finishing = True
            self._stop_requested = True
        if self._stop_requested:
            self._begin_stopping()
            return self._plan_stopping(now_ms)
        tasks: list[Callable[[], None]] = []
        budget = self._ctx.budget
        if (
            not self._fetching
            and not at_end
            and len(progress.queue) < batches_queued_max
            and now_ms >= progress.next_fetch_ms
        ):
            plan = self._plan_pull()
            if budget.try_reserve(self.shard_id, plan.reserved_bytes):
                self._fetching = True
                tasks.append(partial(self._fetch, progress.cursor, progress.generation, plan))
        else:
            budget.withdraw(self.shard_id)  # no pull wanted now: do not hold up the others
        if not self._busy and progress.queue and now_ms >= progress.retry_at_ms:
            if self._ctx.assignment.may_consume(self.shard_id):
                self._busy = True
                tasks.append(partial(self._process, progress.queue.popleft(), progress.generation))
            else:
                progress.retry_at_ms = now_ms + consume_check_interval_ms
        tracker = self._tracker
        if not self._flushing and tracker is not None and tracker.flush_due(now_ms):
            self._flushing = True
            tasks.append(self._background_flush)
        return tasks

    def _plan_pull(self) -> _PullPlan:
        """The next pull's size and what to reserve for it (see ``sizing``)."""
        ctx = self._ctx
        raw_target = pull_raw_bytes_target(ctx.budget.share_bytes(), batches_queued_max + 1)
        count_max = ctx.config.fetch_log_groups_max
        if ctx.pull_bytes_honoured.is_set():
            count = count_max
            expected_raw = self._group_size.expected_raw_bytes(raw_target)
        else:
            group_bytes = self._group_size.group_bytes
            count = pull_count(raw_target, group_bytes, count_max)
            expected_raw = raw_target if group_bytes is None else int(count * group_bytes) + 1
        # the wire body is at most the raw size: reserve for an uncompressed reply
        return _PullPlan(count, raw_target, batch_cost_bytes(expected_raw, expected_raw))

    def _plan_stopping(self, now_ms: int) -> list[Callable[[], None]]:
        if self._busy:
            return []  # the batch in flight ends first; a pull in flight is simply dropped
        self._drop_queue()
        if not self._processor_closed:
            self._busy = True
            return [self._close_processor]
        if not self._final_flushed:
            if now_ms < self._progress.retry_at_ms:
                return []
            self._busy = True
            return [self._final_flush]
        self.transition_to(ShardState.STOP_COMPLETED)
        return []

    def _due_ms(self, now_ms: int) -> int | None:
        """The earliest future time at which a step could do something new. Times already
        past are left out: what is due but not done waits for a task or the budget, and
        their completion wakes the loop."""
        progress = self._progress
        due: list[int] = []
        if not self._busy:
            due.append(progress.retry_at_ms)
        if self._state is ShardState.PROCESSING:
            if not self._fetching and len(progress.queue) < batches_queued_max:
                due.append(progress.next_fetch_ms)
            if self._tracker is not None:
                flush_ms = self._tracker.next_flush_ms()
                if flush_ms is not None:
                    due.append(flush_ms)
        future = [due_ms for due_ms in due if due_ms > now_ms]
        return min(future) if future else None

    def _drop_queue(self) -> None:
        queue = self._progress.queue
        while queue:
            self._ctx.budget.release(queue.popleft().cost_bytes)

    def _restart_from(self, cursor: str) -> None:
        """Forget what was pulled ahead; the next pull starts at ``cursor``."""
        progress = self._progress
        progress.generation += 1
        self._drop_queue()
        progress.cursor = progress.last_processed = cursor

    # -- tasks (pool threads) ------------------------------------------------------------------

    def _initialize(self) -> None:
        ctx = self._ctx
        config = ctx.config
        try:
            checkpoint = ctx.assignment.read_checkpoint(self.shard_id)
            start = checkpoint or ctx.client.get_cursor(
                config.project, config.logstore, self.shard_id, config.start_cursor_position
            )
            if self._processor is None:
                self._processor = ctx.processor_factory()
            if not self._initialized:
                self._processor.initialize(self.shard_id)
                self._initialized = True
        except Exception:  # the processor's code, or the network: retried either way
            logger.exception("shard %d: initialisation failed, retrying", self.shard_id)
            with self._lock:
                self._busy = False
                self._progress.retry_at_ms = ctx.clock.monotonic_ms() + init_error_backoff_ms
            ctx.wake()
            return
        tracker = CheckpointTracker(
            self.shard_id,
            ctx.assignment.write_checkpoint,
            ctx.clock,
            flush_interval_ms=config.checkpoint_interval_ms,
            persisted=checkpoint,
            start_cursor=start,
            listener=ctx.listener,
        )
        with self._lock:
            self._tracker = tracker
            self._checkpointer = Checkpointer(tracker, config.worker_name)
            self._progress.cursor = self._progress.last_processed = start
            self._busy = False
            self.transition_to(ShardState.PROCESSING)
            ctx.budget.join(self.shard_id)
        logger.info("shard %d: consuming from %s", self.shard_id, start)
        ctx.wake()

    def _fetch(self, cursor: str, generation: int, plan: _PullPlan) -> None:
        ctx = self._ctx
        config = ctx.config
        # At the end of the shard, a LogHub server holds the pull until data comes, up to
        # fetch_interval_ms: data is seen within a round trip instead of after the pause.
        wait_ms = min(config.fetch_interval_ms, long_poll_wait_ms_max)
        long_poll = wait_ms > 0 and (
            ctx.long_polls is None or ctx.long_polls.acquire(blocking=False)
        )
        try:
            pulled = ctx.client.pull_logs_body(
                config.project,
                config.logstore,
                self.shard_id,
                cursor,
                plan.count,
                bytes_max=plan.raw_bytes_max,
                wait_ms=wait_ms if long_poll else None,
            )
        except InvalidCursor:
            ctx.budget.release(plan.reserved_bytes)
            self._fetch_failed(generation, behind_retention=True)
            return
        except LogHubError as exc:
            ctx.budget.release(plan.reserved_bytes)
            logger.info("shard %d: pull failed, retrying: %s", self.shard_id, exc)
            self._fetch_failed(generation, behind_retention=False)
            return
        finally:
            if long_poll and ctx.long_polls is not None:
                ctx.long_polls.release()
        if pulled.bytes_max is None:
            ctx.pull_bytes_honoured.clear()
        else:
            ctx.pull_bytes_honoured.set()
        with self._lock:
            self._fetching = False
            progress = self._progress
            kept = self._state is ShardState.PROCESSING and generation == progress.generation
            cost = batch_cost_bytes(len(pulled.body), pulled.raw_size)
            ctx.budget.settle(plan.reserved_bytes, cost if kept and pulled.count else 0)
            if kept:
                self._group_size.add(pulled.raw_size, pulled.count)
                if pulled.count:
                    batch = _Batch(pulled, cursor, pulled.next_cursor, cost, pulled.count)
                    progress.queue.append(batch)
                progress.cursor = pulled.next_cursor
                # more is waiting when the pull stopped at its count or near its byte bound
                full = pulled.count >= plan.count or (
                    pulled.bytes_max is not None and 2 * pulled.raw_size >= pulled.bytes_max
                )
                # after a long poll the server has waited already (wait_ms 0: it did not)
                pause_ms = 0 if full or pulled.wait_ms else config.fetch_interval_ms
                progress.next_fetch_ms = ctx.clock.monotonic_ms() + pause_ms
        ctx.wake()

    def _fetch_failed(self, generation: int, *, behind_retention: bool) -> None:
        ctx = self._ctx
        begin = None
        if behind_retention:
            try:
                begin = ctx.client.get_cursor(
                    ctx.config.project, ctx.config.logstore, self.shard_id, "begin"
                )
            except LogHubError as exc:
                logger.info("shard %d: cannot get the begin cursor: %s", self.shard_id, exc)
        with self._lock:
            self._fetching = False
            progress = self._progress
            if begin is not None and generation == progress.generation:
                logger.warning(
                    "shard %d: cursor %s is no longer kept (retention); resuming from %s",
                    self.shard_id,
                    progress.cursor,
                    begin,
                )
                self._restart_from(begin)
            else:
                progress.next_fetch_ms = ctx.clock.monotonic_ms() + fetch_error_backoff_ms
            ctx.counters.add(fetch_errors=1)
        ctx.wake()

    def _process(self, batch: _Batch, generation: int) -> None:
        ctx = self._ctx
        try:
            outcome = self._run_processor(batch)
        finally:
            # the decoded groups went with _run_processor's frame: only now is the memory free
            ctx.budget.release(batch.cost_bytes)
        with self._lock:
            self._busy = False
            progress = self._progress
            if isinstance(outcome, _Unreadable):
                ctx.counters.add(fetch_errors=1)
            elif isinstance(outcome, Exception):
                ctx.counters.add(process_errors=1)
            if generation != progress.generation:
                pass  # the shard restarted elsewhere meanwhile (retention); nothing to add
            elif isinstance(outcome, _Unreadable):
                logger.warning(
                    "shard %d: batch %s unreadable, pulling it again: %s",
                    self.shard_id,
                    batch.cursor,
                    outcome.error,
                )
                self._restart_from(batch.cursor)
                progress.next_fetch_ms = ctx.clock.monotonic_ms() + fetch_error_backoff_ms
            elif isinstance(outcome, Exception):
                self._on_process_error(batch, outcome)
            elif outcome:
                logger.info("shard %d: processor rolled back to %s", self.shard_id, outcome)
                self._restart_from(outcome)
                assert self._tracker is not None
                self._tracker.mark(outcome)
                progress.next_fetch_ms = ctx.clock.monotonic_ms()
            else:
                progress.last_processed = batch.next_cursor
                progress.failures = 0
            if not isinstance(outcome, _Unreadable):
                ctx.counters.add(batches=1, log_groups=batch.count)
        ctx.wake()

    def _run_processor(self, batch: _Batch) -> str | None | Exception | _Unreadable:
        """Decode the batch and hand it to the processor: its rollback cursor, or what went
        wrong (the processor's exception, or a body that does not decode)."""
        processor, checkpointer = self._processor, self._checkpointer
        assert processor is not None and checkpointer is not None
        try:
            log_groups: Sequence[LogGroup] = batch.pulled.parse().LogGroups
        except LogHubError as exc:
            return _Unreadable(exc)
        checkpointer._set_batch(batch.cursor, batch.next_cursor)
        try:
            return processor.process(log_groups, checkpointer)
        except Exception as exc:  # the processor's code: reported, then retried or skipped
            return exc

    def _on_process_error(self, batch: _Batch, error: Exception) -> None:
        """Caller holds the lock."""
        ctx = self._ctx
        progress = self._progress
        progress.failures += 1
        if ctx.config.on_process_error == "skip":
            logger.error(
                "shard %d: process() failed; batch %s skipped",
                self.shard_id,
                batch.cursor,
                exc_info=error,
            )
            progress.last_processed = batch.next_cursor
            return
        assert self._tracker is not None
        resume = self._tracker.resume_cursor()
        backoff_ms = min(
            ctx.config.process_retry_backoff_ms * 2 ** min(progress.failures - 1, 16),
            process_retry_backoff_ms_max,
        )
        logger.error(
            "shard %d: process() failed (%d in a row); retrying from checkpoint %s in %d ms",
            self.shard_id,
            progress.failures,
            resume,
            backoff_ms,
            exc_info=error,
        )
        self._restart_from(resume)
        progress.next_fetch_ms = progress.retry_at_ms = ctx.clock.monotonic_ms() + backoff_ms

    def _background_flush(self) -> None:
        tracker = self._tracker
        assert tracker is not None
        try:
            tracker.flush()
        except LogHubError as exc:  # the mark stays; the next flush tries again
            logger.info("shard %d: checkpoint flush failed: %s", self.shard_id, exc)
        finally:
            with self._lock:
                self._flushing = False
            self._ctx.wake()

    def _close_processor(self) -> None:
        """``processor.shutdown`` (when it was initialised), then, at the end of a read-only
        shard that was saved up to its end, the end checkpoint is marked."""
        with self._lock:
            resume = self._progress.last_processed
            end = self._progress.end_cursor if self._finishing else None
        processor, checkpointer = self._processor, self._checkpointer
        if self._initialized and processor is not None and checkpointer is not None:
            checkpointer._set_batch(resume, resume)
            try:
                processor.shutdown(checkpointer)
            except Exception:  # the processor's code: reported; the shard still stops
                logger.exception("shard %d: processor shutdown failed", self.shard_id)
        tracker = self._tracker
        if end is not None and tracker is not None and tracker.resume_cursor() == end:
            # Everything up to the end is saved (or the shard held no data): the end itself
            # is the checkpoint, which is what finishes the shard for its children.
            tracker.mark(end)
        with self._lock:
            self._processor_closed = True
            self._busy = False
        self._ctx.wake()

    def _final_flush(self) -> None:
        tracker = self._tracker
        done = True
        if tracker is not None:
            try:
                tracker.flush()
            except LeaseLostError as exc:
                logger.warning("shard %d: final checkpoint refused: %s", self.shard_id, exc)
            except LogHubError as exc:
                self._final_flush_tries += 1
                done = self._final_flush_tries >= final_flush_attempts
                log = logger.error if done else logger.info
                log("shard %d: final checkpoint failed: %s", self.shard_id, exc)
        with self._lock:
            self._busy = False
            if done:
                self._final_flushed = True
                end = self._progress.end_cursor
                if self._finishing and tracker is not None and tracker.persisted == end:
                    self._finished = True
            else:
                self._progress.retry_at_ms = self._ctx.clock.monotonic_ms() + final_flush_retry_ms
        self._ctx.wake()
