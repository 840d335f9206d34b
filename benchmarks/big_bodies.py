"""Memory under large PutLogs bodies: how much the server (with its worker processes) grows.

Several clients at once each send one uncompressed PutLogs body of the given size (by
default six at the 30 MiB limit, the case where the server used to grow by 389-549 MiB).
The script samples the resident memory (VmRSS) of the server and of every child process it
has, every few milliseconds, and prints the sum before the bodies arrive, its peak while they
are handled, the growth, and the status of every request. The growth counts the worker
processes the bodies start (about 30 MiB each); with ``--warm`` one small body starts them
before the baseline is taken, which leaves only what the bodies themselves cost. A request
refused for being over the in-flight bound (503 with Retry-After) is sent again after the
delay it names, as the SDK would, so every body ends up stored.

Run: ``python benchmarks/big_bodies.py [--clients 6] [--body-mib 30] [--runs 1] [--json]``;
``--server-arg`` passes a flag on to ``loghub serve`` (repeatable). With ``--json`` the last
line is a JSON object of the figures (the integration test reads it) and nothing is saved;
otherwise the figures are saved to benchmarks/results/big_bodies.json. ``--smoke`` is a tiny
run that checks the script.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    LOGSTORE,
    PROJECT,
    ServerChild,
    _children_of,
    access_log_record,
    create_logstore,
    load_average,
    make_data_dir,
    remove_tree,
)
from _results import Row, save  # noqa: E402

from loghub.wire.logs import make_log_group  # noqa: E402

MIB = 1024 * 1024


def rss_bytes_of_tree(pid: int) -> int:
    """VmRSS of a process plus that of its live children, from /proc."""
    total = 0
    for process in (pid, *_children_of(pid)):
        try:
            with open(f"/proc/{process}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue  # gone meanwhile
    return total


def build_body(size_bytes: int) -> bytes:
    """One serialized LogGroup of web access logs, a little under `size_bytes`."""
    rng = random.Random(7)
    now_s = int(time.time())
    sample = [access_log_record(rng, now_s) for _ in range(1000)]
    per_log_bytes = len(make_log_group(sample).SerializeToString()) / len(sample)
    records = [access_log_record(rng, now_s) for _ in range(int(size_bytes / per_log_bytes))]
    body = make_log_group(records, topic="big").SerializeToString()
    while len(body) > size_bytes:  # the estimate was short: drop logs until it fits
        records = records[: int(len(records) * size_bytes / len(body)) - 1]
        body = make_log_group(records, topic="big").SerializeToString()
    return body


def put(port: int, body: bytes, statuses: list[str], lock: threading.Lock) -> None:
    """One PutLogs, sent again after Retry-After while the server says it is busy."""
    for _attempt in range(120):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            conn.request(
                "POST",
                f"/logstores/{LOGSTORE}/shards/lb",
                body=body,
                headers={
                    "Host": f"{PROJECT}.127.0.0.1",
                    "Content-Type": "application/x-protobuf",
                    "x-log-apiversion": "0.6.0",
                    "x-log-bodyrawsize": str(len(body)),
                },
            )
            reply = conn.getresponse()
            data = reply.read()
            retry_after = reply.getheader("retry-after")
        except (OSError, http.client.HTTPException) as exc:
            with lock:
                statuses.append(f"error {type(exc).__name__}")
            time.sleep(0.5)
            continue
        finally:
            conn.close()
        with lock:
            statuses.append(str(reply.status))
        if reply.status == 503 and retry_after is not None:
            time.sleep(float(retry_after))
            continue
        if reply.status != 200:
            with lock:
                statuses.append(data[:200].decode(errors="replace"))
        return


def run(
    clients: int, body_mib: float, server_args: tuple[str, ...], warm: bool
) -> dict[str, object]:
    data_dir = make_data_dir(None, "loghub-bigbodies-")
    server = ServerChild(data_dir / "data", extra_args=server_args).start()
    try:
        create_logstore(server.port, 2)
        body = build_body(int(body_mib * MIB))
        if warm:  # one small body first, so that the worker processes exist before the baseline
            put(server.port, build_body(256 * 1024), [], threading.Lock())
        time.sleep(0.5)
        before = rss_bytes_of_tree(server.pid)
        peak = before
        statuses: list[str] = []
        lock = threading.Lock()
        threads = [
            threading.Thread(target=put, args=(server.port, body, statuses, lock))
            for _ in range(clients)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            peak = max(peak, rss_bytes_of_tree(server.pid))
            time.sleep(0.005)
        elapsed_s = time.monotonic() - started
        peak = max(peak, rss_bytes_of_tree(server.pid))
        return {
            "clients": clients,
            "body_bytes": len(body),
            "rss_before_bytes": before,
            "rss_peak_bytes": peak,
            "growth_bytes": peak - before,
            "statuses": statuses,
            "stored": statuses.count("200"),
            "elapsed_s": round(elapsed_s, 2),
            "processes": 1 + len(_children_of(server.pid)),
        }
    finally:
        server.stop()
        remove_tree(data_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--body-mib", type=float, default=30.0)
    parser.add_argument("--server-arg", action="append", default=[])
    parser.add_argument("--warm", action="store_true", help="start the workers first")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=1, help="runs, each on a new server (1)")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.clients, args.body_mib = 2, 0.5
    runs = [run(args.clients, args.body_mib, tuple(args.server_arg), args.warm)]
    for _ in range(max(0, args.runs - 1)):
        runs.append(run(args.clients, args.body_mib, tuple(args.server_arg), args.warm))
    for figures in runs:
        print(
            f"{figures['clients']} clients x {figures['body_bytes'] / MIB:.1f} MiB bodies: "
            f"server + workers {figures['rss_before_bytes'] / MIB:.0f} MiB before, "  # type: ignore[operator]
            f"{figures['rss_peak_bytes'] / MIB:.0f} MiB at peak, "  # type: ignore[operator]
            f"growth {figures['growth_bytes'] / MIB:.0f} MiB; "  # type: ignore[operator]
            f"{figures['stored']} stored in {figures['elapsed_s']} s "
            f"({figures['processes']} processes); replies {figures['statuses']}"
        )
    if args.json:
        print(json.dumps(runs[0]))
        return
    case = f"{args.clients} clients x {args.body_mib:g} MiB uncompressed bodies at once"
    rows = [
        Row(case, "MiB RSS growth", [f["growth_bytes"] / MIB for f in runs],  # type: ignore[operator]
            higher_is_better=False,
            extra={"stored": [f["stored"] for f in runs], "peak_mib": [
                f["rss_peak_bytes"] / MIB for f in runs]}),  # type: ignore[operator]
        Row(case, "s to store all", [float(f["elapsed_s"]) for f in runs],  # type: ignore[arg-type]
            higher_is_better=False),
    ]  # fmt: skip
    notes = [f"server flags: {' '.join(args.server_arg) or '(defaults)'}", load_average()]
    print(f"saved {save('big_bodies', 'Server memory under large bodies', rows, notes)}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
