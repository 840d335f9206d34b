"""Consumer throughput: our ``ConsumerWorker`` beside the official SDK's, on the same data.

Starts a fresh `loghub serve` child, fills a logstore of ``--shards`` shards with
``--logs`` access logs (``--logs-per-group`` per PutLogs), then lets one worker at a time
read all of it from the beginning (a catch-up) with a processor that only counts logs: the
SDK's ``ConsumerWorker`` and ours (one process; then, with ``--processes 2,4``, ours in that
many processes of one consumer group). Each worker is a fresh process and a new consumer
group; ``--runs`` alternations of SDK and ours, so that a noisy neighbour hurts both alike.
The figure is logs/s from the first batch processed to the last, so the time each takes to
join its group (heartbeat timing) does not count.

    python benchmarks/consumer_vs_sdk.py [--smoke] [--runs 5] [--logs 4000000] [--shards 4]
                                         [--logs-per-group 100] [--processes 2]
                                         [--data-dir /tmp]

Prints logs/s of each and their ratio; saves them (``results/consumer_vs_sdk.json``).
``--smoke`` is a run of a few seconds. Every process is started and stopped by PID; the
server's data is removed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import signal
import statistics
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
    fmt_int,
    machine_summary,
    make_data_dir,
    remove_tree,
    run_producers,
)
from _results import Reference, Row, save  # noqa: E402

# --- the worker processes (started with --child) --------------------------------------------


class _Count:
    """Logs counted across threads (and, for ours with processes, across processes)."""

    def __init__(self, shared: Any = None) -> None:
        self._lock = threading.Lock()
        self.shared = shared
        self.logs = 0
        self.started_s = time.monotonic()
        self.first_s = 0.0
        self.last_s = 0.0

    def add(self, logs: int) -> None:
        now = time.monotonic()
        with self._lock:
            if not self.first_s:
                self.first_s = now
            self.logs += logs
            self.last_s = now
        if self.shared is not None:
            with self.shared.get_lock():
                self.shared.value += logs


def _ours_worker(args: argparse.Namespace, name: str, count: _Count) -> Any:
    from loghub.consumer import ConsumerConfig, ConsumerProcessor, ConsumerWorker

    class Counter(ConsumerProcessor):
        def process(self, log_groups: Sequence[Any], checkpointer: Any) -> str | None:
            count.add(sum(len(group.Logs) for group in log_groups))
            checkpointer.save()
            return None

    config = ConsumerConfig(
        endpoint=args.endpoint,
        project=PROJECT,
        logstore=LOGSTORE,
        group=args.group,
        worker_name=name,
        heartbeat_interval_ms=1_000,
        timeout_ms=20_000,
        **({"buffer_bytes_max": args.buffer_mib * 1024 * 1024} if args.buffer_mib else {}),
    )
    worker = ConsumerWorker(Counter, config)
    worker.start()
    return worker


def _ours_process(args: argparse.Namespace, index: int, shared: Any, out: Any) -> None:
    count = _Count(shared)
    _ours_worker(args, f"w{index}", count)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and shared.value < args.logs:
        time.sleep(0.01)
    out.put((count.first_s, count.last_s, count.logs, count.started_s))
    out.close()
    out.join_thread()  # the queue's feeder thread has sent it before the hard exit
    os._exit(0)


def child_ours(args: argparse.Namespace) -> dict[str, Any]:
    if args.child_processes == 1:
        count = _Count()
        _ours_worker(args, "w0", count)
        _wait_for(count, args)
        return _figures(count)
    ctx = mp.get_context("fork")
    shared, out = ctx.Value("q", 0), ctx.Queue()
    processes = [
        ctx.Process(target=_ours_process, args=(args, i, shared, out))
        for i in range(args.child_processes)
    ]
    for process in processes:
        process.start()
    results = [out.get(timeout=args.seconds + 60) for _ in processes]
    for process in processes:
        process.join(timeout=10)
        if process.is_alive() and process.pid is not None:
            os.kill(process.pid, signal.SIGKILL)
    started = [first for first, _last, logs, _start in results if logs]
    ended = [last for _first, last, logs, _start in results if logs]
    logs = sum(logs for _first, _last, logs, _start in results)
    begun = min(start for _first, _last, _logs, start in results)
    return {
        "logs": logs,
        "seconds": max(ended) - min(started) if started else 0.0,
        "seconds_from_start": max(ended) - begun if started else 0.0,
    }


def child_sdk(args: argparse.Namespace) -> dict[str, Any]:
    from aliyun.log.consumer import (
        ConsumerProcessorBase,
        ConsumerWorker,
        CursorPosition,
        LogHubConfig,
    )

    count = _Count()

    class Counter(ConsumerProcessorBase):  # type: ignore[misc]
        def process(self, log_groups: Any, tracker: Any) -> None:
            count.add(sum(len(group.Logs) for group in log_groups.LogGroups))
            tracker.save_check_point(False)

    # Its loop pauses data_fetch_interval between rounds (2 s by default, which would make
    # it look slower than it is). At 0.2 s (what the SDK drivers of the tests use) its pace
    # is set by that pause: 1,000,000 logs took four pauses in every run. 0.02 s is the
    # fastest it goes here; at 0 its loop spins on a core the server and parsing need.
    config = LogHubConfig(
        args.endpoint, "ak", "sk", PROJECT, LOGSTORE, args.group, "w0",
        cursor_position=CursorPosition.BEGIN_CURSOR, heartbeat_interval=1,
        data_fetch_interval=args.sdk_fetch_interval_s,
    )  # fmt: skip
    worker = ConsumerWorker(Counter, consumer_option=config)
    worker.start()
    _wait_for(count, args)
    return _figures(count)


def _figures(count: _Count) -> dict[str, Any]:
    return {
        "logs": count.logs,
        "seconds": count.last_s - count.first_s,
        "seconds_from_start": count.last_s - count.started_s,
        "cpu_s": time.process_time(),
        "page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
    }


def _wait_for(count: _Count, args: argparse.Namespace) -> None:
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and count.logs < args.logs:
        time.sleep(0.01)


def run_child(kind: str, endpoint: str, group: str, logs: int, timeout_s: float,
              processes: int, sdk_fetch_interval_s: float,
              extra: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    """One worker process (and its own children, for ours with processes); returns what it
    printed. It exits by itself after printing; killed by PID only if it overstays."""
    args = [sys.executable, __file__, "--child", kind, "--endpoint", endpoint, "--group", group,
            "--logs", str(logs), "--seconds", str(timeout_s),
            "--child-processes", str(processes),
            "--sdk-fetch-interval-s", str(sdk_fetch_interval_s), *extra]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
    env["PYTHONPATH"] = str(REPO_ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(name, None)
    # the SDK sends `Host: <project>.127.0.0.1:PORT`; the server accepts proxy-form requests
    env["HTTP_PROXY"] = env["http_proxy"] = f"http://{endpoint}"
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        out, _ = proc.communicate(timeout=timeout_s + 120)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        raise
    lines = out.decode().strip().splitlines()
    if not lines:
        raise RuntimeError(f"{kind} worker printed nothing (exit {proc.returncode})")
    result = dict(json.loads(lines[-1]))
    if result["logs"] < logs:
        raise RuntimeError(f"{kind} worker counted {result['logs']} of {logs} logs in time")
    return result


# --- the parent -----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", choices=("ours", "sdk"))
    parser.add_argument("--child-processes", type=int, default=1)
    parser.add_argument("--endpoint", default="")
    parser.add_argument("--group", default="g")
    parser.add_argument("--seconds", type=float, default=600.0, help="(child) give up after")
    parser.add_argument("--smoke", action="store_true", help="a tiny run of a few seconds")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--logs", type=int, default=4_000_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--logs-per-group", type=int, default=100)
    parser.add_argument("--processes", default="2", help="ours in N processes, e.g. 2,4")
    parser.add_argument("--no-sdk", action="store_true", help="ours only (profiling)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--child-timeout-s", type=float, default=600.0)
    parser.add_argument("--sdk-fetch-interval-s", type=float, default=0.02)
    parser.add_argument("--buffer-mib", type=int, default=0, help="ours: buffer_bytes_max")
    args = parser.parse_args()
    if args.child:
        result = child_ours(args) if args.child == "ours" else child_sdk(args)
        print(json.dumps(result), flush=True)
        os._exit(0)  # the workers' threads are not waited for: the figures are taken
    if args.smoke:
        args.runs, args.logs, args.processes, args.child_timeout_s = 1, 20_000, "2", 60.0
    process_counts = [int(p) for p in args.processes.split(",") if p and int(p) > 1]
    print(machine_summary())
    data_dir = make_data_dir(args.data_dir, "loghub-consumer-vs-sdk-")
    server = ServerChild(data_dir / "data", fsync="interval").start()
    endpoint = f"127.0.0.1:{server.port}"
    try:
        create_logstore(server.port, args.shards)
        batches = build_batches(64, args.logs_per_group)
        requests = -(-args.logs // args.logs_per_group)
        run = run_producers(server, batches, 4, requests_each=-(-requests // 4))
        if run.errors:
            raise RuntimeError(f"backlog writes failed: {run.errors}")
        logs = run.total("ok_logs")
        print(f"backlog: {fmt_int(logs)} logs in {args.shards} shards, "
              f"{args.logs_per_group} logs per group")  # fmt: skip
        rates: dict[str, list[float]] = {"sdk": [], "ours": []}
        rates.update({f"ours x{n}": [] for n in process_counts})
        for attempt in range(args.runs):
            kinds = [("ours", 1)] if args.no_sdk else [("sdk", 1), ("ours", 1)]
            kinds += [("ours", n) for n in process_counts]
            for kind, processes in kinds:
                label = kind if processes == 1 else f"ours x{processes}"
                group = f"{label.replace(' ', '')}-{attempt}"
                result = run_child(kind, endpoint, group, logs, args.child_timeout_s, processes,
                                   args.sdk_fetch_interval_s,
                                   ["--buffer-mib", str(args.buffer_mib)])  # fmt: skip
                rate = result["logs"] / max(result["seconds"], 1e-6)
                rates[label].append(rate)
                from_start = result["logs"] / max(result["seconds_from_start"], 1e-6)
                cpu = f", {result['cpu_s']:.2f} s CPU" if "cpu_s" in result else ""
                print(f"  run {attempt + 1} {label:>8}: {fmt_int(rate)} logs/s "
                      f"({fmt_int(from_start)} counting its start{cpu}; "
                      f"{fmt_int(result['logs'])} logs counted, "
                      f"{fmt_int(result.get('page_faults', 0))} page faults)")  # fmt: skip
    finally:
        server.stop()
        remove_tree(data_dir)
    report(args, rates, logs)


def report(args: argparse.Namespace, rates: dict[str, list[float]], logs: int) -> None:
    sdk = rates["sdk"]
    rows = []
    for label, values in rates.items():
        if label == "sdk" or not values:
            continue
        reference = Reference("official SDK ConsumerWorker", sdk) if sdk else None
        goal = "≥ 1× the SDK" if label == "ours" else ""
        rows.append(Row(f"catch-up, {label}", "logs/s", values, reference=reference, goal=goal))
        ratio = rows[-1].ratio()
        ratio_text = f" = {ratio:.2f}x the SDK's" if ratio is not None else ""
        print(f"{label:>8}: median {fmt_int(statistics.median(values))} logs/s{ratio_text}")
    if sdk:
        print(f"{'sdk':>8}: median {fmt_int(statistics.median(sdk))} logs/s")
    notes = [
        f"{fmt_int(logs)} logs in {args.shards} shards, {args.logs_per_group} logs per group, "
        "a processor that counts logs; logs/s from the first batch to the last",
        f"SDK data_fetch_interval {args.sdk_fetch_interval_s} s (its default, 2 s, pauses more)",
    ]
    # a smoke run saves too (run_all --smoke points the results at a temporary directory)
    print(f"saved {save('consumer_vs_sdk', 'Consumer throughput vs the SDK', rows, notes)}")


if __name__ == "__main__":
    main()
