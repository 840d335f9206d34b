"""``loghub consume``: run a consumer worker from the command line.

Without ``--processor`` every log is printed to stdout as one JSON line (shard, cursor, time,
topic, source, tags, contents: the same lines as ``loghub tail``) and its batch is then saved
as processed; with ``--processor module:Class`` that processor runs instead. Every
``ConsumerConfig`` field is a flag; ``--processes N`` runs N supervised worker processes
named ``<name>-0`` .. ``<name>-N-1``. SIGTERM or SIGINT stops cleanly (checkpoints written).
Logs go to stderr.

The command is the function ``consume``, mounted on the ``loghub`` app by ``loghub.cli``;
``python -m loghub.consumer.cli`` runs it alone.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from loghub._times import start_position
from loghub.consumer.checkpoint import Checkpointer
from loghub.consumer.config import ConsumerConfig, buffer_bytes_max_default
from loghub.consumer.multiprocess import run_processes
from loghub.consumer.processor import ConsumerProcessor, ProcessorFactory
from loghub.consumer.worker import ConsumerWorker, run_until_signal
from loghub.errors import LogHubError
from loghub.wire.proto import LogGroup

__all__ = ["JsonLinesProcessor", "consume", "load_processor", "main", "set_debug"]

# Writes to a pipe up to this size are atomic, so lines from several worker processes sharing
# one stdout never interleave mid-line (a single line longer than this may).
_pipe_atomic_bytes = 4096
_defaults = ConsumerConfig("endpoint", "project", "logstore", "group", "worker")


class JsonLinesProcessor(ConsumerProcessor):
    """Prints each log as a JSON line, then saves the batch as processed."""

    def initialize(self, shard_id: int) -> None:
        super().initialize(shard_id)
        _watch_stdout()

    def process(self, log_groups: Sequence[LogGroup], checkpointer: Checkpointer) -> str | None:
        lines = []
        for group in log_groups:
            tags = {tag.Key: tag.Value for tag in group.LogTags}
            for log in group.Logs:
                record = {
                    "shard": self.shard_id,
                    "cursor": checkpointer.cursor,
                    "time": log.Time,
                    "topic": group.Topic,
                    "source": group.Source,
                    "tags": tags,
                    "contents": {content.Key: content.Value for content in log.Contents},
                }
                lines.append(json.dumps(record, ensure_ascii=False) + "\n")
        try:
            _write_lines(lines)
        except BrokenPipeError:
            # Nobody reads any more (`| head`): stop the whole worker as if terminated,
            # without saving this batch.
            os.kill(os.getpid(), signal.SIGTERM)
            raise
        checkpointer.save()
        return None


_watching = threading.Lock()  # held for good by the first processor: one watcher per process


def _watch_stdout() -> None:
    """Stop the worker once nobody reads stdout (`| head` exited): a closed pipe is otherwise
    noticed only at the next write, which never comes while the logstore is idle. Started
    from a pool thread, so the watcher inherits the blocked stop signals."""
    if not _watching.acquire(blocking=False):
        return

    def watch() -> None:
        poller = select.poll()
        poller.register(1, select.POLLERR)  # the write end of a pipe whose reader is gone
        while not poller.poll(None):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="loghub-stdout-watch", daemon=True).start()


def _write_lines(lines: Sequence[str]) -> None:
    """Write whole lines to fd 1, in chunks that end at a line end and fit one atomic write."""
    chunk: list[bytes] = []
    size = 0
    for line in lines:
        data = line.encode()
        if chunk and size + len(data) > _pipe_atomic_bytes:
            _write_all(b"".join(chunk))
            chunk, size = [], 0
        chunk.append(data)
        size += len(data)
    if chunk:
        _write_all(b"".join(chunk))


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


_debug = {"on": os.environ.get("LOGHUB_DEBUG", "") not in ("", "0")}


def set_debug(on: bool) -> None:
    """``loghub --debug``: logged errors keep their tracebacks."""
    _debug["on"] = on or _debug["on"]


class _Formatter(logging.Formatter):
    """Without --debug, a logged error is one line (its type and message): the worker logs
    what failed, and a person reads the cause without pages of traceback."""

    def formatException(self, ei: Any) -> str:  # noqa: N802  # logging's name
        if _debug["on"]:
            return super().formatException(ei)
        exc = ei[1]
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
        return f"  {text} (--debug shows the traceback)"


def load_processor(spec: str) -> ProcessorFactory:
    """``module:Class`` (or ``module:function``) -> the factory it names."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise typer.BadParameter(f"--processor must be module:Class, not {spec!r}")
    sys.path.insert(0, os.getcwd())  # like `python -m`: modules beside the user are found
    try:
        module = importlib.import_module(module_name)
        factory: Any = getattr(module, attribute)
    except Exception as exc:  # any failure of the module's own code, too: before any worker
        raise typer.BadParameter(
            f"cannot load processor {spec!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(factory):
        raise typer.BadParameter(f"processor {spec!r} is not a class or function")
    return factory  # type: ignore[no-any-return]


def consume(
    logstore: Annotated[str, typer.Argument(help="the logstore to consume")],
    project: Annotated[str, typer.Option("--project", "-p", envvar="LOGHUB_PROJECT")],
    group: Annotated[str, typer.Option("--group", "-g", help="the consumer group")],
    name: Annotated[
        str, typer.Option(help="worker name, unique in the group (default: host-pid)")
    ] = "",
    processor: Annotated[
        str, typer.Option(help="module:Class of a ConsumerProcessor (default: print JSON lines)")
    ] = "",
    start: Annotated[
        str,
        typer.Option(
            "--from",
            help="where a shard without checkpoint starts: begin, end, or a time (epoch"
            " seconds, ISO 8601, -15m)",
        ),
    ] = _defaults.start_position,
    fetch_interval_ms: Annotated[
        int, typer.Option(help="pause after a pull that did not fill a batch")
    ] = _defaults.fetch_interval_ms,
    fetch_log_groups_max: Annotated[
        int, typer.Option(help="log groups per pull (1..1000)")
    ] = _defaults.fetch_log_groups_max,
    heartbeat_interval_ms: Annotated[
        int, typer.Option(help="heartbeat period; how often the shard list is read")
    ] = _defaults.heartbeat_interval_ms,
    timeout_ms: Annotated[
        int, typer.Option(help="group timeout (server mode) or lease timeout (lease mode)")
    ] = _defaults.timeout_ms,
    ordered: Annotated[
        bool, typer.Option(help="children of a split or merge only after their parents")
    ] = _defaults.ordered,
    coordination: Annotated[
        str, typer.Option(help="server (consumer group heartbeats) or lease (SQL leases)")
    ] = _defaults.coordination,
    lease_url: Annotated[
        str, typer.Option(help="lease database: sqlite:////path or postgresql+psycopg://...")
    ] = "",
    checkpoint_interval_ms: Annotated[
        int, typer.Option(help="background flush of in-memory checkpoints")
    ] = _defaults.checkpoint_interval_ms,
    buffer_bytes_max: Annotated[
        int, typer.Option(help="memory for pulled, unprocessed batches, per worker process")
    ] = buffer_bytes_max_default,
    pool_threads: Annotated[
        int, typer.Option(help="threads running the shards' pulls and processors")
    ] = _defaults.pool_threads,
    on_process_error: Annotated[
        str, typer.Option(help="retry (from the last checkpoint) or skip the batch")
    ] = _defaults.on_process_error,
    process_retry_backoff_ms: Annotated[
        int, typer.Option(help="first wait before a retry; doubles while it keeps failing")
    ] = _defaults.process_retry_backoff_ms,
    processes: Annotated[int, typer.Option(help="worker processes on this machine")] = 1,
    endpoint: Annotated[
        str, typer.Option(envvar="LOGHUB_ENDPOINT", help="host:port of the server")
    ] = "127.0.0.1:8080",
    access_key_id: Annotated[
        str, typer.Option(envvar="LOGHUB_ACCESS_KEY_ID", help="access key id")
    ] = "",
    access_key_secret: Annotated[
        str, typer.Option(envvar="LOGHUB_ACCESS_KEY_SECRET", help="access key secret")
    ] = "",
) -> None:
    """Consume a logstore with a consumer group: print its logs as JSON lines, or run a
    processor."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter("%(asctime)s %(name)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request drowns the rest
    if coordination not in ("server", "lease"):
        raise typer.BadParameter("--coordination must be server or lease")
    if on_process_error not in ("retry", "skip"):
        raise typer.BadParameter("--on-process-error must be retry or skip")
    config = ConsumerConfig(
        endpoint=endpoint,
        project=project,
        logstore=logstore,
        group=group,
        worker_name=name or f"{socket.gethostname()}-{os.getpid()}",
        access_key_id=access_key_id,
        access_key_secret=access_key_secret,
        start_position=_start_position(start),
        fetch_interval_ms=fetch_interval_ms,
        fetch_log_groups_max=fetch_log_groups_max,
        heartbeat_interval_ms=heartbeat_interval_ms,
        timeout_ms=timeout_ms,
        ordered=ordered,
        coordination="lease" if coordination == "lease" else "server",
        lease_url=lease_url,
        checkpoint_interval_ms=checkpoint_interval_ms,
        buffer_bytes_max=buffer_bytes_max,
        pool_threads=pool_threads,
        on_process_error="skip" if on_process_error == "skip" else "retry",
        process_retry_backoff_ms=process_retry_backoff_ms,
    )
    factory = load_processor(processor) if processor else JsonLinesProcessor
    if processes == 1:
        run_until_signal(ConsumerWorker(factory, config))
    else:
        run_processes(factory, config, processes)


def main() -> None:
    """``python -m loghub.consumer.cli``: the command alone, with ``loghub``'s error style."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(consume)
    try:
        app()
    except LogHubError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()


def _start_position(text: str) -> str:
    try:
        return start_position(text, time.time())
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--from") from None
