"""Every benchmark script runs at a tiny size (``--smoke``) and saves its figures, and the
report renders them: `make bench` runs rarely, so this is what keeps each script from rotting
(a renamed helper, a changed API) between two runs.

The scripts are the ones `make bench` runs (``benchmarks/run_all.py`` finds them: every
``benchmarks/*.py`` not starting with an underscore, less the tools), run the way it runs
them, three at a time; each must exit 0 and save at least one results file with rows, and
``report.py`` must write the tables and a chart from those files into a temp directory. The
Spark source's smoke run starts a Spark session, about a minute on a 2-core machine, so it
is in the slow suite.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH = REPO_ROOT / "benchmarks"
SLOW = ("spark_source",)


def run_all_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run_all", BENCH / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def smoke(tmp_path: Path, names: list[str], timeout_s: float) -> dict[str, dict[str, object]]:
    """``run_all.py --smoke`` of ``names`` into tmp_path; checks what each script saved and
    the report; returns the run's record of each script."""
    results = tmp_path / "results"
    out = tmp_path / "BENCHMARKS.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT / "src"),
                                                      env.get("PYTHONPATH")]))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--smoke", "--jobs", "3",
         "--only", ",".join(names), "--results-dir", str(results), "--out", str(out)],
        capture_output=True, text=True, timeout=timeout_s, env=env, cwd=tmp_path,
    )  # fmt: skip
    run = json.loads((results / "run.json").read_text())
    records = {str(r["script"]): r for r in run["scripts"]}
    assert sorted(records) == sorted(names), proc.stdout + proc.stderr
    text = out.read_text()
    for name, record in records.items():
        log = (results / f"{name}.log").read_text(errors="replace")[-3000:]
        assert record["exit"] == 0, f"{name} exited {record['exit']}:\n{log}"
        assert record["wrote"], f"{name} saved no results:\n{log}"
        for saved in record["wrote"]:  # type: ignore[union-attr]
            document = json.loads((results / f"{saved}.json").read_text())
            assert document["rows"], f"{name} saved {saved}.json without rows:\n{log}"
            assert any(row["values"] for row in document["rows"]), f"{saved}: no figures"
            assert f"`benchmarks/{saved}.py`" in text or document["title"] in text
            assert (results / f"{saved}.png").stat().st_size > 0, f"no chart for {saved}"
            assert f"({saved}.png)" in text or f"/{saved}.png)" in text
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return records


def test_every_benchmark_runs_at_smoke_size_and_the_report_renders(tmp_path: Path) -> None:
    names = [n for n in run_all_module().benchmark_scripts() if n not in SLOW]
    assert {"ingest", "pull", "groups", "rebalance", "big_bodies", "consumer_memory"} <= set(names)
    records = smoke(tmp_path, names, timeout_s=280)
    ingest = json.loads((tmp_path / "results" / "ingest.json").read_text())
    references = {row["reference"]["name"] for row in ingest["rows"] if row["reference"]}
    assert any("Redis" in r and "memory" in r for r in references), references
    assert any("appendfsync always" in r for r in references), references
    assert any("NATS JetStream" in r for r in references), references
    assert any(r.startswith("disk") for r in references), references
    pull = json.loads((tmp_path / "results" / "pull.json").read_text())
    references = {row["reference"]["name"] for row in pull["rows"] if row["reference"]}
    assert any("XRANGE" in r for r in references) and any("XREADGROUP" in r for r in references)
    assert any("NATS JetStream pull consumer" in r for r in references), references
    assert records["ingest"]["wrote"] == ["ingest"]


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_the_spark_benchmark_runs_at_smoke_size(tmp_path: Path) -> None:
    smoke(tmp_path, list(SLOW), timeout_s=900)
