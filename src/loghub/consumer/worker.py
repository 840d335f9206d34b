"""ConsumerWorker: consumes a logstore with a consumer group, one processor per shard.

::

    worker = ConsumerWorker(MyProcessor, ConsumerConfig(endpoint=..., project=..., ...))
    worker.start()          # in a thread; or worker.run() as the main loop
    ...
    worker.shutdown()       # clean: every shard stopped, checkpoints written, then leave

Threads: the worker's loop (``run``), one coordination thread (heartbeats in server mode,
lease renewals in lease mode) and a bounded pool (``pool_threads``) that runs the shards'
tasks (``ShardConsumer``). The loop owns the shard consumers: it starts one for every shard
the assignment gives, asks the others to stop, steps them, and forgets them only once they
are ``STOP_COMPLETED``; then the assignment stops reporting them.

Shutdown order (the one the spec's "burnt by" list asks for): stop fetching, finish the
batch in flight, ``processor.shutdown``, write every checkpoint, and only then stop
heartbeating (server mode) or release the leases (lease mode). A shard that does not stop
within ``shutdown_wait_ms_max`` (a processor stuck in user code) is abandoned: its new
holder resumes from its last written checkpoint.

``run_until_signal`` runs a worker until SIGTERM or SIGINT, for programs whose main thread
has nothing else to do (``loghub consume`` uses it).

Thread-safety: ``start``, ``shutdown``, ``join`` and ``statistics`` may be called from any
thread (``shutdown`` from a processor too).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from loghub._clock import Clock, SystemClock
from loghub.client import LogHubClient
from loghub.consumer.assignment import Assignment
from loghub.consumer.budget import MemoryBudget
from loghub.consumer.checkpoint import CheckpointListener
from loghub.consumer.config import ConsumerConfig
from loghub.consumer.heartbeat import HeartbeatAssignment
from loghub.consumer.leases import LeaseAssignment
from loghub.consumer.memory import keep_freed_memory
from loghub.consumer.processor import ProcessorFactory
from loghub.consumer.shard_consumer import ShardConsumer, ShardContext, ShardCounters

__all__ = [
    "ConsumerWorker",
    "WorkerStatistics",
    "loop_wait_ms_max",
    "request_timeout_s_min",
    "run_until_signal",
    "shutdown_wait_ms_max",
    "stop_signals",
]

logger = logging.getLogger(__name__)

# The loop runs at least this often even when nothing wakes it: a safety net, not a schedule.
loop_wait_ms_max = 1_000
# How long a clean shutdown waits for shards to stop before abandoning them.
shutdown_wait_ms_max = 60_000
# Requests to a server slower than this count as failed (bounds a hung pull or heartbeat).
request_timeout_s_min = 5.0
stop_signals = (signal.SIGTERM, signal.SIGINT)
# How often ``run_until_signal`` checks that the worker and the parent process are alive.
_signal_poll_s = 0.5


@dataclass(frozen=True)
class WorkerStatistics:
    shards: tuple[int, ...]  # shards with a consumer here now (in any state)
    batches: int
    log_groups: int
    process_errors: int
    fetch_errors: int
    buffered_bytes: int  # charged to the memory budget: reserved, pulled, not yet processed
    buffered_bytes_high_water: int


class ConsumerWorker:
    """One consumer of a consumer group. ``processor_factory`` makes one processor per shard
    (usually the processor class); ``config`` says where and how (``ConsumerConfig``).

    ``on_checkpoint(shard_id, cursor)`` is called after each checkpoint written durably.
    ``clock``, ``client`` and ``assignment`` are for tests (a fake clock, a client over an
    in-process transport, an assignment over a memory lease store).
    """

    def __init__(
        self,
        processor_factory: ProcessorFactory,
        config: ConsumerConfig,
        *,
        on_checkpoint: CheckpointListener | None = None,
        clock: Clock | None = None,
        client: LogHubClient | None = None,
        assignment: Assignment | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self._clock = clock or SystemClock()
        self._owns_client = client is None
        self._client = client or LogHubClient(
            config.endpoint,
            config.access_key_id,
            config.access_key_secret,
            timeout_s=max(request_timeout_s_min, config.timeout_ms / 1000),
            clock=self._clock,
        )
        self._wake_event = threading.Event()
        self._stop = threading.Event()
        self._assignment = assignment or self._make_assignment()
        self._budget = MemoryBudget(config.buffer_bytes_max)
        self._counters = ShardCounters()
        self._processor_factory = processor_factory
        self._listener = on_checkpoint
        self._consumers: dict[int, ShardConsumer] = {}
        self._held: tuple[int, ...] = ()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._ran = False

    def _make_assignment(self) -> Assignment:
        if self.config.coordination == "lease":
            return LeaseAssignment(self._client, self.config, self._clock, self._wake)
        return HeartbeatAssignment(self._client, self.config, self._clock, self._wake)

    # -- running -----------------------------------------------------------------------------

    def run(self) -> None:
        """The worker's loop; returns after ``shutdown()`` once every shard has stopped.
        Raises what set-up raised (a wrong endpoint, keys, group or lease URL)."""
        assert not self._ran, "a worker runs once"
        self._ran = True
        keep_freed_memory(self.config.buffer_bytes_max)
        pool = ThreadPoolExecutor(
            self.config.pool_threads, thread_name_prefix=f"loghub-{self.config.worker_name}"
        )
        context = ShardContext(
            client=self._client,
            config=self.config,
            assignment=self._assignment,
            budget=self._budget,
            clock=self._clock,
            processor_factory=self._processor_factory,
            submit=lambda task: self._submit(pool, task),
            wake=self._wake,
            listener=self._listener,
            counters=self._counters,
            # half of the threads at most wait in long polls; the rest process (one thread
            # alone never long-polls: a batch would wait behind the pull)
            long_polls=threading.Semaphore(self.config.pool_threads // 2),
        )
        stopped_cleanly = False
        try:
            self._assignment.start()
            logger.info("%s: started (%s mode)", self.config.worker_name, self.config.coordination)
            while not self._stop.is_set():
                self._wake_event.clear()
                wait_ms = self._round(context, draining=False)
                self._wake_event.wait(wait_ms / 1000)
            stopped_cleanly = self._drain(context)
        finally:
            try:
                self._assignment.shutdown()
            finally:
                # Tasks stuck in user code cannot be interrupted; do not wait for them then.
                pool.shutdown(wait=stopped_cleanly, cancel_futures=True)
                if self._owns_client:
                    self._client.close()
            logger.info("%s: stopped", self.config.worker_name)

    def start(self) -> None:
        """Run the loop in a thread of its own."""
        assert self._thread is None, "start once"
        self._thread = threading.Thread(
            target=self._run_in_thread, name=f"loghub-worker-{self.config.worker_name}"
        )
        self._thread.start()

    def shutdown(self, wait: bool = True) -> None:
        """Stop cleanly (see the module docstring). With ``wait``, and when the worker was
        started with ``start()``, return once it has stopped (re-raising a failure)."""
        self._stop.set()
        self._wake_event.set()
        thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            self.join()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for a worker started with ``start()``; re-raises what ended its loop."""
        assert self._thread is not None, "join a started worker"
        self._thread.join(timeout_s)
        if self._error is not None and not self._thread.is_alive():
            raise self._error

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def statistics(self) -> WorkerStatistics:
        counters = self._counters
        return WorkerStatistics(
            shards=self._held,
            batches=counters.batches,
            log_groups=counters.log_groups,
            process_errors=counters.process_errors,
            fetch_errors=counters.fetch_errors,
            buffered_bytes=self._budget.used_bytes,
            buffered_bytes_high_water=self._budget.high_water_bytes,
        )

    # -- the loop ------------------------------------------------------------------------------

    def _run_in_thread(self) -> None:
        try:
            self.run()
        except BaseException as exc:
            logger.exception("%s: the worker failed", self.config.worker_name)
            self._error = exc

    def _wake(self) -> None:
        self._wake_event.set()

    def _submit(self, pool: ThreadPoolExecutor, task: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                task()
            except BaseException:  # a bug: it must not vanish into a future nobody reads
                logger.exception("%s: a shard task failed", self.config.worker_name)

        pool.submit(guarded)

    def _round(self, context: ShardContext, *, draining: bool) -> int:
        """Follow the assignment, step every shard consumer, forget the stopped ones; returns
        how long the loop may wait."""
        assignment = self._assignment
        assigned = frozenset() if draining else assignment.assigned()
        shards = assignment.shards()
        consumers = self._consumers
        for shard_id in sorted(assigned - consumers.keys()):
            consumers[shard_id] = ShardConsumer(shard_id, context)
        now_ms = self._clock.monotonic_ms()
        due: list[int] = [now_ms + loop_wait_ms_max]
        for shard_id, consumer in consumers.items():
            if shard_id not in assigned:
                consumer.request_stop()
            info = shards.get(shard_id)
            consumer.set_end_cursor(None if info is None or info.writable else info.end_cursor)
            due_ms = consumer.step(now_ms)
            if due_ms is not None:
                due.append(due_ms)
        for shard_id in [s for s, consumer in consumers.items() if consumer.done]:
            consumer = consumers.pop(shard_id)
            if consumer.finished:
                logger.info("shard %d: read to its end; released", shard_id)
                assignment.mark_finished(shard_id)
            else:
                logger.info("shard %d: stopped", shard_id)
        self._held = tuple(sorted(consumers))
        assignment.set_held(consumers.keys())
        return max(0, min(due) - now_ms)

    def _drain(self, context: ShardContext) -> bool:
        """Stop every shard; True when all stopped in time."""
        deadline_ms = self._clock.monotonic_ms() + shutdown_wait_ms_max
        while self._clock.monotonic_ms() < deadline_ms:
            self._wake_event.clear()
            wait_ms = self._round(context, draining=True)
            if not self._consumers:
                break
            self._wake_event.wait(min(wait_ms, loop_wait_ms_max) / 1000)
        if self._consumers:
            logger.error(
                "%s: shards %s did not stop within %d ms; abandoning them",
                self.config.worker_name,
                sorted(self._consumers),
                shutdown_wait_ms_max,
            )
            return False
        return True


def run_until_signal(worker: ConsumerWorker, *, parent_pid: int | None = None) -> None:
    """Run ``worker`` until SIGTERM or SIGINT, then shut it down cleanly.

    Call from the main thread before any other thread starts: the signals are blocked in
    every thread and taken synchronously here (``sigtimedwait``), so no signal handler runs
    inside a lock. With ``parent_pid``, the worker also stops when that process is gone (a
    supervisor killed with SIGKILL must not leave its workers behind).
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    try:
        worker.start()
        while worker.is_alive():
            received = signal.sigtimedwait(stop_signals, _signal_poll_s)
            # After SIGSTOP/SIGCONT, CPython 3.11's sigtimedwait may return a result whose
            # si_signo is no signal we wait for: only SIGTERM or SIGINT stops the worker.
            if received is not None and received.si_signo in stop_signals:
                logger.info("%s: signal %d, stopping", worker.config.worker_name, received.si_signo)
                break
            if parent_pid is not None and os.getppid() != parent_pid:
                logger.warning("%s: supervisor gone, stopping", worker.config.worker_name)
                break
        worker.shutdown()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
