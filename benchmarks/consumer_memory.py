"""Peak memory of one consumer worker that falls behind, ours beside the official SDK's.

A consumer with a deep backlog and a slow processor is when memory matters: if it grows until
the kernel kills it, the group rebalances and the next worker inherits the same backlog. For
4, 16 and 64 shards, a backlog of ``--backlog-mb`` raw bytes (several times the largest
budget) is written to a fresh logstore of a `loghub serve` child; then one worker process at
a time consumes it from the beginning with a processor that sleeps ``--sleep-ms`` per batch,
for ``--seconds``. The figure is the worker process's peak RSS (``VmHWM`` from
/proc/self/status, read by the worker just before it exits): ours at budgets
(``buffer_bytes_max``) of 8, 64 and 256 MiB, the official SDK's ``ConsumerWorker`` (which has
no such budget), and ours idle (the same worker starting at the end: interpreter, libraries,
threads; the overhead the budget does not cover).

With ``--processes N`` each budget is also run through ``loghub consume --processes N`` (a
supervisor and N worker processes, the same slow processor), and the sum of the peak RSS of
all N + 1 processes is printed. ``--quick`` is a small run (4 and 16 shards, 8 MiB, a
100 MB backlog, 8 s each). ``--fast`` measures throughput instead: a processor that only
counts logs reads the whole 4-shard backlog with the default budget, ``--repeat`` times (a
new consumer group each time); logs/s from the worker's start to its last log.

    python benchmarks/consumer_memory.py [--quick] [--fast] [--shards 4,16,64]
                                         [--budgets-mib 8,64,256] [--backlog-mb 800]
                                         [--seconds 20] [--sleep-ms 1000] [--no-sdk]
                                         [--processes N]

Prints figures and saves them to benchmarks/results/consumer_memory.json (``--smoke``: a
tiny run that checks the script); asserts nothing about them. Each worker process is started,
and killed, by PID; the server child is stopped by PID and its data removed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    LOGSTORE,
    PROJECT,
    REPO_ROOT,
    ServerChild,
    build_batches,
    create_logstore,
    load_average,
    machine_summary,
    make_data_dir,
    remove_tree,
    run_producers,
)
from _results import Reference, Row, save  # noqa: E402

MIB = 1024 * 1024
LOGS_PER_GROUP = 100  # about 20 KB raw per log group: a pull of 1,000 groups hits 16 MiB


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


# --- the worker processes -----------------------------------------------------------------


def child_ours(args: argparse.Namespace) -> dict[str, Any]:
    from loghub.consumer import ConsumerConfig, ConsumerProcessor, ConsumerWorker

    counted = [0]
    lock = threading.Lock()

    class Processor(ConsumerProcessor):
        def process(self, log_groups: Sequence[Any], checkpointer: Any) -> str | None:
            logs = sum(len(group.Logs) for group in log_groups)
            with lock:
                counted[0] += logs
            if args.sleep_ms:
                time.sleep(args.sleep_ms / 1000)
            checkpointer.save()
            return None

    config = ConsumerConfig(
        endpoint=args.endpoint,
        project=PROJECT,
        logstore=LOGSTORE,
        group=args.group,
        worker_name="w",
        start_position=args.start,
        buffer_bytes_max=args.budget,
        heartbeat_interval_ms=1_000,
        timeout_ms=20_000,
    )
    worker = ConsumerWorker(Processor, config)
    worker.start()
    started = time.monotonic()
    deadline = started + args.seconds
    while time.monotonic() < deadline and not (args.logs and counted[0] >= args.logs):
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    stats = worker.statistics()
    return {
        "logs": counted[0],
        "seconds": elapsed,
        "peak_rss": peak_rss_bytes(),
        "buffered_high_water": stats.buffered_bytes_high_water,
    }


def child_sdk(args: argparse.Namespace) -> dict[str, Any]:
    from aliyun.log.consumer import (
        ConsumerProcessorBase,
        ConsumerWorker,
        CursorPosition,
        LogHubConfig,
    )

    counted = [0]
    lock = threading.Lock()

    class Processor(ConsumerProcessorBase):  # type: ignore[misc]
        def process(self, log_groups: Any, tracker: Any) -> None:
            logs = sum(len(group.Logs) for group in log_groups.LogGroups)
            with lock:
                counted[0] += logs
            time.sleep(args.sleep_ms / 1000)
            tracker.save_check_point(False)

    config = LogHubConfig(
        args.endpoint, "ak", "sk", PROJECT, LOGSTORE, args.group, "w",
        cursor_position=CursorPosition.BEGIN_CURSOR, heartbeat_interval=1,
        data_fetch_interval=0.2,
    )  # fmt: skip
    worker = ConsumerWorker(Processor, consumer_option=config)
    worker.start()
    started = time.monotonic()
    time.sleep(args.seconds)
    return {"logs": counted[0], "seconds": time.monotonic() - started, "peak_rss": peak_rss_bytes()}


def run_child(
    kind: str, endpoint: str, group: str, seconds: float, **options: Any
) -> dict[str, Any]:
    """One worker process; returns what it printed. It exits by itself (os._exit after
    printing); it is killed by PID only if it overstays."""
    args = [sys.executable, __file__, "--child", kind, "--endpoint", endpoint, "--group", group,
            "--seconds", str(seconds)]  # fmt: skip
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
    env["PYTHONPATH"] = str(REPO_ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(name, None)
    # the SDK sends `Host: <project>.127.0.0.1:PORT`; the server accepts proxy-form requests
    env["HTTP_PROXY"] = env["http_proxy"] = f"http://{endpoint}"
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        out, _ = proc.communicate(timeout=seconds + 120)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        raise
    lines = out.decode().strip().splitlines()
    if not lines:
        raise RuntimeError(f"{kind} worker printed nothing (exit {proc.returncode})")
    return dict(json.loads(lines[-1]))


class SlowProcessor:
    """For ``loghub consume --processor consumer_memory:SlowProcessor`` (``--processes``):
    sleeps 1 s per batch. Built on first use so that importing this module stays light."""

    def __new__(cls) -> Any:
        from loghub.consumer import ConsumerProcessor

        class Slow(ConsumerProcessor):
            def process(self, log_groups: Sequence[Any], checkpointer: Any) -> str | None:
                time.sleep(1.0)
                checkpointer.save()
                return None

        return Slow()


def _peak_rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(p) for p in children.read().split()]
    except OSError:
        return []


def run_supervised(
    endpoint: str, group: str, processes: int, budget: int, seconds: float
) -> tuple[int, list[int]]:
    """`loghub consume --processes N` with the slow processor; returns the peak RSS of the
    supervisor and of each child (sampled every 0.2 s until the end). SIGTERM to the
    supervisor by PID ends it; SIGKILL by PID only if it does not stop."""
    args = [sys.executable, "-m", "loghub.consumer.cli", LOGSTORE, "--project", PROJECT,
            "--group", group, "--name", group, "--endpoint", endpoint,
            "--processor", "consumer_memory:SlowProcessor", "--processes", str(processes),
            "--buffer-bytes-max", str(budget), "--heartbeat-interval-ms", "1000",
            "--timeout-ms", "20000"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
    paths = [str(REPO_ROOT / "src"), str(Path(__file__).resolve().parent)]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    peaks: dict[int, int] = {}
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for pid in [proc.pid, *_children_of(proc.pid)]:
                peaks[pid] = max(peaks.get(pid, 0), _peak_rss_of(pid))
            time.sleep(0.2)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    supervisor = peaks.pop(proc.pid, 0)
    return supervisor, sorted(peaks.values())


# --- the parent ---------------------------------------------------------------------------


def write_backlog(server: ServerChild, backlog_bytes: int) -> tuple[int, int]:
    """Writes about ``backlog_bytes`` raw; returns (raw bytes, logs) written."""
    batches = build_batches(64, LOGS_PER_GROUP)
    raw_per_request = sum(b.raw_size for b in batches) / len(batches)
    producers = 4
    requests_each = max(1, int(backlog_bytes / raw_per_request / producers))
    run = run_producers(server, batches, producers, requests_each=requests_each)
    if run.errors:
        raise RuntimeError(f"backlog writes failed: {run.errors}")
    return run.total("ok_raw_bytes"), run.total("ok_logs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", choices=("ours", "sdk"))
    parser.add_argument("--endpoint", default="")
    parser.add_argument("--group", default="g")
    parser.add_argument("--start", default="begin")
    parser.add_argument("--budget", type=int, default=64 * MIB)
    parser.add_argument("--sleep-ms", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--logs", type=int, default=0, help="(child) stop after this many")
    parser.add_argument("--quick", action="store_true", help="small: 4 and 16 shards, 8 MiB")
    parser.add_argument("--fast", action="store_true", help="throughput with a fast processor")
    parser.add_argument("--shards", default="4,16,64")
    parser.add_argument("--budgets-mib", default="8,64,256")
    parser.add_argument("--backlog-mb", type=float, default=800.0)
    parser.add_argument("--no-sdk", action="store_true")
    parser.add_argument("--processes", type=int, default=1, help="also `loghub consume` with N")
    parser.add_argument("--repeat", type=int, default=3, help="--fast: runs over the backlog")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.shards, args.budgets_mib, args.backlog_mb, args.seconds = "2", "8", 4.0, 2.0
        args.no_sdk = True
    if args.child:
        result = child_ours(args) if args.child == "ours" else child_sdk(args)
        print(json.dumps(result), flush=True)
        os._exit(0)  # the worker's threads are not waited for: the figures are taken
    if args.quick:
        args.shards, args.budgets_mib, args.backlog_mb, args.seconds = "4,16", "8", 100.0, 8.0
    if args.fast:
        args.shards = "4"
    print(f"{machine_summary()}; {load_average()}")
    rows: list[Row] = []
    for shards in [int(s) for s in args.shards.split(",")]:
        rows += run_shard_count(args, shards)
    title = "Consumer worker: throughput" if args.fast else "Consumer worker: peak memory"
    print(f"saved {save('consumer_memory', title, rows, [load_average()])}")


def run_shard_count(args: argparse.Namespace, shards: int) -> list[Row]:
    """Prints the figures of one shard count and returns them as rows."""
    rows: list[Row] = []
    data_dir = make_data_dir(args.data_dir, "loghub-consumer-memory-")
    server = ServerChild(data_dir / "data", fsync="interval").start()
    endpoint = f"127.0.0.1:{server.port}"
    try:
        create_logstore(server.port, shards)
        started = time.monotonic()
        written, logs = write_backlog(server, int(args.backlog_mb * 1e6))
        print(
            f"\n{shards} shards: backlog {written / 1e6:,.0f} MB raw written in "
            f"{time.monotonic() - started:.1f} s"
        )
        if args.fast:
            rates = []
            for attempt in range(args.repeat):
                result = run_child(
                    "ours", endpoint, f"fast-{attempt}", 600.0, sleep_ms=0, logs=logs
                )
                rate = result["logs"] / result["seconds"]
                rates.append(rate)
                print(f"fast processor, default budget: {result['logs']:,} logs in "
                      f"{result['seconds']:.1f} s = {rate:,.0f} logs/s "
                      f"(peak RSS {result['peak_rss'] / MIB:,.0f} MiB)")  # fmt: skip
            rows.append(Row(f"{shards} shards, a processor that does nothing", "logs/s", rates))
            return rows
        common = {"sleep_ms": args.sleep_ms}
        idle = run_child("ours", endpoint, "idle", 3.0, start="end", **common)
        print("| shards | worker | budget MiB | peak RSS MiB | above idle MiB | "
              "above budget+idle MiB | logs processed |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        idle_mib = idle["peak_rss"] / MIB
        print(f"| {shards} | ours, idle | - | {idle_mib:,.0f} | 0 | - | 0 |")
        ours = []
        for budget_mib in [int(b) for b in args.budgets_mib.split(",")]:
            result = run_child(
                "ours", endpoint, f"ours-{budget_mib}", args.seconds,
                budget=budget_mib * MIB, **common,
            )  # fmt: skip
            peak_mib = result["peak_rss"] / MIB
            above_idle_mib = peak_mib - idle_mib
            ours.append((budget_mib, peak_mib))
            print(f"| {shards} | ours | {budget_mib} | {peak_mib:,.0f} | {above_idle_mib:,.0f} "
                  f"| {above_idle_mib - budget_mib:,.0f} | {result['logs']:,} |")  # fmt: skip
        if args.processes > 1:
            for budget_mib in [int(b) for b in args.budgets_mib.split(",")]:
                supervisor, children = run_supervised(
                    endpoint, f"procs-{budget_mib}", args.processes, budget_mib * MIB,
                    args.seconds,
                )  # fmt: skip
                each = " + ".join(f"{c / MIB:,.0f}" for c in children)
                total_mib = (supervisor + sum(children)) / MIB
                print(f"| {shards} | ours, --processes {args.processes}: supervisor "
                      f"{supervisor / MIB:,.0f} + workers {each} | {budget_mib} each | "
                      f"{total_mib:,.0f} | - | - | - |")  # fmt: skip
        if not args.no_sdk:
            result = run_child("sdk", endpoint, "sdk", args.seconds, **common)
            peak_mib = result["peak_rss"] / MIB
            print(f"| {shards} | SDK | - | {peak_mib:,.0f} | {peak_mib - idle_mib:,.0f} | - "
                  f"| {result['logs']:,} |")  # fmt: skip
        sdk = None if args.no_sdk else Reference("official SDK ConsumerWorker", [peak_mib])
        for budget_mib, peak in ours:
            rows.append(
                Row(f"{shards} shards, slow processor, budget {budget_mib} MiB",
                    "peak RSS MiB", [peak], reference=sdk, higher_is_better=False,
                    extra={"idle_mib": idle_mib})
            )  # fmt: skip
    finally:
        server.stop()
        remove_tree(data_dir)
    return rows


if __name__ == "__main__":
    main()
