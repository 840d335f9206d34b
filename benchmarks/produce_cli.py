"""`loghub produce` from a file: logs per second, end to end, and the client's own ceiling.

Writes a file of JSON lines (web access logs, about 260 bytes a line), starts a fresh
server child, and times `python -m loghub produce bench < file` (process start included).
Then times the client's part alone, in this process: reading the lines, parsing and
building the compressed groups, with no network, which is the ceiling of the command.

    .venv/bin/python benchmarks/produce_cli.py [--logs 1000000] [--batch-size 4096]
                                               [--fsync always|interval] [--data-dir /tmp]

Prints figures; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    LOGSTORE,
    PROJECT,
    REPO_ROOT,
    ServerChild,
    access_log_record,
    create_logstore,
    fmt_int,
    machine_summary,
    make_data_dir,
    remove_tree,
)

from loghub.client.producer import parse_lines  # noqa: E402
from loghub.wire.compression import compress  # noqa: E402


def write_lines(path: Path, count: int) -> int:
    rng = random.Random(7)
    now_s = int(time.time())
    with path.open("w") as out:
        for _ in range(count):
            time_s, record = access_log_record(rng, now_s)
            out.write(json.dumps({**record, "__time__": time_s}) + "\n")
    return path.stat().st_size


def client_ceiling(path: Path, batch_size: int) -> float:
    """Logs/s of parse + build + compress alone, as the command runs them."""
    lines = path.read_bytes().split(b"\n")[:-1]
    started = time.perf_counter()
    for begin in range(0, len(lines), batch_size):
        batch = parse_lines(lines[begin : begin + batch_size], begin + 1, "__time__", 0)
        compress("lz4", batch.group.SerializeToString())
    return len(lines) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--logs", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--fsync", default="always", choices=["always", "interval"])
    parser.add_argument("--data-dir", default=None, help="parent of the temporary data dir")
    args = parser.parse_args()

    print(machine_summary())
    work = make_data_dir(args.data_dir, "loghub-bench-produce-")
    try:
        input_path = work / "logs.jsonl"
        size_bytes = write_lines(input_path, args.logs)
        print(f"input: {fmt_int(args.logs)} lines, {size_bytes / 1e6:.1f} MB")
        server = ServerChild(work / "data", fsync=args.fsync).start()
        try:
            create_logstore(server.port, args.shards)
            env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
            env["PYTHONPATH"] = str(REPO_ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
            command = [
                sys.executable, "-m", "loghub", "produce", LOGSTORE, "--project", PROJECT,
                "--endpoint", f"127.0.0.1:{server.port}", "--batch-size", str(args.batch_size),
            ]  # fmt: skip
            with input_path.open("rb") as stdin:
                started = time.perf_counter()
                result = subprocess.run(
                    command, stdin=stdin, capture_output=True, text=True, env=env, check=False
                )
                elapsed_s = time.perf_counter() - started
            if result.returncode != 0:
                raise RuntimeError(f"produce exited {result.returncode}: {result.stderr}")
            print(f"produce: {result.stderr.strip()}")
            print(
                f"end to end: {fmt_int(args.logs / elapsed_s)} logs/s "
                f"({elapsed_s:.2f} s, {size_bytes / 1e6 / elapsed_s:.1f} MB/s of JSON lines, "
                f"fsync {args.fsync}, {args.shards} shards)"
            )
        finally:
            server.stop()
        ceiling = client_ceiling(input_path, args.batch_size)
        print(f"client alone (parse + build + lz4): {fmt_int(ceiling)} logs/s")
    finally:
        remove_tree(work)


if __name__ == "__main__":
    main()
