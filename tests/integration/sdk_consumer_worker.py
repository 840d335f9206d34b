"""One official-SDK ConsumerWorker in its own process, for the consumer-group tests.

Usage: python sdk_consumer_worker.py ENDPOINT PROJECT LOGSTORE GROUP NAME OUT [--ordered]

Every processed log is appended to OUT as a JSON line before the batch's checkpoint is saved
(so after a crash, a log may show up twice, never not at all), with the shard and a
system-wide monotonic time; shard starts and stops are written too. SIGTERM shuts the worker
down the SDK's way (shutdown(): heartbeats stop, then every shard is shut down and its
checkpoint saved, well within the group timeout); SIGKILL is a crash.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

from aliyun.log.consumer import ConsumerProcessorBase, ConsumerWorker, CursorPosition, LogHubConfig

OUT_LOCK = threading.Lock()


def main() -> None:
    endpoint, project, logstore, group, name, out_path = sys.argv[1:7]
    ordered = "--ordered" in sys.argv[7:]
    out = open(out_path, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)

    def emit(**event: Any) -> None:
        event["t"] = time.monotonic_ns()
        event["worker"] = name
        with OUT_LOCK:
            out.write(json.dumps(event) + "\n")
            out.flush()
            os.fsync(out.fileno())

    class Processor(ConsumerProcessorBase):  # type: ignore[misc]
        def initialize(self, shard: int) -> None:
            super().initialize(shard)
            emit(event="start", shard=shard)

        def process(self, log_groups: Any, tracker: Any) -> None:
            records = []
            for group in log_groups.LogGroups:
                for log in group.Logs:
                    contents = {c.Key: c.Value for c in log.Contents}
                    records.append([contents.get("key"), int(contents.get("n", -1))])
            if records:
                emit(event="logs", shard=self.shard_id, logs=records)
            tracker.save_check_point(True)

        def shutdown(self, tracker: Any) -> None:
            super().shutdown(tracker)
            emit(event="stop", shard=self.shard_id)

    config = LogHubConfig(
        endpoint,
        "ak",
        "sk",
        project,
        logstore,
        group,
        name,
        cursor_position=CursorPosition.BEGIN_CURSOR,
        heartbeat_interval=1,
        data_fetch_interval=0.2,
        in_order=ordered,
    )
    worker = ConsumerWorker(Processor, consumer_option=config)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    worker.start()
    emit(event="ready")
    stopping.wait()
    worker.shutdown()  # the SDK's way: its loop then shuts every shard down, saving checkpoints
    worker.join(timeout=60)
    emit(event="exit")
    out.close()


if __name__ == "__main__":
    main()
