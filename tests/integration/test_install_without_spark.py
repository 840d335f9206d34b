"""An install without the ``[spark]`` extra runs the README's quick start, and everything that
needs Spark says which extra to install instead of a traceback.

Rather than building a second virtual environment (minutes of installing), every process here
runs with PySpark, PyArrow and py4j made unimportable: a ``sitecustomize`` on ``PYTHONPATH``
puts a finder first on ``sys.meta_path`` that refuses them, as an interpreter without them
would. A quick-start command that reached for Spark would fail here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import ServerProcess

import loghub

SRC = Path(loghub.__file__).parent.parent

_BLOCKER = '''
import importlib.abc
import sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    """As if the spark extra were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyspark", "pyarrow", "py4j"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
'''


@pytest.fixture(scope="module")
def without_spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment of a process on an install without the extra, and a server in it."""
    blocker = tmp_path_factory.mktemp("no-spark")
    (blocker / "sitecustomize.py").write_text(_BLOCKER)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", f"{blocker}{os.pathsep}{SRC}")
        server = ServerProcess(tmp_path_factory.mktemp("server") / "data").start()
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
            env["LOGHUB_ENDPOINT"] = server.endpoint
            yield env
        finally:
            server.stop()


def _loghub(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loghub", *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_spark_is_really_not_importable_there(without_spark: dict[str, str]) -> None:
    probe = "import pyspark"
    result = subprocess.run(
        [sys.executable, "-c", probe], env=without_spark, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "No module named 'pyspark'" in result.stderr


def test_the_readme_quick_start_runs(without_spark: dict[str, str]) -> None:
    env = without_spark
    assert _loghub(env, "project", "create", "web").returncode == 0
    created = _loghub(env, "logstore", "create", "access", "--project", "web", "--shards", "4")
    assert created.returncode == 0, created.stderr
    lines = '{"path": "/", "status": 200}\n{"path": "/cart", "status": 404}\n'
    produced = _loghub(
        env, "produce", "access", "--project", "web", "--hash-key-field", "path", stdin=lines
    )
    assert produced.returncode == 0, produced.stderr
    tail = _loghub(env, "tail", "access", "--project", "web", "--from", "begin", "--no-follow")
    assert tail.returncode == 0, tail.stderr
    assert "/cart" in tail.stdout and "404" in tail.stdout


def test_the_readme_python_client_example_runs(without_spark: dict[str, str]) -> None:
    endpoint = without_spark["LOGHUB_ENDPOINT"]
    assert _loghub(without_spark, "project", "create", "pyweb").returncode == 0
    created = _loghub(without_spark, "logstore", "create", "access", "--project", "pyweb")
    assert created.returncode == 0, created.stderr
    example = f"""
from loghub.client import LogHubClient
from loghub.wire.logs import make_log_group

with LogHubClient("{endpoint}") as client:
    client.put_log_group("pyweb", "access", make_log_group([(1700000000, {{"path": "/"}})]))
    counts = []
    for shard in client.list_shards("pyweb", "access"):
        cursor = client.get_cursor("pyweb", "access", shard.shard_id, "begin")
        for result in client.iter_pull("pyweb", "access", shard.shard_id, cursor):
            counts.append(result.count)
    print(sum(counts))
"""
    result = subprocess.run(
        [sys.executable, "-c", example],
        env=without_spark,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"


def test_a_pipeline_says_which_extra_to_install(without_spark: dict[str, str]) -> None:
    result = _loghub(without_spark, "pipeline", "access-log", "access", "--project", "web")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "pip install 'openloghub[spark]'" in result.stderr, result.stderr


def test_importing_the_spark_source_says_which_extra_to_install(
    without_spark: dict[str, str],
) -> None:
    for module in ("loghub.spark", "loghub.pipelines.access_log"):
        result = subprocess.run(
            [sys.executable, "-c", f"import {module}"],
            env=without_spark,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1
        assert "pip install 'openloghub[spark]'" in result.stderr, result.stderr


def test_the_demo_runs_and_says_the_pipeline_needs_the_extra(
    without_spark: dict[str, str], tmp_path: Path
) -> None:
    result = _loghub(without_spark, "demo", "--logs", "200", "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 0, result.stderr
    assert "no pipeline" in result.stdout and "openloghub[spark]" in result.stdout
