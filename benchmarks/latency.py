"""Produce-to-processed latency through the consumer library, at 10%, 50% and 90% of the
measured maximum rate.

Starts a fresh `loghub serve` child (fsync always), measures the maximum ingest rate of
``--producers`` unthrottled producer processes sending PutLogs of ``--logs-per-request``
access logs, then runs one ``ConsumerWorker`` (default settings, in its own process, from
the end of the shards) while the same producers send at a fixed pace of 10%, 50% and 90% of
that maximum, ``--seconds`` each. Every log carries the CLOCK_MONOTONIC time at which its
request was sent (the same clock in every process of the machine); the processor notes, per
log group, when it got it. Latency = processed - sent: PutLogs, the group commit's fsync,
the pull (or long poll), the consumer's queue and the call to ``process``.

    python benchmarks/latency.py [--smoke] [--runs 3] [--seconds 10] [--producers 4]
                                 [--logs-per-request 16] [--shards 2] [--data-dir /tmp]

Prints p50/p99/p99.9 per load and saves them (``results/latency.json``). ``--smoke`` is a
run of a few seconds that only shows the pieces still work. Every process it starts is
stopped by PID; the server's data is removed.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lz4.block

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    LOGSTORE,
    PROJECT,
    ServerChild,
    access_log_record,
    build_batches,
    create_logstore,
    fmt_int,
    make_data_dir,
    percentile,
    remove_tree,
    run_producers,
)
from _results import Row, save  # noqa: E402

from loghub.consumer import Checkpointer, ConsumerConfig, ConsumerProcessor, ConsumerWorker  # noqa: E402
from loghub.wire.logs import make_log_group  # noqa: E402
from loghub.wire.proto import LogGroup  # noqa: E402

LOADS = (0.1, 0.5, 0.9)
_STAMP = b"T" * 19  # stands for the send time (19 digits of ns) in the encoded group


# --- producers ------------------------------------------------------------------------------


def _template(logs: int, index: int) -> bytes:
    """One encoded LogGroup whose logs hold ``_STAMP`` in their ``sent_ns`` key, to be
    replaced by the send time: no protobuf encoding on the producer's hot path."""
    rng = random.Random(index)
    now_s = int(time.time())
    records = []
    for _ in range(logs):
        time_s, record = access_log_record(rng, now_s)
        records.append((time_s, {**record, "sent_ns": _STAMP.decode()}))
    group = make_log_group(records, topic="latency", source=f"10.0.1.{index + 1}")
    return bytes(group.SerializeToString())


def _paced_producer(
    port: int, index: int, logs: int, rate_per_s: float, start_ns: int, stop_ns: int, out: Any
) -> None:
    """Sends one request every 1/rate s from ``start_ns`` until ``stop_ns`` (a late request
    goes at once: the schedule is kept, not the gaps); returns the count and errors."""
    template = _template(logs, index)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    path = f"/logstores/{LOGSTORE}/shards/lb"
    headers = {
        "Host": f"{PROJECT}.127.0.0.1",
        "Content-Type": "application/x-protobuf",
        "x-log-apiversion": "0.6.0",
        "x-log-compresstype": "lz4",
        "x-log-bodyrawsize": str(len(template)),
    }
    interval_ns = int(1e9 / rate_per_s)
    sent = errors = 0
    acked_ms: list[float] = []  # PutLogs sent to acknowledged (durable)
    next_ns = start_ns + index * interval_ns // 8  # the producers spread over one interval
    while next_ns < stop_ns:
        delay_ns = next_ns - time.monotonic_ns()
        if delay_ns > 0:
            time.sleep(delay_ns / 1e9)
        sent_ns = time.monotonic_ns()
        raw = template.replace(_STAMP, b"%019d" % sent_ns)
        body = lz4.block.compress(raw, store_size=False)
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                sent += 1
                acked_ms.append((time.monotonic_ns() - sent_ns) / 1e6)
            else:
                errors += 1
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        next_ns += interval_ns
    conn.close()
    out.put((index, sent, errors, acked_ms))


def run_paced(
    port: int, producers: int, logs: int, logs_per_s: float, seconds: float
) -> tuple[int, int, int, int, list[float]]:
    """(start_ns, stop_ns, requests sent, errors, PutLogs latencies in ms) of one load."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start_ns = time.monotonic_ns() + 300_000_000
    stop_ns = start_ns + int(seconds * 1e9)
    rate_each = logs_per_s / logs / producers
    processes = [
        ctx.Process(
            target=_paced_producer,
            args=(port, i, logs, rate_each, start_ns, stop_ns, out),
            daemon=True,
        )
        for i in range(producers)
    ]
    for process in processes:
        process.start()
    sent = errors = 0
    acked_ms: list[float] = []
    try:
        for _ in processes:
            _index, count, failed, latencies = out.get(timeout=seconds + 120)
            sent += count
            errors += failed
            acked_ms += latencies
    finally:
        _stop_processes(processes)
    return start_ns, stop_ns, sent, errors, acked_ms


def _stop_processes(processes: Sequence[Any]) -> None:
    for process in processes:
        process.join(timeout=30)
        if process.is_alive() and process.pid is not None:
            os.kill(process.pid, signal.SIGKILL)
            process.join(timeout=10)


# --- the consumer ---------------------------------------------------------------------------


class _Stamps(ConsumerProcessor):
    """Notes (sent_ns, processed_ns, logs) for each log group."""

    def __init__(self, samples: Any, first: Any) -> None:
        self.samples = samples
        self.first = first

    def process(self, log_groups: Sequence[LogGroup], checkpointer: Checkpointer) -> str | None:
        now_ns = time.monotonic_ns()
        for group in log_groups:
            for content in group.Logs[0].Contents:
                if content.Key == "sent_ns":
                    self.samples.append((int(content.Value), now_ns, len(group.Logs)))
                    break
        self.first.set()
        checkpointer.save()
        return None


def _consumer(port: int, group: str, ready: Any, stop: Any, out: Any) -> None:
    samples: list[tuple[int, int, int]] = []
    config = ConsumerConfig(
        endpoint=f"127.0.0.1:{port}",
        project=PROJECT,
        logstore=LOGSTORE,
        group=group,
        worker_name="latency-0",
        start_position="end",
    )
    worker = ConsumerWorker(lambda: _Stamps(samples, ready), config)
    worker.start()
    stop.wait()
    worker.shutdown()
    out.put(samples)


# --- the run --------------------------------------------------------------------------------


def measure_max(server: ServerChild, producers: int, logs: int, seconds: float) -> float:
    batches = build_batches(64, logs)
    run = run_producers(server, batches, producers, warmup_s=0.5, seconds=seconds)
    if run.errors:
        print(f"  errors while measuring the maximum: {run.errors}")
    return run.total("ok_logs") / run.window_s


def one_run(args: argparse.Namespace, run_index: int) -> dict[float, dict[str, float]]:
    data_dir = make_data_dir(args.data_dir, "loghub-latency-")
    server = ServerChild(data_dir).start()
    ctx = mp.get_context("fork")
    consumer = None
    try:
        create_logstore(server.port, args.shards)
        max_logs_per_s = measure_max(server, args.producers, args.logs_per_request, args.max_s)
        print(f"run {run_index + 1}: maximum {fmt_int(max_logs_per_s)} logs/s")
        ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
        consumer = ctx.Process(
            target=_consumer, args=(server.port, f"latency-{run_index}", ready, stop, out)
        )
        consumer.start()
        deadline = time.monotonic() + 60
        while not ready.is_set():  # warm-up requests until the consumer processes one
            if time.monotonic() > deadline:
                raise RuntimeError("the consumer processed nothing within 60 s")
            run_paced(server.port, 1, args.logs_per_request, 20 * args.logs_per_request, 0.5)
        windows = {}
        for load in LOADS:
            rate = load * max_logs_per_s
            start_ns, stop_ns, sent, errors, acked_ms = run_paced(
                server.port, args.producers, args.logs_per_request, rate, args.seconds
            )
            windows[load] = (start_ns, stop_ns, sent, acked_ms)
            put_p50, put_p99 = percentile(acked_ms, 0.5), percentile(acked_ms, 0.99)
            print(f"  {load:.0%}: {fmt_int(sent * args.logs_per_request / args.seconds)} logs/s"
                  f" sent ({errors} errors); PutLogs acknowledged p50 {put_p50:.1f} ms,"
                  f" p99 {put_p99:.1f} ms")  # fmt: skip
        time.sleep(1.0)  # the last ones reach the consumer
        stop.set()
        samples: list[tuple[int, int, int]] = out.get(timeout=60)
    finally:
        if consumer is not None:
            _stop_processes([consumer])
        server.stop()
        remove_tree(data_dir)
    return {load: _figures(samples, *windows[load]) for load in LOADS}


def _figures(
    samples: list[tuple[int, int, int]],
    start_ns: int,
    stop_ns: int,
    sent: int,
    acked_ms: list[float],
) -> dict[str, float]:
    latencies_ms: list[float] = []
    for sent_ns, processed_ns, logs in samples:
        if start_ns <= sent_ns < stop_ns:
            latencies_ms.extend([(processed_ns - sent_ns) / 1e6] * logs)
    return {
        "p50": percentile(latencies_ms, 0.50),
        "p99": percentile(latencies_ms, 0.99),
        "p99.9": percentile(latencies_ms, 0.999),
        "logs": len(latencies_ms),
        "requests_sent": sent,
        "put_p50": percentile(acked_ms, 0.50),
        "put_p99": percentile(acked_ms, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run of a few seconds")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="per load")
    parser.add_argument("--max-s", type=float, default=3.0, help="to measure the maximum")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--logs-per-request", type=int, default=16)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.seconds, args.max_s, args.producers = 1, 1.0, 1.0, 2
    runs = [one_run(args, index) for index in range(args.runs)]
    rows = []
    print(f"\nproduce-to-processed, {args.logs_per_request} logs/request, {args.shards} shards:")
    print(f"{'load':>6} {'p50 ms':>9} {'p99 ms':>9} {'p99.9 ms':>9}   (median of {len(runs)} runs)")
    for load in LOADS:
        medians = {}
        for name in ("p50", "p99", "p99.9"):
            values = [run[load][name] for run in runs]
            medians[name] = sorted(values)[len(values) // 2]
            goal = "≤ 20 ms" if (load, name) == (0.5, "p99") else ""
            extra = {"logs": [run[load]["logs"] for run in runs],
                     "put_p99_ms": [run[load]["put_p99"] for run in runs]}  # fmt: skip
            rows.append(Row(f"{load:.0%} of the maximum rate", f"{name} ms", values,
                            higher_is_better=False, goal=goal, extra=extra))  # fmt: skip
        print(f"{load:>6.0%} {medians['p50']:>9.1f} {medians['p99']:>9.1f} "
              f"{medians['p99.9']:>9.1f}")  # fmt: skip
    notes = [
        f"{args.producers} paced producer processes, {args.logs_per_request} logs/request, "
        f"{args.shards} shards, fsync always; one ConsumerWorker with default settings",
        "latency = processed - sent, CLOCK_MONOTONIC, per log",
    ]
    # a smoke run saves too (run_all --smoke points the results at a temporary directory)
    print(f"saved {save('latency', 'Produce-to-processed latency', rows, notes)}")


if __name__ == "__main__":
    main()
