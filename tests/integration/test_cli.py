"""The `loghub` command against a real server: create, produce, tail, reshard, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("cli") / "data").start()
    try:
        yield process
    finally:
        process.stop()


def loghub(server: ServerProcess, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loghub", *args, "--endpoint", server.endpoint],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_produce_then_tail_returns_every_line_once(server: ServerProcess, tmp_path: Path) -> None:
    assert loghub(server, "project", "create", "cliproj").returncode == 0
    created = loghub(server, "logstore", "create", "web", "--project", "cliproj", "--shards", "4")
    assert created.returncode == 0, created.stderr
    lines = [
        json.dumps({"user": f"u{i % 7}", "n": i, "__time__": 1_700_000_000 + i}) for i in range(500)
    ]
    produced = loghub(
        server,
        "produce",
        "web",
        "--project",
        "cliproj",
        "--hash-key-field",
        "user",
        "--batch-size",
        "64",
        stdin="\n".join(lines) + "\n",
    )
    assert produced.returncode == 0, produced.stderr
    assert "sent 500 logs" in produced.stderr
    split = loghub(server, "shard", "split", "web", "0", "--project", "cliproj")
    assert split.returncode == 0 and "into 4 and 5" in split.stdout
    tail = loghub(server, "tail", "web", "--project", "cliproj", "--from", "begin", "--no-follow")
    assert tail.returncode == 0, tail.stderr
    records = [json.loads(line) for line in tail.stdout.splitlines()]
    assert sorted(int(r["contents"]["n"]) for r in records) == list(range(500))
    by_user: dict[str, set[int]] = {}
    for record in records:
        by_user.setdefault(record["contents"]["user"], set()).add(record["shard"])
        assert record["time"] == 1_700_000_000 + int(record["contents"]["n"])
    assert all(len(shards) == 1 for shards in by_user.values()), "one user, one shard"
    tree = loghub(server, "shard", "list", "web", "--project", "cliproj")
    assert tree.returncode == 0
    assert "shard 0 readonly" in tree.stdout and "shard 4 readwrite" in tree.stdout


def test_errors_print_a_code_and_exit_1(server: ServerProcess) -> None:
    missing = loghub(server, "tail", "nope", "--project", "cliproj", "--no-follow")
    assert missing.returncode == 1
    assert "error: LogStoreNotExist" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad = loghub(server, "produce", "web", "--project", "cliproj", stdin="not json\n")
    assert bad.returncode == 3 and "line 1" in bad.stderr  # skipped lines: status 3
