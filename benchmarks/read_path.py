"""What a catch-up pull costs the server per stored byte and per group, outside HTTP: the
shard log's read of 1,000 groups (up to 16 MiB) at a time, then the reply's compression.

Two reads of the same shard, in this one process, timed as its CPU time (other work on a
shared machine does not count): the server's (the compiled record walk, into a buffer kept
from read to read, as pulls do) and the reference: the pure-Python walk (the fallback where
no C compiler was found) into a new buffer each read. The reference is slower than reads
were before the compiled walk (that loop kept views instead of copying each payload; its
figures are in docs/decisions.md), so it shows what the fallback costs, not the gain.
The process maps large blocks on their own as the server does (``loghub.server.memory``),
so a new buffer is faulted in page by page, as there. Each is timed alone (``read``) and
with the reply's compression (``lz4``; ``none`` is the copy into the reply's own bytes).
Groups are ``--logs`` access logs each, from 16 distinct bodies (so lz4 finds more repeats
than in real traffic; the read figures do not depend on it); the segment is in the page
cache.

    .venv/bin/python benchmarks/read_path.py [--logs 16,4096] [--mb 128] [--runs 5] [--smoke]

Prints figures and saves them to benchmarks/results/read_path.json; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lz4.block

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import build_batches, machine_summary  # noqa: E402
from _results import Reference, Row, save  # noqa: E402

from loghub._clock import SystemClock  # noqa: E402
from loghub.server.memory import return_large_buffers_to_os  # noqa: E402
from loghub.storage import ShardLog, StorageConfig, _gather, segment  # noqa: E402
from loghub.wire.compression import compress  # noqa: E402
from loghub.wire.logs import frame_log_group  # noqa: E402

_PULL_GROUPS = 1000
_PULL_BYTES = 16 * 1024 * 1024


def fill(log: ShardLog, logs_per_group: int, total_bytes: int) -> int:
    """Appends groups of ``logs_per_group`` logs until ``total_bytes``; returns the count."""
    payloads = [
        frame_log_group(lz4.block.decompress(b.body, uncompressed_size=b.raw_size))
        for b in build_batches(16, logs_per_group)
    ]
    count = written = 0
    while written < total_bytes:
        payload = payloads[count % len(payloads)]
        log.append(payload, 1_700_000_000_000)
        written += len(payload)
        count += 1
    return count


def pull_all(log: ShardLog, kept: bool, codec: str | None) -> int:
    """Reads the whole shard as pulls do; returns the bytes read."""
    buffer = bytearray()
    seq = total = 0
    while seq < log.end_seq:
        if kept:
            read = log.read_into(buffer, seq, _PULL_GROUPS, _PULL_BYTES)
            size, seq = read.size_bytes, read.next_seq
            if codec is not None:
                with memoryview(buffer) as view, view[:size] as data:
                    compress(codec, data)
        else:
            batch = log.read(seq, _PULL_GROUPS, _PULL_BYTES)
            size, seq = len(batch.data), batch.next_seq
            if codec is not None:
                compress(codec, batch.data)
        total += size
    return total


def timed(log: ShardLog, kept: bool, codec: str | None) -> tuple[float, int]:
    """The CPU seconds of one whole read of the shard, and the bytes it read."""
    started = time.process_time()
    size = pull_all(log, kept, codec)
    return time.process_time() - started, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", default="16,4096", help="logs per group, comma-separated")
    parser.add_argument("--mb", type=int, default=128, help="MB stored per case (128)")
    parser.add_argument("--runs", type=int, default=5, help="timings of each case (5)")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.logs, args.mb, args.runs = "16", 1, 1
    return_large_buffers_to_os()
    print(machine_summary(), f"; record walk: {_gather.IMPLEMENTATION}")
    rows: list[Row] = []
    compiled_gather = segment.gather
    for logs_per_group in [int(n) for n in args.logs.split(",")]:
        with tempfile.TemporaryDirectory(prefix="loghub-bench-read-") as directory:
            config = StorageConfig(fsync_policy="interval")
            log = ShardLog.open(Path(directory), config, SystemClock())
            try:
                groups = fill(log, logs_per_group, args.mb * 1_000_000)
                for codec in (None, "lz4", ""):
                    label = "read" if codec is None else codec or "none"
                    figures: dict[str, list[float]] = {"server": [], "fallback": []}
                    size = 0
                    for _run in range(args.runs + 1):  # interleaved; the first is a warm-up
                        for name in figures:
                            segment.gather = (  # type: ignore[assignment]
                                compiled_gather if name == "server" else _gather.gather_python
                            )
                            seconds, size = timed(log, name == "server", codec)
                            if _run:
                                figures[name].append(seconds / size * 1e9)
                    segment.gather = compiled_gather  # type: ignore[assignment]
                    per_group = {
                        k: statistics.median(v) * size / groups / 1e3 for k, v in figures.items()
                    }
                    print(
                        f"{logs_per_group:>5} logs/group, {label:>4}: "
                        f"{statistics.median(figures['server']):.2f} ns/B "
                        f"({per_group['server']:.1f} us/group); pure-Python walk, new buffers "
                        f"{statistics.median(figures['fallback']):.2f} ns/B "
                        f"({per_group['fallback']:.1f} us/group)"
                    )
                    rows.append(
                        Row(
                            f"{logs_per_group} logs a group, {label}",
                            "CPU ns/byte",
                            figures["server"],
                            reference=Reference(
                                "pure-Python walk, a new buffer each read", figures["fallback"]
                            ),
                            higher_is_better=False,
                            extra={"us_per_group": per_group["server"], "groups": groups},
                        )
                    )
            finally:
                log.close()
    path = save(
        "read_path",
        "Read path of a catch-up pull, CPU per byte",
        rows,
        notes=["one process, its CPU time; the segment in the page cache"],
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
