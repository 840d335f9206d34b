"""The `loghub` Spark source against Parquet, in one local Spark session.

Starts a `loghub serve` child on a fresh data directory, loads ``--logs`` web access logs
(lz4 PutLogs of ``--group-logs`` logs each, all distinct unless ``--distinct-groups`` says
otherwise, spread over ``--shards`` shards), then, in one SparkSession (``--master``, default
local[2]):

1. the rows written to Parquet once (through a batch read of the source);
2. ``--passes`` rounds (after ``--warmup-passes`` rounds that are not measured: a JVM's first
   passes over a path time its JIT compiling it), each of three reads into the ``noop`` sink,
   one after the other so that all meet a JVM warmed up alike (its JIT keeps improving for
   minutes, and whichever read ran after all of the other's passes would get the warmer JVM):
   - streaming read: ``readStream.format("loghub")`` from earliest with Trigger.AvailableNow
     (``--max-groups`` groups a micro-batch, default all in one), each pass a new query, after
     a small warm-up query; rows/s of the best over the batches' ``triggerExecution`` time,
     and over the wall time from ``start()`` to the end (which adds query start-up); and the
     CPU time a row of the server, the JVM and the Python processes (the latter includes the
     processes each new query starts);
   - batch read: ``spark.read.format("loghub")``, every shard from earliest to latest, the
     same kind of job as the Parquet read, which is what the goal compares (a micro-batch adds
     Spark's own offset and commit log writes, about 0.1 s each here); rows/s of the best;
   - ``spark.read.parquet(...)``; rows/s of the best;
3. micro-batch latency: a query with a one-second trigger from ``latest`` while this process
   appends ``--rate`` logs/s for ``--seconds``; the median, p90 and max ``triggerExecution``
   of the batches that read data, and the end-to-end delay (append to end of the batch that
   delivered it) estimated from the batches' start times.

Both reads materialize every column of the source's schema (the noop sink consumes whole
rows), and the Parquet file holds exactly the rows the source produced. The session reaches its
Python workers over Unix sockets, as docs/spark.md advises (``--python-sockets tcp``: Spark's
default, loopback TCP, where each task waits about 40 ms).

    .venv/bin/python benchmarks/spark_source.py [--logs 1000000] [--shards 4] [--master local[2]]

Prints figures and saves them (``benchmarks/results/spark_source.json``: rows/s of every
pass with Parquet's as the reference); asserts nothing about them. ``--smoke`` is a tiny run
that only checks the benchmark still works (nothing saved).
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    LOGSTORE,
    PROJECT,
    Batch,
    ServerChild,
    build_batches,
    cpu_times_of,
    create_logstore,
    fmt_int,
    machine_summary,
    make_data_dir,
    percentile,
    remove_tree,
)
from _results import Reference, Row, save  # noqa: E402

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def _put_headers(batch: Batch) -> dict[str, str]:
    return {
        "Host": f"{PROJECT}.127.0.0.1",
        "Content-Type": "application/x-protobuf",
        "x-log-apiversion": "0.6.0",
        "x-log-compresstype": "lz4",
        "x-log-bodyrawsize": str(batch.raw_size),
    }


def load(port: int, batches: list[Batch], logs: int) -> int:
    """Sends bodies round robin until ``logs`` logs are stored; returns the count sent."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    sent = 0
    try:
        index = 0
        while sent < logs:
            batch = batches[index % len(batches)]
            conn.request(
                "POST", f"/logstores/{LOGSTORE}/shards/lb", batch.body, _put_headers(batch)
            )
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"PutLogs answered {response.status}: {body[:300]!r}")
            sent += batch.logs
            index += 1
    finally:
        conn.close()
    return sent


def spark_session(master: str, unix_sockets: bool = True) -> Any:
    from pyspark.sql import SparkSession

    import loghub.spark

    spark = (
        SparkSession.builder.master(master)
        .appName("loghub-spark-source-benchmark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        # as docs/spark.md advises for Python data sources (Parquet has no Python workers)
        .config("spark.python.unix.domain.socket.enabled", "true" if unix_sockets else "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    loghub.spark.register(spark)
    return spark


def stream_to_noop(
    spark: Any, options: dict[str, str], checkpoint: Path, max_groups: int | None
) -> dict[str, Any]:
    reader = spark.readStream.format("loghub").options(**options)
    if max_groups:
        reader = reader.option("maxOffsetsPerTrigger", str(max_groups))
    started = time.perf_counter()
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
        wall_s = time.perf_counter() - started
        batches = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    rows = sum(p["numInputRows"] for p in batches)
    batch_s = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
    return {"rows": rows, "batches": len(batches), "batch_s": batch_s, "wall_s": wall_s}


def tree_cpu_s(server_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of the server, the Spark JVM, and the Python
    processes below the JVM (workers and the source runner; exited ones are counted through
    their parents' reaped-children times). This process is not counted."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    totals = {"server": _own_cpu_s(server_pid), "jvm": 0.0, "python": 0.0}
    for jvm in (p for p in children.get(os.getpid(), []) if p != server_pid):
        totals["jvm"] += _own_cpu_s(jvm, reaped=False)
        pending = list(children.get(jvm, []))
        totals["python"] += _reaped_children_s(jvm)
        while pending:
            pid = pending.pop()
            totals["python"] += _own_cpu_s(pid)
            pending.extend(children.get(pid, []))
    return totals


def _own_cpu_s(pid: int, reaped: bool = True) -> float:
    try:
        user, system = cpu_times_of(pid)
    except OSError:
        return 0.0  # exited meanwhile
    return user + system + (_reaped_children_s(pid) if reaped else 0.0)


def _cpu_per_row(before: dict[str, float], after: dict[str, float], rows: int) -> str:
    parts = {name: (after[name] - before[name]) / rows * 1e6 for name in before}
    detail = ", ".join(f"{name} {value:.1f}" for name, value in parts.items())
    return f"{sum(parts.values()):.1f} us ({detail})"


def _reaped_children_s(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def _last_groups(options: dict[str, str], groups: int) -> str:
    """startingOffsets JSON for the last ``groups`` groups of every shard."""
    import json

    from loghub.client import LogHubClient
    from loghub.wire.cursor import decode_cursor

    with LogHubClient(options["endpoint"]) as client:
        ends = {
            s.shard_id: decode_cursor(client.get_cursor(PROJECT, LOGSTORE, s.shard_id, "end"))
            for s in client.list_shards(PROJECT, LOGSTORE)
        }
    return json.dumps({str(k): max(0, v - groups) for k, v in ends.items()})


def noop_seconds(frame: Any) -> float:
    """Seconds of one batch job writing ``frame`` into the ``noop`` sink: a batch read of the
    source and a Parquet read are timed alike."""
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def latency_run(
    spark: Any,
    options: dict[str, str],
    checkpoint: Path,
    port: int,
    batches: list[Batch],
    rate: int,
    seconds: float,
) -> dict[str, Any]:
    """A one-second-trigger query while logs arrive at ``rate`` logs/s."""
    query = (
        spark.readStream.format("loghub")
        .options(**{**options, "startingOffsets": "latest"})
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )
    appended: list[tuple[float, int]] = []  # (wall time, logs)
    stop = threading.Event()
    small = [b for b in batches if b.logs <= rate] or batches

    def produce() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        interval_s = small[0].logs / rate
        index = 0
        next_s = time.time()
        try:
            while not stop.is_set():
                batch = small[index % len(small)]
                conn.request(
                    "POST", f"/logstores/{LOGSTORE}/shards/lb", batch.body, _put_headers(batch)
                )
                conn.getresponse().read()
                appended.append((time.time(), batch.logs))
                index += 1
                next_s += interval_s
                stop.wait(max(0.0, next_s - time.time()))
        finally:
            conn.close()

    try:
        time.sleep(8)  # let the query start and its first (empty) batches pass
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        time.sleep(seconds)
        stop.set()
        producer.join()
        time.sleep(3)  # the last appends reach a batch
        progress = list(query.recentProgress)
    finally:
        query.stop()
    with_data = [p for p in progress if p["numInputRows"]]
    durations_ms = [float(p["durationMs"]["triggerExecution"]) for p in with_data]
    return {
        "batches": len(with_data),
        "rows": sum(p["numInputRows"] for p in with_data),
        "appended": sum(n for _, n in appended),
        "durations_ms": durations_ms,
        "delays_s": _delivery_delays(appended, with_data),
    }


def _delivery_delays(
    appended: list[tuple[float, int]], progress: list[dict[str, Any]]
) -> list[float]:
    """For each append: the end of the first batch that started after it, minus its time (a
    batch reads what was stored when it started planning)."""
    from datetime import datetime

    ends = []
    for p in progress:
        start_s = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        ends.append((start_s, start_s + p["durationMs"]["triggerExecution"] / 1000))
    delays = []
    for appended_s, _logs in appended:
        later = [end for start, end in ends if start >= appended_s]
        if later:
            delays.append(min(later) - appended_s)
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--logs", type=int, default=1_000_000)
    parser.add_argument("--group-logs", type=int, default=1000, help="logs per log group")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument(
        "--distinct-groups",
        type=int,
        default=0,
        help="distinct log groups, sent round robin (default: every group distinct)",
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--max-groups", type=int, default=0, help="maxOffsetsPerTrigger")
    parser.add_argument("--passes", type=int, default=4, help="passes of each read")
    parser.add_argument(
        "--warmup-passes", type=int, default=3, help="unmeasured passes before the passes"
    )
    parser.add_argument("--rate", type=int, default=2000, help="logs/s in the latency run")
    parser.add_argument("--seconds", type=float, default=30, help="length of the latency run")
    parser.add_argument(
        "--python-sockets",
        choices=("unix", "tcp"),
        default="unix",
        help="how Spark reaches its Python workers (spark.python.unix.domain.socket.enabled)",
    )
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--smoke", action="store_true", help="a tiny run that only checks")
    args = parser.parse_args()
    if args.smoke:
        args.logs, args.group_logs, args.passes, args.seconds = 2000, 100, 1, 0
        args.warmup_passes = 0

    print(
        f"machine: {machine_summary()}; Spark master {args.master}; Python workers over "
        f"{args.python_sockets} sockets"
    )
    data_dir = make_data_dir(args.data_dir, "loghub-spark-bench-")
    server = ServerChild(data_dir / "server", fsync="interval")
    try:
        server.start()
        create_logstore(server.port, args.shards)
        distinct = args.distinct_groups or -(-args.logs // args.group_logs)
        started = time.perf_counter()
        batches = build_batches(distinct, args.group_logs)
        print(f"built {distinct} distinct log groups in {time.perf_counter() - started:.1f} s")
        small = build_batches(8, 100, seed=7)
        started = time.perf_counter()
        loaded = load(server.port, batches, args.logs)
        print(
            f"loaded {fmt_int(loaded)} logs ({args.group_logs} a group, {args.shards} shards) "
            f"in {time.perf_counter() - started:.1f} s"
        )
        run(args, server, data_dir, small)
    finally:
        server.stop()
        remove_tree(data_dir / "server")
        shutil.rmtree(data_dir, ignore_errors=True)


def run(args: argparse.Namespace, server: ServerChild, data_dir: Path, small: list[Batch]) -> None:
    started = time.perf_counter()
    spark = spark_session(args.master, unix_sockets=args.python_sockets == "unix")
    print(f"SparkSession in {time.perf_counter() - started:.1f} s")
    options = {
        "endpoint": f"127.0.0.1:{server.port}",
        "project": PROJECT,
        "logstore": LOGSTORE,
        "startingOffsets": "earliest",
    }
    try:
        for index in range(2):  # the second one shows the fixed cost of a query
            before = tree_cpu_s(server.pid)
            warm = stream_to_noop(
                spark, {**options, "startingOffsets": _last_groups(options, 2)},
                data_dir / f"warmup-checkpoint-{index}", max_groups=None,
            )  # fmt: skip
            after = tree_cpu_s(server.pid)
            print(
                f"warm-up query {index} (the last 2 groups of each shard): "
                f"{fmt_int(warm['rows'])} rows in {warm['wall_s']:.1f} s, CPU "
                + ", ".join(f"{k} {after[k] - before[k]:.1f} s" for k in before)
            )
        # Parquet of the same rows first, so that the passes of the two reads can alternate:
        # the JVM's JIT keeps improving for minutes, and whichever read ran second would get
        # the warmer JVM.
        parquet = data_dir / "parquet"
        spark.read.format("loghub").options(**options).load().write.parquet(str(parquet))
        size_mb = sum(f.stat().st_size for f in parquet.rglob("*.parquet")) / 1e6
        rows = spark.read.parquet(str(parquet)).count()
        # Unmeasured rounds first: a JVM's first passes over a path time its JIT compiling
        # that path (Parquet's first pass ran at 2 to 4 times its later ones, and the median of
        # 10 passes swung with how many of them were still compiling).
        for index in range(args.warmup_passes):
            stream_to_noop(
                spark, options, data_dir / f"warmup-pass-{index}", args.max_groups or None
            )
            warm_batch = noop_seconds(spark.read.format("loghub").options(**options).load())
            warm_parquet = noop_seconds(spark.read.parquet(str(parquet)))
            print(
                f"  warm-up pass {index}: loghub batch {warm_batch:.2f} s; "
                f"parquet {warm_parquet:.2f} s"
            )
        streams, seconds, batch_seconds = [], [], []
        parquet_cpu_s = {"server": 0.0, "jvm": 0.0, "python": 0.0}
        for index in range(args.passes):
            before = tree_cpu_s(server.pid)
            stream = stream_to_noop(
                spark, options, data_dir / f"checkpoint-{index}", args.max_groups or None
            )
            stream["cpu"] = _cpu_per_row(before, tree_cpu_s(server.pid), stream["rows"])
            streams.append(stream)
            batch_seconds.append(
                noop_seconds(spark.read.format("loghub").options(**options).load())
            )
            before = tree_cpu_s(server.pid)
            seconds.append(noop_seconds(spark.read.parquet(str(parquet))))
            after = tree_cpu_s(server.pid)
            for name in parquet_cpu_s:
                parquet_cpu_s[name] += after[name] - before[name]
        stream = min(streams, key=lambda s: s["batch_s"])
        loghub_rate = stream["rows"] / stream["batch_s"]
        passes = ", ".join(f"{s['batch_s']:.2f}" for s in streams)
        for index, one in enumerate(streams):
            print(
                f"  pass {index}: loghub streaming {one['batch_s']:.2f} s, CPU a row "
                f"{one['cpu']}; loghub batch {batch_seconds[index]:.2f} s; "
                f"parquet {seconds[index]:.2f} s"
            )
        print(
            f"loghub streaming read: {fmt_int(stream['rows'])} rows in {stream['batches']} "
            f"micro-batch(es); passes {passes} s of batches: best {fmt_int(loghub_rate)} "
            f"rows/s (wall with query start {fmt_int(stream['rows'] / stream['wall_s'])} "
            f"rows/s); CPU a row: {stream['cpu']}"
        )
        parquet_cpu = _cpu_per_row(
            {name: 0.0 for name in parquet_cpu_s}, parquet_cpu_s, args.passes * rows
        )
        parquet_rate = rows / min(seconds)
        print(
            f"spark.read.parquet: {fmt_int(rows)} rows ({size_mb:.0f} MB), passes "
            f"{', '.join(f'{s:.2f}' for s in seconds)} s: best {fmt_int(parquet_rate)} rows/s; "
            f"CPU a row: {parquet_cpu}"
        )
        batch_rate = rows / min(batch_seconds)
        print(
            f"loghub batch read: passes {', '.join(f'{s:.2f}' for s in batch_seconds)} s: best "
            f"{fmt_int(batch_rate)} rows/s"
        )
        print(
            f"loghub / parquet: batch read {batch_rate / parquet_rate:.2f}, "
            f"streaming read {loghub_rate / parquet_rate:.2f}"
        )
        rows_saved = [
            Row(
                f"batch read, {args.group_logs} logs a group, {args.shards} shards",
                "rows/s",
                [rows / s for s in batch_seconds],
                reference=Reference("spark.read.parquet", [rows / s for s in seconds]),
                goal="≥ 0.8× spark.read.parquet",
            ),
            Row(
                f"streaming read, {args.group_logs} logs a group, {args.shards} shards",
                "rows/s",
                [one["rows"] / one["batch_s"] for one in streams],
                reference=Reference("spark.read.parquet", [rows / s for s in seconds]),
                goal="",
                # CPU a row holds better than wall time on a machine shared with other work
                extra={"cpu_a_row": stream["cpu"], "cpu_a_row_parquet": parquet_cpu},
            ),
        ]
        if args.seconds <= 0:
            _save(args, rows_saved)
            return
        latency = latency_run(
            spark, options, data_dir / "latency-checkpoint", server.port, small,
            args.rate, args.seconds,
        )  # fmt: skip
        durations = latency["durations_ms"]
        delays = latency["delays_s"]
        print(
            f"1 s trigger, {args.rate} logs/s appended for {args.seconds:.0f} s: "
            f"{latency['batches']} batches read {fmt_int(latency['rows'])} of "
            f"{fmt_int(latency['appended'])} logs; batch duration median "
            f"{percentile(durations, 0.5):.0f} ms, p90 {percentile(durations, 0.9):.0f} ms, "
            f"max {max(durations, default=float('nan')):.0f} ms; append to delivered median "
            f"{percentile(delays, 0.5):.2f} s, p90 {percentile(delays, 0.9):.2f} s"
        )
        rows_saved.append(
            Row(
                f"1 s trigger, {args.rate} logs/s appended",
                "batch ms (median)",
                [percentile(durations, 0.5)],
                higher_is_better=False,
            )
        )
        _save(args, rows_saved)
    finally:
        spark.stop()


def _save(args: argparse.Namespace, rows: list[Row]) -> None:
    # a smoke run saves too (run_all --smoke points the results at a temporary directory)
    notes = [
        f"{args.logs} logs, Spark master {args.master}, {args.passes} passes after "
        f"{args.warmup_passes} unmeasured ones; the reads alternate, so each meets the JVM "
        "warmed up alike",
        f"Python workers over {args.python_sockets} sockets "
        "(spark.python.unix.domain.socket.enabled; see docs/spark.md)",
        "the goal is on the batch read, the same kind of job as spark.read.parquet; a "
        "streaming micro-batch adds Spark's offset and commit log writes",
    ]
    print(f"saved {save('spark_source', 'Spark source against Parquet', rows, notes)}")


if __name__ == "__main__":
    if "--smoke" in sys.argv:  # a tiny run that checks the script (later flags win)
        sys.argv.remove("--smoke")
        sys.argv += ["--logs", "2000", "--passes", "1", "--seconds", "3", "--rate", "500"]
    main()
