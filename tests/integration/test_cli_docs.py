"""Every example in docs/cli.md runs: each line of its ```sh blocks, in order, against a live
server, in an empty directory, through a `loghub` on PATH that runs this checkout.

`serve` lines are not run (this test starts the server itself; they name TLS files, a
PostgreSQL host, public addresses). Commands that run until stopped (a following `tail`,
`consume`, a `tail -F` pipe) must still be running, with nothing on stderr that looks like an
error, after FOLLOW_S seconds; then their process group (this test's own child) is stopped.
Consecutive ones that only tail are started together and share those FOLLOW_S seconds; the
`consume` examples, members of one consumer group, run one after another.
Every other command must exit with status 0. The command list at the top of the page must be
covered: each `loghub X a|b` there has an example of `loghub X a` and `loghub X b` that ran.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import ServerProcess

DOC = Path(__file__).parents[2] / "docs" / "cli.md"
SRC = Path(__file__).parents[2] / "src"
FOLLOW_S = 3.0
# files the examples name, made in the directory they run in
AUDIT_PROCESSOR = """
from loghub.consumer import ConsumerProcessor


class AuditProcessor(ConsumerProcessor):
    def process(self, log_groups, checkpointer):
        checkpointer.save()
"""


def sh_commands(text: str) -> list[str]:
    """The commands of the ```sh blocks, backslash continuations joined."""
    commands: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        pending = ""
        for line in block.splitlines():
            pending += line
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            if pending.strip():
                commands.append(pending.strip())
            pending = ""
    return commands


def listed_commands(text: str) -> list[str]:
    """`loghub X a` for each `loghub X a|b|...` of the first (plain) code block."""
    overview = re.search(r"^```\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    assert overview is not None
    listed = []
    for line in overview.group(1).splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "loghub" and "|" in words[2]:
            listed += [f"loghub {words[1]} {sub}" for sub in words[2].split("|")]
        elif len(words) >= 2 and words[0] == "loghub":
            listed.append(f"loghub {words[1]}")
    return listed


def runs_until_stopped(command: str) -> bool:
    return (
        "tail -F" in command
        or "loghub consume" in command
        or ("loghub tail" in command and "--no-follow" not in command)
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("docs") / "data").start()
    try:
        yield process
    finally:
        process.stop()


def shares_the_wait(command: str) -> bool:
    """A command that runs until stopped and can run beside the one before it: a tail."""
    return runs_until_stopped(command) and "loghub consume" not in command


def start(command: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group: stopped as a whole, by its id
    )


def run(command: str, cwd: Path, env: dict[str, str]) -> tuple[str, str]:
    """Runs one example; returns its stdout and stderr, failing the test on an error."""
    proc = start(command, cwd, env)
    if not runs_until_stopped(command):
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"{command!r} exited {proc.returncode}: {err}"
        return out, err
    return follow({command: proc})[command]


def follow(procs: dict[str, subprocess.Popen[str]]) -> dict[str, tuple[str, str]]:
    """Commands that run until stopped, started together: each must still be running
    FOLLOW_S seconds after the last one started, with no error on stderr; then each
    process group is stopped. Returns each command's stdout and stderr."""
    deadline = time.monotonic() + FOLLOW_S
    outputs = {}
    try:
        for proc in procs.values():  # reads what each prints meanwhile
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        for command, proc in procs.items():
            if proc.poll() is not None:
                _out, err = proc.communicate()
                raise AssertionError(f"{command!r} stopped by itself ({proc.returncode}): {err}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
    for command, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        assert "error" not in err.lower() and "Traceback" not in err, f"{command!r}: {err}"
        outputs[command] = out, err
    return outputs


def test_every_example_in_cli_md_runs(server: ServerProcess, tmp_path: Path) -> None:
    text = DOC.read_text()
    commands = sh_commands(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "loghub"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m loghub "$@"\n')
    shim.chmod(0o755)
    work = tmp_path / "work"
    (work / "myapp").mkdir(parents=True)
    (work / "myapp" / "__init__.py").write_text("")
    (work / "myapp" / "audit.py").write_text(AUDIT_PROCESSOR)
    (work / "app.jsonl").write_text('{"user_id": "u1", "path": "/"}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": f"{SRC}{os.pathsep}{work}",
        "LOGHUB_ENDPOINT": server.endpoint,
    }
    ran: list[str] = []
    outputs: dict[str, str] = {}
    pending = [command for command in commands if "loghub serve" not in command]
    while pending:
        if shares_the_wait(pending[0]):
            tails = {}
            while pending and shares_the_wait(pending[0]):
                command = pending.pop(0)
                tails[command] = start(command, work, env)
            for command, (out, _err) in follow(tails).items():
                outputs[command] = out
                ran.append(command)
            continue
        command = pending.pop(0)
        outputs[command], _ = run(command, work, env)
        ran.append(command)
    for listed in listed_commands(text):
        if listed == "loghub serve":
            continue
        assert any(listed in command for command in ran), f"no example of {listed} ran"
    assert "loghub --version" in ran
    # the examples did what they say, not merely exit 0
    assert "reports" in outputs["loghub group list access -p web"]
    described = outputs["loghub group describe access reports -p web --json"]
    assert '"lagGroups"' in described
    assert "8 readwrite" in outputs["loghub shard list access -p web"]
