"""Many cores: N worker processes on one machine, started and supervised by one parent.

One Python process uses one core for Python code (the GIL), and a processor is usually Python
code. So ``run_processes(MyProcessor, config, processes=N)`` (or ``loghub consume --processes
N``) starts N children, each a complete ``ConsumerWorker`` named ``<worker_name>-<i>`` for i
in 0..N-1, sharing the group's shards with each other and with workers elsewhere exactly as
separate machines would (server mode, or leases: a SQLite file is enough on one machine).

The parent:

- starts the children with the ``spawn`` method (a fresh interpreter: no threads, locks or
  sockets inherited half-way through, as ``fork`` would), so the processor factory and the
  checkpoint listener must be importable (a class or function at module level);
- restarts a child that died (a crash, SIGKILL, the OOM killer) under the same name after a
  backoff (``restart_backoff_ms_min`` doubling up to ``restart_backoff_ms_max``, reset after
  ``healthy_run_ms``); the same name gets its shards back at once, since the dead process
  cannot be consuming them. A child that exits with status 0 stopped on purpose and is not
  restarted; when every child has, the parent returns;
- on SIGTERM or SIGINT forwards SIGTERM to each child by PID, waits up to
  ``child_stop_timeout_ms`` for their clean shutdown (checkpoints written), then SIGKILLs by
  PID whatever still runs.

A child watches its parent: if the parent disappears (SIGKILL), the child shuts down
cleanly by itself within half a second.

Thread-safety: ``WorkerSupervisor`` belongs to one thread; ``run_processes`` must be called
from the main thread (it takes SIGTERM and SIGINT synchronously).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.process import BaseProcess

from loghub._clock import Clock, SystemClock
from loghub.consumer.checkpoint import CheckpointListener
from loghub.consumer.config import ConsumerConfig, processes_max
from loghub.consumer.processor import ProcessorFactory
from loghub.consumer.worker import ConsumerWorker, run_until_signal, stop_signals
from loghub.errors import ParameterInvalid

__all__ = [
    "WorkerSupervisor",
    "child_stop_timeout_ms",
    "healthy_run_ms",
    "restart_backoff_ms_max",
    "restart_backoff_ms_min",
    "run_processes",
]

logger = logging.getLogger(__name__)

restart_backoff_ms_min = 1_000
restart_backoff_ms_max = 30_000
# A child that ran this long was healthy: its next crash restarts it after the minimum again.
healthy_run_ms = 60_000
# A clean shutdown writes checkpoints and lets go of shards; a child slower than this is stuck.
child_stop_timeout_ms = 60_000
# How often the parent looks at its children between signals.
_poll_s = 0.2
_log_format = "%(asctime)s %(processName)s %(name)s %(levelname)s %(message)s"


def _child_main(
    processor_factory: ProcessorFactory,
    config: ConsumerConfig,
    on_checkpoint: CheckpointListener | None,
    parent_pid: int,
    log_level: int,
) -> None:
    """A child: one worker until SIGTERM, SIGINT, or the parent's death."""
    logging.basicConfig(level=log_level, format=_log_format)
    logging.getLogger("httpx").setLevel(max(log_level, logging.WARNING))  # a line per request
    worker = ConsumerWorker(processor_factory, config, on_checkpoint=on_checkpoint)
    run_until_signal(worker, parent_pid=parent_pid)


@dataclass
class _Child:
    name: str
    process: BaseProcess | None = None
    started_ms: int = 0
    backoff_ms: int = restart_backoff_ms_min
    restart_at_ms: int | None = None
    stopped: bool = False  # exited with status 0: on purpose, not restarted


class WorkerSupervisor:
    """Starts, watches and stops the worker processes of one ``run_processes``."""

    def __init__(
        self,
        processor_factory: ProcessorFactory,
        config: ConsumerConfig,
        processes: int,
        *,
        on_checkpoint: CheckpointListener | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not 1 <= processes <= processes_max:
            raise ParameterInvalid(f"processes must be 1..{processes_max}")
        config.validate()
        self._factory = processor_factory
        self._config = config
        self._listener = on_checkpoint
        self._clock = clock or SystemClock()
        self._context = multiprocessing.get_context("spawn")
        self._children = [_Child(f"{config.worker_name}-{i}") for i in range(processes)]

    def start(self) -> None:
        for child in self._children:
            self._spawn(child)

    def pids(self) -> dict[str, int]:
        """Worker name -> PID of each child running now."""
        return {
            child.name: child.process.pid
            for child in self._children
            if child.process is not None and child.process.pid is not None
        }

    def poll(self) -> bool:
        """Restart the children that died; False once every child stopped on purpose."""
        now_ms = self._clock.monotonic_ms()
        for child in self._children:
            process = child.process
            if process is not None and process.exitcode is not None:
                self._on_exit(child, process.exitcode, now_ms)
            if child.restart_at_ms is not None and now_ms >= child.restart_at_ms:
                self._spawn(child)
        return not all(child.stopped for child in self._children)

    def stop(self) -> None:
        """SIGTERM every child by PID, wait for them, SIGKILL (by PID) those that hang."""
        running = [c.process for c in self._children if c.process is not None]
        for process in running:
            if process.exitcode is None and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline_ms = self._clock.monotonic_ms() + child_stop_timeout_ms
        for process in running:
            process.join(max(0, deadline_ms - self._clock.monotonic_ms()) / 1000)
            if process.exitcode is None and process.pid is not None:
                logger.error("worker %s did not stop in time; killing it", process.name)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.join()
        for child in self._children:
            child.process = None
            child.restart_at_ms = None

    def _spawn(self, child: _Child) -> None:
        process = self._context.Process(
            target=_child_main,
            args=(
                self._factory,
                self._config.for_worker(child.name),
                self._listener,
                os.getpid(),
                logging.getLogger().getEffectiveLevel(),
            ),
            name=child.name,
        )
        process.start()
        child.process = process
        child.started_ms = self._clock.monotonic_ms()
        child.restart_at_ms = None
        logger.info("worker %s started, pid %s", child.name, process.pid)

    def _on_exit(self, child: _Child, exitcode: int, now_ms: int) -> None:
        assert child.process is not None
        child.process.join()
        child.process = None
        if exitcode == 0:
            logger.info("worker %s stopped", child.name)
            child.stopped = True
            return
        if now_ms - child.started_ms >= healthy_run_ms:
            child.backoff_ms = restart_backoff_ms_min
        logger.warning(
            "worker %s exited with %d; restarting in %d ms", child.name, exitcode, child.backoff_ms
        )
        child.restart_at_ms = now_ms + child.backoff_ms
        child.backoff_ms = min(2 * child.backoff_ms, restart_backoff_ms_max)


def run_processes(
    processor_factory: ProcessorFactory,
    config: ConsumerConfig,
    processes: int,
    *,
    on_checkpoint: CheckpointListener | None = None,
) -> None:
    """Run ``processes`` supervised worker processes until SIGTERM or SIGINT (or until every
    child stopped on purpose). Call from the main thread."""
    supervisor = WorkerSupervisor(processor_factory, config, processes, on_checkpoint=on_checkpoint)
    # multiprocessing starts its resource tracker process on the first spawn and, doing so,
    # *unblocks* SIGINT and SIGTERM in the caller; started first, it leaves our mask alone.
    resource_tracker.ensure_running()
    # Blocked before the children start, so they inherit it and a signal arriving while one
    # is still importing waits for its worker's own signal loop instead of killing it.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    try:
        supervisor.start()
        while supervisor.poll():
            received = signal.sigtimedwait(stop_signals, _poll_s)
            if received is not None:
                logger.info("signal %d: stopping %d workers", received.si_signo, processes)
                break
    finally:
        supervisor.stop()
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
