"""Runs every benchmark of this directory within a time budget, then writes BENCHMARKS.md.

`make bench` is this script. Each benchmark script (every ``benchmarks/*.py`` whose name does
not start with an underscore, but for the tools in ``NOT_BENCHMARKS``) runs in turn as a child
process with the arguments in ``BUDGETS``, which size it so that the whole run fits in
``--minutes`` (20) on a 2-core machine; a script that overstays its own time limit or the
run's deadline is stopped (SIGTERM, then SIGKILL, to the process group it was started in, so
its servers go too). Each script saves its figures with ``_results.save``; the run collects
them in ``--results-dir`` with a log of each script's output (``<name>.log``) and ``run.json``
(what ran, with which arguments, for how long, the exit status, the load before and after, the
commit), then ``report.py`` writes the tables and charts. ``--smoke`` runs every script with
``--smoke`` instead, several at a time (``--jobs``): the test suite does that so none rots.

    .venv/bin/python benchmarks/run_all.py [--minutes 20] [--only ingest,pull] [--skip ...]
                                           [--smoke] [--jobs 1] [--results-dir DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
RESULTS_DIR_ENV = "LOGHUB_BENCH_RESULTS_DIR"  # read by _results.save

# Tools that are not benchmarks: this runner, the report, and two scripts for one-off studies.
NOT_BENCHMARKS = {"run_all", "report", "produce_cli", "profile_ingest"}

# The order of a run, then any other script in name order.
ORDER = [
    "ingest", "pull", "small_requests", "latency", "groups", "heartbeats", "rebalance",
    "consumer_vs_sdk", "consumer_memory", "big_bodies", "idle_shards", "validate",
    "replication", "spark_source",
]  # fmt: skip

# name: (arguments, seconds allowed). An argument a script does not list in its --help is
# left out with its value, so that a script may change its options without breaking the run.
# Measured on the 2-core machine under a load average of 11 to 15 (other work running), the
# seven scripts of the first block took 14.4 minutes with twice these sizes; these leave about
# nine minutes for the rest.
BUDGETS: dict[str, tuple[list[str], float]] = {
    "ingest": (["--runs", "3", "--seconds", "3", "--warmup", "1", "--disk-mb", "64"], 300),
    "pull": (["--logs", "2000000", "--passes", "5", "--nats-py-logs", "30000"], 240),
    "groups": (["--rounds", "5", "--runs", "3"], 150),
    "rebalance": (["--shards", "64", "--phases", "8"], 120),
    # 10 passes: the JVM is still compiling Parquet's path for the first few (its fourth pass ran
    # at twice its first), so fewer passes flattered the source
    "spark_source": (["--logs", "300000", "--passes", "10", "--seconds", "10"], 360),
    "big_bodies": (["--runs", "2"], 150),
    "consumer_memory": (["--quick"], 200),
    "small_requests": (["--runs", "3"], 360),
    "latency": (["--runs", "3"], 240),
    "consumer_vs_sdk": (["--runs", "5"], 300),
    "validate": (["--runs", "3"], 90),
    "heartbeats": (["--runs", "3"], 100),
    "idle_shards": (["--runs", "3"], 100),
    "kafka_protocol": (["--logs", "50000", "--runs", "3"], 150),
    # four clusters (etcd and 3 nodes each) started and stopped: about 90 s in all
    "replication": (["--runs", "2", "--seconds", "5"], 180),
}
DEFAULT_BUDGET: tuple[list[str], float] = ([], 90)
SMOKE_SECONDS = 120  # one script's limit with --smoke (they take a few seconds)
SMOKE_LIMITS = {"spark_source": 480.0}  # a Spark session: 1 to 3 minutes on a busy machine


def benchmark_scripts() -> list[str]:
    """The benchmark scripts of this directory, in the order of a run."""
    names = {
        path.stem
        for path in HERE.glob("*.py")
        if not path.stem.startswith("_") and path.stem not in NOT_BENCHMARKS
    }
    return [n for n in ORDER if n in names] + sorted(names - set(ORDER))


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def supported(script: Path, wanted: list[str]) -> list[str]:
    """``wanted`` less the options (each with its value) that ``script --help`` does not list."""
    try:
        helped = subprocess.run(
            [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60
        ).stdout
    except subprocess.TimeoutExpired:
        helped = ""
    known = set(re.findall(r"--[a-z0-9][a-z0-9-]*", helped))
    kept: list[str] = []
    index = 0
    while index < len(wanted):
        option = wanted[index]
        takes_value = index + 1 < len(wanted) and not wanted[index + 1].startswith("--")
        if option in known:
            kept.append(option)
            if takes_value:
                kept.append(wanted[index + 1])
        index += 2 if takes_value else 1
    return kept


def run_script(name: str, args: list[str], limit_s: float, results_dir: Path) -> dict[str, object]:
    """One script as a child in its own process group, its output in ``<name>.log``; the
    JSON files it saves go to a staging directory of its own, then into ``results_dir``, so
    that what each script wrote is known even when several run at once."""
    staging = results_dir / ".staging" / name
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    env = dict(os.environ)
    env[RESULTS_DIR_ENV] = str(staging)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    command = [sys.executable, str(HERE / f"{name}.py"), *args]
    record: dict[str, object] = {"script": name, "args": args, "load_before": load_average()}
    started = time.monotonic()
    with open(results_dir / f"{name}.log", "wb") as log:
        log.write(f"$ {' '.join(command)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
            start_new_session=True,
        )  # fmt: skip
        try:
            record["exit"] = proc.wait(timeout=max(1.0, limit_s))
        except subprocess.TimeoutExpired:
            record["exit"] = "timeout"
            stop_group(proc)
    record["seconds"] = round(time.monotonic() - started, 1)
    record["load_after"] = load_average()
    wrote = []
    for path in sorted(staging.glob("*.json")):
        shutil.move(str(path), results_dir / path.name)
        wrote.append(path.stem)
    record["wrote"] = wrote
    shutil.rmtree(staging, ignore_errors=True)
    return record


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group this runner started the script in, SIGKILL if needed."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=REPO_ROOT,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="the whole run's budget (20)")
    parser.add_argument("--only", default="", help="these scripts only, comma-separated")
    parser.add_argument("--skip", default="", help="scripts left out, comma-separated")
    parser.add_argument("--smoke", action="store_true", help="every script with --smoke")
    parser.add_argument("--jobs", type=int, default=1, help="scripts at once (1; --smoke only)")
    parser.add_argument("--results-dir", default=str(HERE / "results"))
    parser.add_argument("--out", default=str(REPO_ROOT / "BENCHMARKS.md"))
    args = parser.parse_args()
    results_dir = Path(args.results_dir).resolve()
    results_dir.mkdir(parents=True, exist_ok=True)
    names = benchmark_scripts()
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    names = [n for n in names if n not in args.skip.split(",")]
    deadline = time.monotonic() + args.minutes * 60
    run: dict[str, object] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": git_commit(),
        "smoke": args.smoke,
        "load_before": load_average(),
        "scripts": [],
    }
    records: list[dict[str, object]] = []

    def one(name: str) -> dict[str, object]:
        if args.smoke:  # every script takes it: that is the convention the test holds
            script_args, limit_s = ["--smoke"], SMOKE_LIMITS.get(name, float(SMOKE_SECONDS))
        else:
            wanted, limit_s = BUDGETS.get(name, DEFAULT_BUDGET)
            script_args = supported(HERE / f"{name}.py", wanted)
        remaining = deadline - time.monotonic()
        if remaining < 5:
            return {"script": name, "args": script_args, "exit": "not run: out of time"}
        print(f"{name} {' '.join(script_args)} (at most {min(limit_s, remaining):.0f} s)...",
              flush=True)  # fmt: skip
        record = run_script(name, script_args, min(limit_s, remaining), results_dir)
        print(f"{name}: exit {record['exit']} in {record['seconds']} s, wrote "
              f"{', '.join(record['wrote']) or 'nothing'}", flush=True)  # type: ignore[arg-type]  # fmt: skip
        return record

    if args.smoke and args.jobs > 1:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            records = list(pool.map(one, names))
    else:
        records = [one(name) for name in names]
    run["scripts"] = records
    run["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run["load_after"] = load_average()
    (results_dir / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    shutil.rmtree(results_dir / ".staging", ignore_errors=True)

    report = subprocess.run(
        [sys.executable, str(HERE / "report.py"), "--results-dir", str(results_dir),
         "--out", args.out],
    )  # fmt: skip
    failed = [r["script"] for r in records if r.get("exit") != 0]
    if failed:
        print(f"did not finish cleanly: {', '.join(map(str, failed))}")
    return 1 if failed or report.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
