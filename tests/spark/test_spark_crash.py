"""A streaming query whose driver (the Python process, its JVM and every Python worker) is
killed with SIGKILL in the middle of a batch, then restarted from its checkpoint by another
driver, delivers every log exactly once into a Parquet sink."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from pyspark.sql import SparkSession
from spark_helpers import LogStore, numbered

CHILD = Path(__file__).with_name("stream_child.py")


def _start_child(logstore: LogStore, tmp_path: Path) -> subprocess.Popen[bytes]:
    log_file = open(tmp_path / "child.log", "ab")  # noqa: SIM115 (the child owns it)
    try:
        return subprocess.Popen(
            [
                sys.executable,
                str(CHILD),
                logstore.endpoint,
                logstore.name,
                str(tmp_path / "out"),
                str(tmp_path / "checkpoint"),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the JVM and workers join it
        )
    finally:
        log_file.close()


def _batch_ids(directory: Path) -> set[int]:
    if not directory.is_dir():
        return set()
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid:  # field 5: the process group
                members.append(int(entry.name))
    return members


def _kill_during_a_batch(child: subprocess.Popen[bytes], checkpoint: Path, tmp_path: Path) -> None:
    """Waits for a committed batch, then for a batch that is planned but not committed, and
    kills the child's whole process group."""
    deadline = time.monotonic() + 150
    while True:
        assert child.poll() is None, (tmp_path / "child.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the child never had a batch in flight"
        commits = _batch_ids(checkpoint / "commits")
        if commits and _batch_ids(checkpoint / "offsets") - commits:
            break
        time.sleep(0.02)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _group_members(child.pid):
        assert time.monotonic() < deadline, f"still alive: {_group_members(child.pid)}"
        time.sleep(0.1)


def test_sigkilled_driver_restarts_from_checkpoint_and_delivers_every_log_once(
    spark: SparkSession, logstore: LogStore, tmp_path: Path
) -> None:
    written = 0
    stop = threading.Event()

    def append(groups: int) -> None:
        nonlocal written
        for _ in range(groups):
            logstore.put(numbered(written, 20), shard_id=(written // 20) % 2)
            written += 20

    def keep_appending() -> None:
        while not stop.wait(0.1):
            append(1)

    append(30)
    appender = threading.Thread(target=keep_appending, daemon=True)
    child = _start_child(logstore, tmp_path)
    appender.start()
    try:
        _kill_during_a_batch(child, tmp_path / "checkpoint", tmp_path)
    finally:
        stop.set()
        appender.join()
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    # The restart runs in this process's session: a new driver, the same checkpoint.
    query = (
        spark.readStream.format("loghub")
        .options(**logstore.options(startingOffsets="earliest"))
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180)
    finally:
        query.stop()
    rows = (
        spark.read.parquet(str(tmp_path / "out"))
        .select("shard", "cursor", "log_index", "contents")
        .collect()
    )
    delivered = Counter((r.shard, r.cursor, r.log_index) for r in rows)
    assert max(delivered.values()) == 1
    assert sorted(int(r.contents["n"]) for r in rows) == list(range(written))
