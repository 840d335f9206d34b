"""Expected failures of every kind print one line that says what to do, and exit non-zero;
`loghub --debug` adds the traceback. Real processes, a real server, real sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from server_process import ServerProcess, free_port

from loghub.client import LogHubClient


def _loghub(
    *args: str, cwd: Path | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
    return subprocess.run(
        [sys.executable, "-m", "loghub", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=cwd,
        env=env,
    )


def _one_error_line(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def test_server_down_and_malformed_endpoint(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"  # nobody listens there
    down = _loghub("project", "list", "--endpoint", endpoint)
    _one_error_line(down, "Connection refused", "is a LogHub server running there?")
    debug = _loghub("--debug", "project", "list", "--endpoint", endpoint)
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert "is a LogHub server running there?" in debug.stderr.splitlines()[-1]
    malformed = _loghub("project", "list", "--endpoint", ":8080")
    _one_error_line(malformed, "names no host")


def test_wrong_key_and_unknown_project(signed_server: ServerProcess) -> None:
    endpoint = signed_server.endpoint
    wrong = _loghub(
        "project", "list", "--endpoint", endpoint,
        "--access-key-id", "ak", "--access-key-secret", "not-the-secret",
    )  # fmt: skip
    _one_error_line(wrong, "SignatureNotMatch", "check --access-key-id and --access-key-secret")
    unknown_id = _loghub(
        "project", "list", "--endpoint", endpoint,
        "--access-key-id", "nobody", "--access-key-secret", "sk",
    )  # fmt: skip
    _one_error_line(unknown_id, "check --access-key-id")
    no_project = _loghub(
        "logstore", "list", "--project", "no-such-project", "--endpoint", endpoint,
        "--access-key-id", "ak", "--access-key-secret", "sk",
    )  # fmt: skip
    _one_error_line(no_project, "ProjectNotExist", "loghub project create")


def test_a_processor_that_cannot_be_imported_fails_at_once(
    signed_server: ServerProcess, tmp_path: Path
) -> None:
    with LogHubClient(signed_server.endpoint, "ak", "sk") as client:
        client.create_project("errors-proc")
        client.create_logstore("errors-proc", "store", shard_count=1)
    (tmp_path / "broken_processor.py").write_text('raise RuntimeError("half-written module")\n')
    common = (
        "consume", "store", "--project", "errors-proc", "--group", "g",
        "--endpoint", signed_server.endpoint, "--access-key-id", "ak", "--access-key-secret", "sk",
    )  # fmt: skip
    for spec, reason in (
        ("broken_processor:Processor", "RuntimeError: half-written module"),
        ("no_such_module:Processor", "No module named 'no_such_module'"),
    ):
        result = _loghub(*common, "--processor", spec, cwd=tmp_path, timeout_s=30)
        assert result.returncode == 2, result.stderr
        assert "cannot load processor" in result.stderr and reason in result.stderr
        assert "Traceback" not in result.stderr


def test_postgresql_unreachable(signed_server: ServerProcess, tmp_path: Path) -> None:
    nowhere = f"postgresql+psycopg://loghub:secret@127.0.0.1:{free_port()}/loghub"
    serve = _loghub(
        "serve", "--data-dir", str(tmp_path / "data"), "--port", str(free_port()),
        "--database-url", nowhere,
    )  # fmt: skip
    _one_error_line(serve, "metadata database", "check --database-url")
    assert "serving" not in serve.stderr
    consume = _loghub(
        "consume", "store", "--project", "errors-pg", "--group", "g",
        "--coordination", "lease", "--lease-url", nowhere,
        "--endpoint", signed_server.endpoint, "--access-key-id", "ak", "--access-key-secret", "sk",
    )  # fmt: skip
    _one_error_line(consume, "lease store", "--lease-url")


def test_port_in_use_is_reported_before_serving(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _loghub("serve", "--data-dir", str(tmp_path / "data"), "--port", str(port))
    _one_error_line(result, "address already in use", "choose another --port")
    assert "serving" not in result.stderr + result.stdout
