"""Every example in docs/cli.md runs: each line of its ```sh blocks, in order, against a live
server, in an empty directory, through a `loghub` on PATH that runs this checkout.

`serve` lines are not run (this test starts the server itself; they name TLS files, a
PostgreSQL host, public addresses). Commands that run until stopped (a following `tail`,
`consume`, a `tail -F` pipe) must still be running, with nothing on stderr that looks like an
error, after FOLLOW_S seconds; then their process group (this test's own child) is stopped.
Every other command must exit with status 0. The command list at the top of the page must be
covered: each `loghub X a|b` there has an example of `loghub X a` and `loghub X b` that ran.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
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


def run(command: str, cwd: Path, env: dict[str, str]) -> tuple[str, str]:
    """Runs one example; returns its stdout and stderr, failing the test on an error."""
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group: stopped as a whole, by its id
    )
    if not runs_until_stopped(command):
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"{command!r} exited {proc.returncode}: {err}"
        return out, err
    try:
        out, err = proc.communicate(timeout=FOLLOW_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        assert "error" not in err.lower() and "Traceback" not in err, f"{command!r}: {err}"
        return out, err
    raise AssertionError(f"{command!r} stopped by itself ({proc.returncode}): {err}")


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
    for command in commands:
        if "loghub serve" in command:
            continue
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
