"""One `loghub.consumer` worker with a slow processor, for the memory test: prints its peak RSS.

Usage: python memory_consumer_worker.py ENDPOINT PROJECT LOGSTORE BUDGET_BYTES SECONDS

The processor sleeps 200 ms per batch, so a deep backlog piles up in front of it. After
SECONDS the process prints one JSON line, ``{"idle_rss", "peak_rss", "logs"}`` (bytes: the
resident set just before the worker started, and ``VmHWM``, the kernel's high-water mark of
the resident set, at the end), and exits without waiting for its threads.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence

from loghub.consumer import Checkpointer, ConsumerConfig, ConsumerProcessor, ConsumerWorker
from loghub.wire.proto import LogGroup

PROCESS_MS = 200


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def main() -> None:
    endpoint, project, logstore, budget, seconds = sys.argv[1:6]
    logs = [0]
    lock = threading.Lock()

    class Slow(ConsumerProcessor):
        def process(self, log_groups: Sequence[LogGroup], checkpointer: Checkpointer) -> None:
            with lock:
                logs[0] += sum(len(group.Logs) for group in log_groups)
            time.sleep(PROCESS_MS / 1000)
            checkpointer.save()

    config = ConsumerConfig(
        endpoint=endpoint,
        project=project,
        logstore=logstore,
        group="memory",
        worker_name="w",
        buffer_bytes_max=int(budget),
        heartbeat_interval_ms=1_000,
        timeout_ms=10_000,
    )
    worker = ConsumerWorker(Slow, config)
    idle_rss = status_bytes("VmRSS")
    worker.start()
    time.sleep(float(seconds))
    with lock:
        result = {"idle_rss": idle_rss, "peak_rss": status_bytes("VmHWM"), "logs": logs[0]}
    print(json.dumps(result), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
