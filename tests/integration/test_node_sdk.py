"""The official Node.js SDK `@alicloud/log`, unmodified, against a real keyed `loghub serve`.

`tests/node/drive.js` runs one scenario with the SDK and prints a JSON line per step; this
module starts it with `node`, judges each step, and reads the logs the SDK wrote back with
the classic Python SDK, every field compared. The SDK signs v1 with HMAC-SHA1 (it has no
v4), creates projects at the bare endpoint, sends `offset=&size=&logstoreName=` for an
empty listing, and has GetLogs/GetHistograms/GetIndex, which LogHub refuses as the hosted
service does for a logstore without an index. It has no shard, cursor or consumer-group
calls; those are covered by the OpenAPI SDK's tests.

The npm package is installed by the `node_sdk` fixture from the committed
`tests/node/package-lock.json` into `tests/node/node_modules` (git-ignored), once: an
installed copy is used as it is, so the tests run offline after the first time. How the
script reaches `<project>.127.0.0.1` is explained at the top of drive.js.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aliyun.log import LogClient
from server_process import ServerProcess

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
SDK_PACKAGE = NODE_DIR / "node_modules" / "@alicloud" / "log" / "package.json"
PROJECT = "node-sdk"
LOGSTORE = "node-store"

pytestmark = pytest.mark.usefixtures("sdk_proxy_env")  # for the Python SDK that reads back


def _wanted_version() -> str:
    lock = json.loads((NODE_DIR / "package-lock.json").read_text())
    return str(lock["packages"]["node_modules/@alicloud/log"]["version"])


@pytest.fixture(scope="session")
def node_sdk() -> str:
    """The `node` executable, with the pinned SDK installed beside drive.js."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the Node.js SDK tests")
    wanted = _wanted_version()
    installed = json.loads(SDK_PACKAGE.read_text())["version"] if SDK_PACKAGE.exists() else None
    if installed != wanted:
        result = subprocess.run(
            [npm, "ci", "--prefix", str(NODE_DIR), "--no-audit", "--no-fund", "--prefer-offline"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, f"npm ci failed:\n{result.stdout}\n{result.stderr}"
    assert json.loads(SDK_PACKAGE.read_text())["version"] == wanted
    return node


@pytest.fixture(scope="module")
def steps(node_sdk: str, signed_server: ServerProcess) -> dict[str, dict[str, Any]]:
    plan = {
        "endpoint": signed_server.endpoint,
        "accessKeyId": "ak",
        "accessKeySecret": "sk",
        "project": PROJECT,
        "logstore": LOGSTORE,
    }
    result = subprocess.run(
        [node_sdk, str(NODE_DIR / "drive.js"), json.dumps(plan)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return {line["step"]: line for line in lines}


def _ok(steps: dict[str, dict[str, Any]], name: str) -> Any:
    line = steps[name]
    assert line["ok"], line
    return line["result"]


def _error_code(steps: dict[str, dict[str, Any]], name: str) -> str:
    line = steps[name]
    assert not line["ok"], line
    return str(line["error"]["code"])


def test_project_and_logstore_crud(steps: dict[str, dict[str, Any]]) -> None:
    _ok(steps, "createProject")  # POST / at the bare endpoint, the name in the body
    assert _error_code(steps, "createProjectAgain") == "ProjectAlreadyExist"
    project = _ok(steps, "getProject")
    assert (project["projectName"], project["description"]) == (PROJECT, "from node")
    _ok(steps, "createLogStore")
    logstore = _ok(steps, "getLogStore")
    assert (logstore["logstoreName"], logstore["ttl"], logstore["shardCount"]) == (LOGSTORE, 7, 2)
    listed = _ok(steps, "listLogStore")  # offset=&size=&logstoreName=
    assert listed["logstores"] == [LOGSTORE]
    assert _ok(steps, "listLogStoreByName")["logstores"] == [LOGSTORE]
    _ok(steps, "updateLogStore")
    assert _ok(steps, "getLogStoreUpdated")["ttl"] == 30
    _ok(steps, "createScratchLogStore")
    _ok(steps, "deleteScratchLogStore")
    assert _error_code(steps, "getDeletedLogStore") == "LogStoreNotExist"
    _ok(steps, "createScratchProject")
    _ok(steps, "deleteScratchProject")  # DELETE / with a JSON body, as this SDK sends it
    assert _error_code(steps, "getDeletedProject") == "ProjectNotExist"


def test_queries_are_refused_as_for_a_logstore_without_an_index(
    steps: dict[str, dict[str, Any]],
) -> None:
    for name in ("getLogs", "getHistograms", "getIndexConfig"):
        assert _error_code(steps, name) == "IndexConfigNotExist", name


def test_the_right_secret_is_accepted_and_a_wrong_one_refused(
    steps: dict[str, dict[str, Any]],
) -> None:
    assert _ok(steps, "getProject")["projectName"] == PROJECT
    assert _error_code(steps, "wrongSecret") == "SignatureNotMatch"


def test_logs_it_writes_read_back_through_the_python_sdk(
    steps: dict[str, dict[str, Any]], signed_server: ServerProcess
) -> None:
    _ok(steps, "postLogStoreLogs")
    reader = LogClient(signed_server.endpoint, "ak", "sk")
    logs = []
    for shard in (0, 1):
        begin = reader.get_begin_cursor(PROJECT, LOGSTORE, shard).get_cursor()
        logs.extend(reader.pull_logs(PROJECT, LOGSTORE, shard, begin).get_flatten_logs_json())
    logs.sort(key=lambda log: str(log["msg"]))
    assert [log["msg"] for log in logs] == [f"node {i}" for i in range(3)]
    for i, log in enumerate(logs):
        assert log["__topic__"] == "node-topic"
        assert log["__source__"] == "10.9.8.7"
        assert log["__tag__:env"] == "node"
        assert log["__tag__:zone"] == "z1"
        assert log["__time__"] == 1_700_000_000 + i
        assert log["__time_ns_part__"] == (123_456_789 + i,)  # the SDK's own trailing comma
        assert log["unicode"] == "日志 ✓"
