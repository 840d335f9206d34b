"""`loghub consume` against a real server: JSON lines
from supervised worker processes, a crashed child restarted, SIGTERM forwarded; and a
processor named `module:Class` in lease mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.wire.logs import make_log_group

PROJECT = "consumecli"


def _mounted() -> bool:
    """Whether `loghub consume` is wired into the `loghub` command."""
    from loghub.cli import app
    from loghub.consumer.cli import consume

    return any(command.callback is consume for command in app.registered_commands)


# `loghub consume` once mounted; the module alone until then (the same function either way)
COMMAND = ["-m", "loghub", "consume"] if _mounted() else ["-m", "loghub.consumer.cli"]
HERE = Path(__file__).parent
FAST = ["--heartbeat-interval-ms", "500", "--timeout-ms", "2000", "--fetch-interval-ms", "100"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("consumecli") / "data").start()
    try:
        with LogHubClient(process.endpoint) as client:
            client.create_project(PROJECT)
        yield process
    finally:
        process.stop()


def produce(server: ServerProcess, logstore: str, first: int, count: int) -> None:
    with LogHubClient(server.endpoint) as client:
        for n in range(first, first + count):
            group = make_log_group([(1_700_000_000 + n, {"key": "k", "n": str(n)})])
            client.put_log_group(PROJECT, logstore, group, hash_key=f"{n * 7919 % 256:02x}")


def consume(
    server: ServerProcess, logstore: str, stderr: Path, *args: str, stdout: int = subprocess.PIPE
) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    command = [sys.executable, *COMMAND, logstore, "--project", PROJECT,
               "--endpoint", server.endpoint, *FAST, *args]  # fmt: skip
    with open(stderr, "ab") as log:  # a file: a full stderr pipe would block the workers
        return subprocess.Popen(command, stdout=stdout, stderr=log, text=True, env=env)


class Lines:
    """Collects a process's stdout lines in a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stdout is not None
        self._stream = proc.stdout
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with self._stream:
            self.lines.extend(self._stream)

    def join(self) -> list[str]:
        self._thread.join(timeout=30)
        return self.lines


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def spawned_children(pid: int) -> list[int]:
    """The worker processes a supervisor spawned (not multiprocessing's resource tracker)."""
    found = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(int(child))
        except FileNotFoundError:  # it exited meanwhile
            continue
    return found


def stop(proc: subprocess.Popen[str], stderr: Path) -> str:
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, stderr.read_text()[-3000:]
    return stderr.read_text()


def test_two_processes_print_every_log_once_restart_a_killed_child_and_stop_on_sigterm(
    server: ServerProcess, tmp_path: Path
) -> None:
    with LogHubClient(server.endpoint) as client:
        client.create_logstore(PROJECT, "printed", shard_count=4)
    produce(server, "printed", 0, 60)
    log = tmp_path / "stderr.log"
    proc = consume(server, "printed", log, "--group", "printers", "--name", "p", "--processes", "2")
    out = Lines(proc)
    try:
        wait_for(lambda: len(out.lines) >= 60, 30, "the first 60 logs")
        children = spawned_children(proc.pid)
        assert len(children) == 2
        os.kill(children[0], signal.SIGKILL)  # a crash: the supervisor restarts that worker
        wait_for(lambda: len(set(spawned_children(proc.pid)) - set(children)) == 1, 30, "a restart")
        produce(server, "printed", 60, 60)
        wait_for(lambda: len({json.loads(line)["contents"]["n"] for line in out.lines}) >= 120,
                 30, "the next 60 logs")  # fmt: skip
        stderr = stop(proc, log)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        records = [json.loads(line) for line in out.join()]
    for child in children:
        assert not Path(f"/proc/{child}").exists(), "every worker process stopped"
    assert {int(r["contents"]["n"]) for r in records} == set(range(120))
    assert set(records[0]) == {"shard", "cursor", "time", "topic", "source", "tags", "contents"}
    assert all(r["time"] == 1_700_000_000 + int(r["contents"]["n"]) for r in records)
    assert "p-0 started" in stderr and "p-1 started" in stderr


def test_a_processor_named_module_class_runs_in_lease_mode(
    server: ServerProcess, tmp_path: Path
) -> None:
    with LogHubClient(server.endpoint) as client:
        client.create_logstore(PROJECT, "processed", shard_count=2)
    os.environ["LOGHUB_TEST_OUT"] = str(tmp_path)  # where RecordingProcessor writes
    produce(server, "processed", 0, 20)
    log = tmp_path / "stderr.log"
    proc = consume(
        server,
        "processed",
        log,
        "--group", "recorders",
        "--processor", "loghub_consumer_worker:RecordingProcessor",
        "--coordination", "lease",
        "--lease-url", f"sqlite:///{tmp_path / 'leases.db'}",
        stdout=subprocess.DEVNULL,
    )  # fmt: skip

    def recorded() -> set[str]:
        return {
            str(log[1])
            for path in tmp_path.glob("*.jsonl")
            for line in path.read_text().splitlines()
            if (event := json.loads(line))["e"] == "logs"
            for log in event["logs"]
        }

    try:
        wait_for(lambda: recorded() == {str(n) for n in range(20)}, 30, "the processor's logs")
        stop(proc, log)
    finally:
        del os.environ["LOGHUB_TEST_OUT"]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_loghub_consume_is_mounted_on_the_loghub_command() -> None:
    assert _mounted(), "src/loghub/cli.py must mount loghub.consumer.cli.consume"
