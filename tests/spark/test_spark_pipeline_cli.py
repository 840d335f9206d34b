"""`loghub pipeline access-log` and the demo's pipeline run, each as a process of its own
(its own SparkSession, as a user runs them). Slow: every process starts a JVM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from spark_helpers import PROJECT, LogStore

from loghub.demo import access_logs
from loghub.wire.logs import make_log_group

pytestmark = pytest.mark.slow


def _run(code: str, *args: str) -> str:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _put(logstore: LogStore, count: int, start_s: int) -> None:
    logs = list(access_logs(count, seed=start_s, start_s=start_s))
    for i in range(0, count, 200):
        logstore.client.put_log_group(PROJECT, "app", make_log_group(logs[i : i + 200]))


def test_pipeline_command_then_demo_run_continue_from_one_checkpoint(
    logstore: LogStore, tmp_path: Path
) -> None:
    _put(logstore, 2400, 1_700_000_000)  # two minutes
    out = _run(
        # mounted as the `loghub` command mounts it
        "import typer; from loghub.pipelines.cli import pipeline_app; "
        "app = typer.Typer(); app.add_typer(pipeline_app, name='pipeline'); app()",
        "pipeline",
        "access-log",
        "app",
        "--project",
        PROJECT,
        "--endpoint",
        logstore.endpoint,
        "--output-dir",
        str(tmp_path / "pipeline"),
        "--available-now",
    )
    assert "shop.example.com" in out
    assert list((tmp_path / "pipeline" / "metrics").rglob("*.parquet"))
    _put(logstore, 2400, 1_700_000_120)  # two more minutes: the first two now close
    out = _run(
        "import sys; from pathlib import Path; "
        "from loghub.pipelines.access_log import run_demo_pipeline; "
        "rows = run_demo_pipeline(sys.argv[1], 'spark', 'app', Path(sys.argv[2])); "
        "print('MINUTES', max(r['minutes'] for r in rows))",
        logstore.endpoint,
        str(tmp_path / "pipeline"),
    )
    assert "MINUTES 3" in out  # 3 of 4 minutes closed: the watermark is 1 minute behind
    metrics = logstore.client.list_logstores(PROJECT)
    assert "app-metrics" in metrics
