"""Where the server's CPU goes while ingesting: the ingest benchmark against an in-process
server under cProfile, timed by per-thread CPU time (``time.thread_time``).

The server (the same app and uvicorn settings as `loghub serve`) runs in a thread of this
process with a profiler on its event-loop thread; every PutLogs handed to a storage thread
runs under that thread's own profiler. Producers are separate processes, as in ingest.py.
Also times the per-batch pieces of a PutLogs in isolation (decompress, parse, checks).

    .venv/bin/python benchmarks/profile_ingest.py [--seconds 10] [--top 25]
                                                  [--what-if no-init-check|shallow-parse]

``--what-if`` swaps, in this process only, the server's ``parse_log_group`` for a cheaper
check, to show what ingest would reach without it: ``no-init-check`` parses but skips
``FindInitializationErrors``; ``shallow-parse`` parses only the LogGroup's top level (each
Log as bytes), so nothing inside a Log is checked. Neither is safe as is; both are
measurements. ``--no-profile`` runs without cProfile for a clean rate.

cProfile inflates pure-Python code (per-call overhead), so read the ranking, not the total.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    Batch,
    build_batches,
    create_logstore,
    fmt_int,
    free_port,
    make_data_dir,
    mb,
    remove_tree,
    run_producers,
)

from loghub.server.app import build_app  # noqa: E402
from loghub.server.config import ServerConfig  # noqa: E402


class _InProcess:
    """What run_producers needs of a server: its port and the PID whose CPU to read."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.pid = os.getpid()


def _components(batch: Batch, repeat: int = 40) -> list[tuple[str, float]]:
    """Milliseconds per batch of each step of PutLogs, alone on one core."""
    import crc32c

    from loghub.storage.segment import encode_header
    from loghub.wire.compression import decompress
    from loghub.wire.logs import frame_log_group, parse_log_group
    from loghub.wire.proto import LogGroup

    raw = decompress("lz4", batch.body, batch.raw_size, 1 << 30)
    parsed = parse_log_group(raw)
    framed = frame_log_group(raw)

    def parse_only() -> None:
        LogGroup().ParseFromString(raw)

    steps: list[tuple[str, Callable[[], object]]] = [
        ("lz4 decompress", lambda: decompress("lz4", batch.body, batch.raw_size, 1 << 30)),
        ("parse_log_group (upb parse + required-field check)", lambda: parse_log_group(raw)),
        ("  of which ParseFromString alone", parse_only),
        (
            "  of which FindInitializationErrors (on a parsed group)",
            parsed.FindInitializationErrors,
        ),
        ("frame_log_group (one copy)", lambda: frame_log_group(raw)),
        ("crc32c of the record", lambda: crc32c.crc32c(framed)),
        ("encode_header (crc32c included)", lambda: encode_header(1, 1, framed, 0)),
    ]
    results = []
    for name, step in steps:
        step()
        started = time.perf_counter()
        for _ in range(repeat):
            step()
        results.append((name, (time.perf_counter() - started) / repeat * 1e3))
    return results


def _shallow_parser() -> Callable[[bytes], Any]:
    """A parser of LogGroup's top level only: Logs and LogTags stay undecoded bytes."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="bench_shallow.proto", package="bench_shallow", syntax="proto2"
    )
    message = file.message_type.add(name="LogGroup")
    for number, name, label in (
        (1, "Logs", field.LABEL_REPEATED),
        (2, "Reserved", field.LABEL_OPTIONAL),
        (3, "Topic", field.LABEL_OPTIONAL),
        (4, "Source", field.LABEL_OPTIONAL),
        (5, "MachineUUID", field.LABEL_OPTIONAL),
        (6, "LogTags", field.LABEL_REPEATED),
    ):
        message.field.add(name=name, number=number, type=field.TYPE_BYTES, label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    shallow_class = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("bench_shallow.LogGroup")
    )

    def parse(raw: bytes) -> Any:
        group = shallow_class()
        group.ParseFromString(raw)
        return group

    return parse


def _apply_what_if(what_if: str | None) -> None:
    import loghub.server.service as service_module
    from loghub.wire.proto import LogGroup

    if what_if == "no-init-check":

        def parse(raw: bytes) -> Any:
            group = LogGroup()
            group.ParseFromString(raw)
            return group

        service_module.parse_log_group = parse  # type: ignore[assignment]
    elif what_if == "shallow-parse":
        service_module.parse_log_group = _shallow_parser()  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch-logs", type=int, default=4096)
    parser.add_argument("--fsync", choices=("always", "interval"), default="always")
    parser.add_argument("--top", type=int, default=25, help="functions listed (25)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--what-if", choices=("no-init-check", "shallow-parse"), default=None)
    parser.add_argument("--no-profile", action="store_true", help="measure without cProfile")
    args = parser.parse_args()
    _apply_what_if(args.what_if)

    batches = build_batches(16, args.batch_logs)
    print(f"PutLogs steps alone, per batch of {args.batch_logs} logs "
          f"({batches[0].raw_size / 1024:.0f} KiB raw):")  # fmt: skip
    for name, ms in _components(batches[0]):
        print(f"  {name:58s} {ms:7.3f} ms  ({1e6 * ms / args.batch_logs:6.0f} ns/log)")

    data_dir = make_data_dir(args.data_dir, "loghub-bench-profile-")
    config = ServerConfig(data_dir=data_dir / "server", port=free_port(), fsync_policy=args.fsync)
    config.data_dir.mkdir()
    app = build_app(config)
    profilers: list[cProfile.Profile] = []
    profilers_lock = threading.Lock()
    local = threading.local()

    def profiled(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any) -> Any:
            profiler = getattr(local, "profiler", None)
            if profiler is None:
                profiler = local.profiler = cProfile.Profile(time.thread_time)
                with profilers_lock:
                    profilers.append(profiler)
            profiler.enable()
            try:
                return fn(*a)
            finally:
                profiler.disable()

        return wrapper

    if not args.no_profile:
        app.service.put_logs = profiled(app.service.put_logs)  # type: ignore[method-assign]
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=config.port, loop="uvloop", http="httptools",
            lifespan="on", access_log=False, log_level="warning", timeout_keep_alive=120,
        )
    )  # fmt: skip
    loop_profiler = cProfile.Profile(time.thread_time)
    loop_cpu: list[float] = []

    def run_server() -> None:
        if not args.no_profile:
            loop_profiler.enable()
        started = time.thread_time()
        try:
            server.run()
        finally:
            loop_profiler.disable()
            loop_cpu.append(time.thread_time() - started)

    thread = threading.Thread(target=run_server, name="loghub-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        create_logstore(config.port, args.shards)
        run = run_producers(
            _InProcess(config.port), batches, args.producers, warmup_s=2.0, seconds=args.seconds
        )  # type: ignore[arg-type]
        logs = run.total("ok_logs")
        print(
            f"\n{'without' if args.no_profile else 'under'} the profiler"
            f"{', what-if ' + args.what_if if args.what_if else ''}, {args.producers} producers: "
            f"{fmt_int(logs / run.window_s)} logs/s, "
            f"{mb(run.total('ok_raw_bytes')) / run.window_s:.1f} MB/s raw, "
            f"process CPU {run.server_cpu_s:.1f} s in {run.window_s:.0f} s, errors {run.errors}"
        )
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        remove_tree(data_dir)

    if args.no_profile:
        return
    storage = pstats.Stats(*profilers) if profilers else None
    loop_stats = pstats.Stats(loop_profiler)
    storage_cpu = storage.total_tt if storage else 0.0  # type: ignore[attr-defined]
    print(
        f"CPU by thread kind (thread_time, profiled): event loop "
        f"{loop_cpu[0] if loop_cpu else 0:.1f}"
        f" s; storage threads in put_logs {storage_cpu:.1f} s ({len(profilers)} threads)"
    )
    for title, stats in (("storage threads (put_logs)", storage), ("event loop", loop_stats)):
        if stats is None:
            continue
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(args.top)
        lines = out.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if "ncalls" in line)
        print(f"\n--- {title}: top {args.top} by own CPU time ---")
        print("\n".join(line for line in lines[start:] if line.strip()))


if __name__ == "__main__":
    main()
