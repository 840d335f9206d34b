"""`loghub produce` against a real server: a `tail -F` pipe, bad lines, retries, progress."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import ServerProcess

from loghub.client import LogHubClient

PROJECT = "produce-cli"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("produce") / "data").start()
    try:
        with LogHubClient(process.endpoint) as client:
            client.create_project(PROJECT)
        yield process
    finally:
        process.stop()


def _loghub_args(endpoint: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "loghub", *args, "--endpoint", endpoint]


def _produce(
    endpoint: str, logstore: str, stdin: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _loghub_args(endpoint, "produce", logstore, "--project", PROJECT, *args),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _all_logs(client: LogHubClient, logstore: str) -> list[dict[str, str]]:
    logs = []
    for shard in client.list_shards(PROJECT, logstore):
        cursor = client.get_cursor(PROJECT, logstore, shard.shard_id, "begin")
        while True:
            result = client.pull_logs(PROJECT, logstore, shard.shard_id, cursor)
            for group in result.log_groups:
                for log in group.Logs:
                    logs.append({c.Key: c.Value for c in log.Contents} | {"@time": str(log.Time)})
            if result.count == 0:
                break
            cursor = result.next_cursor
    return logs


def test_lines_written_to_a_tailed_file_are_readable_within_a_second(
    server: ServerProcess, tmp_path: Path
) -> None:
    """`tail -F app.log | loghub produce`: a quiet pipe must not hold a batch back."""
    with LogHubClient(server.endpoint) as client:
        client.create_logstore(PROJECT, "tailed", shard_count=1)
        app_log = tmp_path / "app.log"
        app_log.write_text("")
        tail = subprocess.Popen(
            ["tail", "-n", "+1", "-F", str(app_log)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert tail.stdout is not None
        produce = subprocess.Popen(
            _loghub_args(server.endpoint, "produce", "tailed", "--project", PROJECT),
            stdin=tail.stdout,
            stderr=subprocess.PIPE,
        )
        tail.stdout.close()  # produce owns the read end now
        try:
            cursor = client.get_cursor(PROJECT, "tailed", 0, "begin")
            delays_s = []
            with app_log.open("a") as writer:
                # the first line waits for the command to start (imports take a second or
                # two here); the clock runs from the second on
                for n in range(9):
                    writer.write(json.dumps({"n": str(n)}) + "\n")
                    writer.flush()
                    written = time.monotonic()
                    while True:
                        result = client.pull_logs(PROJECT, "tailed", 0, cursor)
                        if result.count:
                            break
                        assert time.monotonic() - written < 30, "line never arrived"
                        time.sleep(0.02)
                    delays_s.append(time.monotonic() - written)
                    cursor = result.next_cursor
                    seen = [
                        c.Value for g in result.log_groups for lg in g.Logs for c in lg.Contents
                    ]
                    assert seen == [str(n)]
                    time.sleep(0.3)  # the file grows slowly
            assert max(delays_s[1:]) < 1.0, delays_s
        finally:
            for process in (tail, produce):
                if process.poll() is None:
                    os.kill(process.pid, signal.SIGTERM)
                process.wait(timeout=10)
            assert produce.stderr is not None
            produce.stderr.close()


def test_bad_lines_are_reported_by_number_and_the_rest_is_sent(server: ServerProcess) -> None:
    with LogHubClient(server.endpoint) as client:
        client.create_logstore(PROJECT, "badlines", shard_count=1)
        lines = [
            '{"n": "1", "__time__": 1700000000}',
            "not json",
            '{"n": "3", "status": 200, "ok": true, "detail": {"ms": 1.5}}',
            "",
            '{"n": "5", "__time__": "yesterday"}',
            "[1, 2]",
            '{"n": "7", "__time__": "1700000007"}',
            '{"n": "8", "__time__": -5}',
        ]
        produced = _produce(server.endpoint, "badlines", "\n".join(lines) + "\n")
        assert produced.returncode == 3, produced.stderr
        err_lines = produced.stderr.splitlines()
        assert [line.split(":")[0] for line in err_lines if line.startswith("line ")] == [
            "line 2",
            "line 5",
            "line 6",
            "line 8",
        ]
        assert "sent 3 logs, skipped 4 bad lines" in produced.stderr
        assert "Traceback" not in produced.stderr
        logs = sorted(_all_logs(client, "badlines"), key=lambda log: log["n"])
        assert [log["n"] for log in logs] == ["1", "3", "7"]
        assert logs[0]["@time"] == "1700000000" and logs[2]["@time"] == "1700000007"
        assert logs[1]["status"] == "200" and logs[1]["ok"] == "true"
        assert json.loads(logs[1]["detail"]) == {"ms": 1.5}


def test_a_server_restarting_meanwhile_gets_every_batch(tmp_path: Path) -> None:
    """Connection refused is retried with backoff, so a server restart loses nothing."""
    restarted = ServerProcess(tmp_path / "data").start()
    with LogHubClient(restarted.endpoint) as client:
        client.create_project(PROJECT)
        client.create_logstore(PROJECT, "late", shard_count=1)
    restarted.stop()
    lines = "".join(json.dumps({"n": str(n)}) + "\n" for n in range(300))
    produce = subprocess.Popen(
        _loghub_args(
            restarted.endpoint, "produce", "late", "--project", PROJECT, "--batch-size", "100"
        ),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert produce.stdin is not None and produce.stderr is not None
        produce.stdin.write(lines)
        produce.stdin.close()
        time.sleep(2.0)  # the first tries are refused
        restarted.start()
        assert produce.wait(timeout=60) == 0, produce.stderr.read()
        stderr = produce.stderr.read()
        assert "retrying in" in stderr and "Connection refused" in stderr
        assert "sent 300 logs" in stderr
        with LogHubClient(restarted.endpoint) as client:
            assert sorted(int(log["n"]) for log in _all_logs(client, "late")) == list(range(300))
    finally:
        if produce.poll() is None:
            os.kill(produce.pid, signal.SIGTERM)
            produce.wait(timeout=10)
        assert produce.stderr is not None
        produce.stderr.close()
        restarted.stop()


def test_sigterm_sends_what_was_read_before_exiting(server: ServerProcess) -> None:
    with LogHubClient(server.endpoint) as client:
        client.create_logstore(PROJECT, "stopped", shard_count=1)
        produce = subprocess.Popen(
            _loghub_args(
                server.endpoint, "produce", "stopped", "--project", PROJECT,
                "--linger-ms", "600000", "--progress",
            ),
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert produce.stdin is not None and produce.stderr is not None
            produce.stdin.write(b"".join(b'{"n": "%d"}\n' % n for n in range(5)))
            produce.stdin.flush()  # stdin stays open: only the signal ends the input
            # the progress line comes a second after the first read, which took the lines
            shown = b""
            while b"produce:" not in shown:
                chunk = os.read(produce.stderr.fileno(), 4096)
                assert chunk, "produce exited early"
                shown += chunk
            os.kill(produce.pid, signal.SIGTERM)
            assert produce.wait(timeout=30) == 0
            assert b"sent 5 logs" in shown + produce.stderr.read()
            assert sorted(log["n"] for log in _all_logs(client, "stopped")) == list("01234")
        finally:
            if produce.poll() is None:
                os.kill(produce.pid, signal.SIGKILL)
                produce.wait(timeout=10)
            for stream in (produce.stdin, produce.stderr):
                if stream is not None:
                    stream.close()


def test_progress_line_only_when_asked_for_off_a_terminal(server: ServerProcess) -> None:
    with LogHubClient(server.endpoint) as client:
        client.create_logstore(PROJECT, "progress", shard_count=1)
    lines = "".join(json.dumps({"n": str(n)}) + "\n" for n in range(50))
    quiet = _produce(server.endpoint, "progress", lines)
    assert quiet.returncode == 0 and "logs/s" not in quiet.stderr
    shown = _produce(server.endpoint, "progress", lines, "--progress")
    assert shown.returncode == 0, shown.stderr
    assert "produce: 50 logs sent" in shown.stderr
