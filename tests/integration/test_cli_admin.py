"""The admin commands against a real server with a running consumer group: `group list`,
`describe` (owners, lag in log groups and in seconds, totals), `reset` (dry run, refused
while consumers are live, executed), `delete` (asks first), `logstore describe`,
`--version`, and malformed endpoints."""

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
from loghub.wire.logs import make_log_group

KEYS = {"ak": "sk"}
PROJECT = "admin"
WORKER_SCRIPT = Path(__file__).with_name("loghub_consumer_worker.py")
GAP_S = 1.5  # between the two groups written to each shard: the idle group's lag in seconds


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("admin") / "data", keys=KEYS).start()
    try:
        yield process
    finally:
        process.stop()


def loghub(server: ServerProcess, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
    env |= {"LOGHUB_ACCESS_KEY_ID": "ak", "LOGHUB_ACCESS_KEY_SECRET": "sk"}
    return subprocess.run(
        [sys.executable, "-m", "loghub", *args, "--endpoint", server.endpoint],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def table_rows(table: str) -> list[list[str]]:
    """The body rows of a rich table, as lists of cell texts."""
    return [
        [cell.strip() for cell in line.strip().strip("│").split("│")]
        for line in table.splitlines()
        if line.startswith("│")
    ]


def wait_until(predicate: object, timeout_s: float = 60.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def setup(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Logstore `web` (2 shards, two groups in each, GAP_S apart), group `idle` with no
    consumer, and group `live` consumed by one real worker process (`w1`)."""
    with LogHubClient(server.endpoint, "ak", "sk") as client:
        client.create_project(PROJECT)
        client.create_logstore(PROJECT, "web", shard_count=2, ttl_days=7)
        client.create_consumer_group(PROJECT, "web", "idle", 60)
        for batch in range(2):
            for shard_id in (0, 1):
                group = make_log_group([(1_700_000_000, {"key": f"k{shard_id}", "n": str(batch)})])
                client.put_log_group(PROJECT, "web", group, shard_id=shard_id)
            if batch == 0:
                time.sleep(GAP_S)
    out = tmp_path_factory.mktemp("worker-out")
    log = open(out / "worker.log", "ab")  # noqa: SIM115 (the child owns it)
    args = [
        sys.executable,
        str(WORKER_SCRIPT),
        str(out),
        server.endpoint,
        PROJECT,
        "web",
        "live",
        "w1",
        "server",
    ]
    worker = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        # the worker creates `live` once its interpreter is up, which on a busy machine takes
        # seconds: the tests start from a group that exists
        with LogHubClient(server.endpoint, "ak", "sk") as client:

            def live() -> bool:
                assert worker.poll() is None, (out / "worker.log").read_text()[-3000:]
                groups = client.list_consumer_groups(PROJECT, "web")
                return any(g.get("name") == "live" for g in groups)

            wait_until(live)
        yield "web"
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGTERM)
            worker.wait(timeout=30)


def describe(server: ServerProcess, group: str) -> dict[str, object]:
    reply: dict[str, object] = json.loads(
        ok(loghub(server, "group", "describe", "web", group, "-p", PROJECT, "--json"))
    )
    return reply


def test_describe_shows_owner_and_lag_of_a_running_group(server: ServerProcess, setup: str) -> None:
    def caught_up() -> bool:
        described = describe(server, "live")
        shards = described["shards"]
        assert isinstance(shards, list)
        return all(s["owner"] == "w1" and s["lagGroups"] == 0 for s in shards)

    wait_until(caught_up)
    described = describe(server, "live")
    assert described["consumers"] == ["w1"]
    assert described["lagGroups"] == 0 and described["lagSeconds"] == 0
    shards = described["shards"]
    assert isinstance(shards, list)
    assert [(s["shard"], s["state"], s["endSeq"]) for s in shards] == [
        (0, "already_alloc", 2),
        (1, "already_alloc", 2),
    ]
    table = ok(loghub(server, "group", "describe", "web", "live", "-p", PROJECT))
    assert "live consumers w1" in table
    *rows, total = table_rows(table)
    assert total == ["total", "", "", "", "", "", "0", "0.0"], table
    assert [row[:4] for row in rows] == [
        ["0", "readwrite", "already_alloc", "w1"],
        ["1", "readwrite", "already_alloc", "w1"],
    ], table
    assert [row[5:8] for row in rows] == [["2", "0", "0.0"]] * 2, table


def test_idle_group_lags_in_groups_and_seconds(server: ServerProcess, setup: str) -> None:
    described = describe(server, "idle")
    assert described["consumers"] == []
    shards = described["shards"]
    assert isinstance(shards, list)
    assert [(s["owner"], s["checkpoint"], s["lagGroups"]) for s in shards] == [("", "", 2)] * 2
    for shard in shards:
        assert GAP_S <= shard["lagSeconds"] < GAP_S + 5
    assert described["lagGroups"] == 4
    listing = json.loads(ok(loghub(server, "group", "list", "web", "-p", PROJECT, "--json")))
    by_name = {g["consumerGroup"]: g for g in listing}
    assert by_name["idle"]["lagGroups"] == 4 and by_name["live"]["consumers"] == ["w1"]
    table = ok(loghub(server, "group", "list", "web", "-p", PROJECT))
    idle_row = next(row for row in table_rows(table) if row[0] == "idle")
    assert idle_row[:5] == ["idle", "60", "no", "0", "4"], table
    assert GAP_S <= float(idle_row[5]) < GAP_S + 5, table


def test_reset_dry_run_changes_nothing_and_execute_moves_checkpoints(
    server: ServerProcess, setup: str
) -> None:
    dry = ok(loghub(server, "group", "reset", "web", "idle", "-p", PROJECT, "--to", "end"))
    assert "dry run" in dry
    assert describe(server, "idle")["lagGroups"] == 4
    plan = json.loads(
        ok(loghub(server, "group", "reset", "web", "idle", "-p", PROJECT, "--to", "end", "--json"))
    )
    assert plan["executed"] is False
    assert [(s["shard"], s["fromSeq"], s["toSeq"]) for s in plan["plan"]] == [
        (0, None, 2),
        (1, None, 2),
    ]

    done = loghub(
        server, "group", "reset", "web", "idle", "-p", PROJECT, "--to", "end", "--execute"
    )
    assert "reset 2 checkpoints" in ok(done)
    described = describe(server, "idle")
    assert described["lagGroups"] == 0 and described["lagSeconds"] == 0

    back = loghub(
        server,
        "group",
        "reset",
        "web",
        "idle",
        "-p",
        PROJECT,
        "--shift",
        "-1",
        "--shard",
        "0",
        "--execute",
        "--json",
    )
    assert [(s["fromSeq"], s["toSeq"]) for s in json.loads(ok(back))["plan"]] == [(2, 1)]
    shards = describe(server, "idle")["shards"]
    assert isinstance(shards, list)
    assert shards[0]["lagGroups"] == 1 and GAP_S <= shards[0]["lagSeconds"] < GAP_S + 5
    assert shards[1]["lagGroups"] == 0

    # a time: one hour ago is before every group, so the checkpoints go to the beginning
    since = ok(
        loghub(server, "group", "reset", "web", "idle", "-p", PROJECT, "--to", "-1h", "--execute")
    )
    assert "reset 2 checkpoints" in since
    assert describe(server, "idle")["lagGroups"] == 4


def test_reset_is_refused_while_consumers_are_live_unless_forced(
    server: ServerProcess, setup: str
) -> None:
    wait_until(lambda: describe(server, "live")["consumers"] == ["w1"])
    refused = loghub(
        server, "group", "reset", "web", "live", "-p", PROJECT, "--to", "begin", "--execute"
    )
    assert refused.returncode == 1
    assert "live consumers (w1)" in refused.stderr and "--force" in refused.stderr
    assert "Traceback" not in refused.stderr
    dry = ok(loghub(server, "group", "reset", "web", "live", "-p", PROJECT, "--to", "begin"))
    assert "live consumers: w1" in dry
    forced = loghub(
        server,
        "group",
        "reset",
        "web",
        "live",
        "-p",
        PROJECT,
        "--to",
        "2023-11-14T00:00:00Z",
        "--execute",
        "--force",
        "--json",
    )
    assert json.loads(ok(forced))["executed"] is True


def test_bad_time_and_bad_endpoint_are_one_line_errors(server: ServerProcess, setup: str) -> None:
    bad = loghub(server, "group", "reset", "web", "idle", "-p", PROJECT, "--to", "yesterday")
    assert bad.returncode == 2 and "is not a time" in bad.stderr
    no_shard = loghub(server, "group", "reset", "web", "idle", "-p", PROJECT, "--to", "end",
                      "--shard", "7")  # fmt: skip
    assert no_shard.returncode == 1 and "has no shard 7" in no_shard.stderr
    for endpoint in (":8080", "http://", "host:port"):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "loghub",
                "group",
                "list",
                "web",
                "-p",
                PROJECT,
                "--endpoint",
                endpoint,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1, result.stderr
        assert result.stderr.startswith("error: endpoint"), result.stderr
        assert "Traceback" not in result.stderr


def test_delete_asks_first(server: ServerProcess, setup: str) -> None:
    ok(loghub(server, "group", "create", "web", "doomed", "-p", PROJECT))
    kept = loghub(server, "group", "delete", "web", "doomed", "-p", PROJECT, stdin="n\n")
    assert kept.returncode == 1 and "not deleted" in kept.stderr
    listing = json.loads(ok(loghub(server, "group", "list", "web", "-p", PROJECT, "--json")))
    names = [g["consumerGroup"] for g in listing]
    assert "doomed" in names
    ok(loghub(server, "group", "delete", "web", "doomed", "-p", PROJECT, stdin="y\n"))
    ok(loghub(server, "group", "create", "web", "doomed", "-p", PROJECT))
    assert "deleted" in ok(
        loghub(server, "group", "delete", "web", "doomed", "-p", PROJECT, "--yes")
    )
    listing = json.loads(ok(loghub(server, "group", "list", "web", "-p", PROJECT, "--json")))
    assert "doomed" not in [g["consumerGroup"] for g in listing]


def test_logstore_describe_shows_retention_size_and_rate(server: ServerProcess, setup: str) -> None:
    described = json.loads(
        ok(loghub(server, "logstore", "describe", "web", "-p", PROJECT, "--json"))
    )
    assert described["logstore"]["ttl"] == 7
    assert {"idle", "live"} <= set(described["consumerGroups"])
    shards = described["shards"]
    assert [(s["shard"], s["status"], s["beginSeq"], s["endSeq"]) for s in shards] == [
        (0, "readwrite", 0, 2),
        (1, "readwrite", 0, 2),
    ]
    assert all(s["sizeBytes"] > 0 for s in shards)
    assert described["sizeBytes"] == sum(s["sizeBytes"] for s in shards)
    with LogHubClient(server.endpoint, "ak", "sk") as client:
        client.create_logstore(PROJECT, "rated", shard_count=1, ttl_days=1)
        for n in range(3):
            group = make_log_group([(1_700_000_000, {"key": "k", "n": str(n)})])
            client.put_log_group(PROJECT, "rated", group, shard_id=0)
    rated = json.loads(ok(loghub(server, "logstore", "describe", "rated", "-p", PROJECT, "--json")))
    # three groups in the last minute (the window), none before
    assert rated["groupsPerSecond"] == pytest.approx(3 / rated["rateWindowSeconds"], abs=1e-3)
    table = ok(loghub(server, "logstore", "describe", "web", "-p", PROJECT))
    assert "retention 7 days" in table
    *rows, total = table_rows(table)
    assert [row[:2] + row[3:5] for row in rows] == [
        ["0", "readwrite", "0", "2"],
        ["1", "readwrite", "0", "2"],
    ]
    assert total[0] == "total" and total[2] == str(described["sizeBytes"])


def test_version() -> None:
    version = subprocess.run(
        [sys.executable, "-m", "loghub", "--version"], capture_output=True, text=True, timeout=60
    )
    assert version.returncode == 0 and version.stdout.startswith("loghub ")


def test_during_a_hand_off_the_owner_is_the_old_holder(server: ServerProcess, setup: str) -> None:
    with LogHubClient(server.endpoint, "ak", "sk") as client:
        client.create_logstore(PROJECT, "handoff", shard_count=2, ttl_days=1)
        client.create_consumer_group(PROJECT, "handoff", "hh", 60)
        assert client.heartbeat(PROJECT, "handoff", "hh", "a", []) == [0, 1]
        client.heartbeat(PROJECT, "handoff", "hh", "a", [0, 1])
        client.heartbeat(PROJECT, "handoff", "hh", "b", [])  # one shard moves towards b
    described = json.loads(
        ok(loghub(server, "group", "describe", "handoff", "hh", "-p", PROJECT, "--json"))
    )
    assert described["consumers"] == ["a", "b"]
    owners = sorted((s["state"], s["owner"]) for s in described["shards"])
    assert owners == [("already_alloc", "a"), ("transfer", "a")]


def test_every_list_command_speaks_json(server: ServerProcess, setup: str) -> None:
    projects = json.loads(ok(loghub(server, "project", "list", "--json")))
    assert PROJECT in [p["projectName"] for p in projects]
    assert "web" in json.loads(ok(loghub(server, "logstore", "list", "-p", PROJECT, "--json")))
    shards = json.loads(ok(loghub(server, "shard", "list", "web", "-p", PROJECT, "--json")))
    assert [(s["shard_id"], s["status"]) for s in shards] == [(0, "readwrite"), (1, "readwrite")]
