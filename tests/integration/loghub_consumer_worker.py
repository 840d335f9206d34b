"""One `loghub.consumer` worker (or a supervisor of several) in its own process, for the
consumer integration tests.

Usage: python loghub_consumer_worker.py OUT_DIR ENDPOINT PROJECT LOGSTORE GROUP NAME MODE
           [--lease-url URL] [--ordered] [--processes N]

MODE is `server` or `lease`. Every process appends JSON lines to OUT_DIR/<pid>.jsonl, each
written with one `write` on an O_APPEND descriptor (whole lines even under SIGKILL):

- `{"e": "logs", "pid", "shard", "t", "logs": [[key, n, seq], ...]}` for each batch, written
  before the batch is saved as processed, so a crash can only make a log appear twice;
- `{"e": "ckpt", "pid", "shard", "seq", "t"}` after each checkpoint was written durably;
- `{"e": "start" | "stop", "pid", "shard", "t"}` from initialize and shutdown.

`t` is CLOCK_MONOTONIC in nanoseconds, the same clock in every process of the machine, so the
test can order events across processes and against the moment it sent a SIGKILL. `seq` is
the log group's sequence number in its shard (LogHub cursors are base64 of it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from loghub.consumer import (
    Checkpointer,
    ConsumerConfig,
    ConsumerProcessor,
    ConsumerWorker,
    run_processes,
    run_until_signal,
)
from loghub.wire.cursor import decode_cursor
from loghub.wire.proto import LogGroup

HEARTBEAT_INTERVAL_MS = 1_000
SERVER_TIMEOUT_MS = 3_000  # the group timeout: three heartbeats
LEASE_TIMEOUT_MS = 3_000  # renewed every second
PERSIST_EVERY_BATCHES = 5  # other batches are saved in memory and flushed in the background

_out_lock = threading.Lock()
_out_fd: int | None = None


def emit(**event: Any) -> None:
    global _out_fd
    event["pid"] = os.getpid()
    event["t"] = time.monotonic_ns()
    line = (json.dumps(event) + "\n").encode()
    with _out_lock:
        if _out_fd is None:
            path = os.path.join(os.environ["LOGHUB_TEST_OUT"], f"{os.getpid()}.jsonl")
            _out_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(_out_fd, line)


def on_checkpoint(shard_id: int, cursor: str) -> None:
    emit(e="ckpt", shard=shard_id, seq=decode_cursor(cursor))


class RecordingProcessor(ConsumerProcessor):
    def initialize(self, shard_id: int) -> None:
        super().initialize(shard_id)
        self.batches = 0
        emit(e="start", shard=shard_id)

    def process(self, log_groups: Sequence[LogGroup], checkpointer: Checkpointer) -> str | None:
        first = decode_cursor(checkpointer.cursor)
        records = []
        for offset, group in enumerate(log_groups):
            for log in group.Logs:
                contents = {c.Key: c.Value for c in log.Contents}
                records.append([contents["key"], int(contents["n"]), first + offset])
        emit(e="logs", shard=self.shard_id, logs=records)
        self.batches += 1
        checkpointer.save(persistent=self.batches % PERSIST_EVERY_BATCHES == 0)
        return None

    def shutdown(self, checkpointer: Checkpointer) -> None:
        emit(e="stop", shard=self.shard_id)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("out_dir", "endpoint", "project", "logstore", "group", "name", "mode"):
        parser.add_argument(name)
    parser.add_argument("--lease-url", default="")
    parser.add_argument("--ordered", action="store_true")
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(processName)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ["LOGHUB_TEST_OUT"] = args.out_dir  # inherited by supervised children
    lease = args.mode == "lease"
    config = ConsumerConfig(
        endpoint=args.endpoint,
        project=args.project,
        logstore=args.logstore,
        group=args.group,
        worker_name=args.name,
        access_key_id="ak",
        access_key_secret="sk",
        fetch_interval_ms=200,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        timeout_ms=LEASE_TIMEOUT_MS if lease else SERVER_TIMEOUT_MS,
        ordered=args.ordered,
        coordination="lease" if lease else "server",
        lease_url=args.lease_url,
        checkpoint_interval_ms=1_000,
        pool_threads=4,
    )
    if args.processes > 1:
        run_processes(RecordingProcessor, config, args.processes, on_checkpoint=on_checkpoint)
    else:
        worker = ConsumerWorker(RecordingProcessor, config, on_checkpoint=on_checkpoint)
        run_until_signal(worker)


if __name__ == "__main__":
    main()
