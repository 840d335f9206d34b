"""The check of a PutLogs body, in nanoseconds per log: the compiled one-pass walk, its
pure-Python fallback, and the protobuf parse with its required-field check that it replaced.

The body is one LogGroup of web access logs of about 200 bytes each (4,096 logs, about
0.9 MB: a typical SDK batch), already decompressed: decompression is the same for all three.
Each case is timed over several runs in this one process, one core, as the CPU time of the
thread (so that other work on a shared machine does not count; the walk does no I/O and
never waits), and the protobuf parse is the reference of the other two (a ratio under 1 is
faster). Goal: at most 100 ns a log compiled.

Run: ``python benchmarks/validate.py [--logs 4096] [--runs 7] [--smoke]``. Prints the figures
and saves them to benchmarks/results/validate.json.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import access_log_record, machine_summary  # noqa: E402
from _results import Reference, Row, save  # noqa: E402

from loghub.wire import logcheck  # noqa: E402
from loghub.wire.logs import make_log_group, parse_log_group  # noqa: E402


def protobuf_check(raw: bytes) -> int:
    """The check as the server made it before: parse (upb), then the required fields."""
    return len(parse_log_group(raw).Logs)


def ns_per_log(check: Callable[[bytes], object], raw: bytes, logs: int, seconds: float) -> float:
    """One timing of at least ``seconds`` of the thread's CPU time, in ns per log."""
    loops = 1
    while True:
        started = time.thread_time()
        for _ in range(loops):
            check(raw)
        took = time.thread_time() - started
        if took >= seconds:
            return took / loops / logs * 1e9
        loops *= 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", type=int, default=4096, help="logs in the group")
    parser.add_argument("--runs", type=int, default=7, help="timings of each case")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script")
    args = parser.parse_args()
    seconds = 0.2
    if args.smoke:
        args.logs, args.runs, seconds = 64, 1, 0.001

    rng = random.Random(42)
    records = [access_log_record(rng, 1_700_000_000) for _ in range(args.logs)]
    raw = make_log_group(records, topic="bench", source="10.0.0.1").SerializeToString()
    compiled = logcheck.count_logs if logcheck.IMPLEMENTATION == "compiled" else None
    cases: dict[str, Callable[[bytes], object] | None] = {
        "protobuf parse + required fields": protobuf_check,
        "compiled walk": compiled,
        "pure-Python walk": logcheck.scan_python,
    }
    for name, check in cases.items():
        if check is not None:
            assert check(raw) in (args.logs, (logcheck.OK, args.logs, 0, 0)), name

    print(machine_summary())
    print(f"one LogGroup of {args.logs} logs, {len(raw) / args.logs:.0f} B a log, {len(raw)} B")
    figures: dict[str, list[float]] = {name: [] for name, check in cases.items() if check}
    for _run in range(args.runs):  # interleaved, so that a noisy moment hits every case
        for name in figures:
            check = cases[name]
            assert check is not None
            figures[name].append(ns_per_log(check, raw, args.logs, seconds))
    for name, values in figures.items():
        print(f"  {name:34s} {statistics.median(values):9.1f} ns/log (best {min(values):.1f})")
    if compiled is None:
        print("  the compiled walk was not built (python setup.py build_ext --inplace)")

    reference_name = "protobuf parse + required fields"
    reference = Reference(reference_name, figures.pop(reference_name))
    rows = [
        Row(
            f"{name}, {args.logs} logs of {len(raw) // args.logs} B",
            "ns/log",
            values,
            reference=reference,
            higher_is_better=False,
            goal="≤ 100 ns/log" if name == "compiled walk" else "",
        )
        for name, values in figures.items()
    ]
    rows.append(
        Row(
            f"{reference_name}, {args.logs} logs of {len(raw) // args.logs} B",
            "ns/log",
            reference.values,
            higher_is_better=False,
        )
    )
    path = save(
        "validate",
        "PutLogs body check",
        rows,
        notes=[
            "one core, one process, CPU time of the thread; the body already decompressed",
            "ratio: time over the protobuf parse's (lower is better)",
        ],
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
