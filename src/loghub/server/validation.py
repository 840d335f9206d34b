"""Checking PutLogs bodies, on every core.

A PutLogs body is stored as received, but first it must be proven a complete LogGroup:
decompressed to the size it claims, parsed, every required field present (other clients,
the Java and Go SDKs among them, refuse a whole pull reply that holds one incomplete group).
The protobuf parse and its required-field check hold the GIL, and for a batch of 4096 logs
they take a few milliseconds: in the server process they would cap ingest at what one core
can check (benchmarks/profile_ingest.py measured about half of the server's CPU there).

So large bodies are checked in worker processes (`parse_processes`, default: one per core),
while the server process does HTTP, decompresses again (lz4 and zstd release the GIL) and
writes. Small bodies, where the round trip to a worker costs more than the check, are checked
in place. A worker that dies is replaced and the body is checked in place, so a crash of a
worker costs a request nothing.

A large body is parsed a slice at a time: its top-level fields are walked (tag, length,
skip) and each run of about ``_SLICE_BYTES`` of whole fields is parsed on its own. A run of
whole fields of a LogGroup is itself a LogGroup, and every Log sits inside one field, so the
verdict and the count are those of parsing it whole; but the parsed objects, which take
about three times the body, are held for one slice instead of 30 MiB (98 MiB for a 30 MiB
body, measured).

Workers die with the server: each asks the kernel for SIGKILL when its parent goes
(``PR_SET_PDEATHSIG``) and, in case the parent went before it asked or the kernel's notion
of parent (the spawning thread) ends first, a watchdog thread checks the parent's pid every
``_PARENT_CHECK_INTERVAL_S``. A SIGKILLed server therefore leaves no worker behind.

Thread-safety: ``check`` may be called from many threads at once.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from loghub.errors import PostBodyInvalid, PostBodyTooLarge
from loghub.server.config import Limits
from loghub.server.memory import return_large_buffers_to_os
from loghub.wire.compression import decompress
from loghub.wire.logs import parse_log_group

__all__ = ["BodyChecker", "check_log_group", "count_logs"]

log = logging.getLogger("loghub.server")


def check_log_group(
    compress_type: str | None, body: bytes, raw_size: int | None, limits: Limits
) -> int:
    """Proves `body` a complete, non-empty LogGroup within the limits; returns its log count.
    Raises PostBodyInvalid, PostBodyTooLarge or InvalidCompressType."""
    return _check_raw(decompress(compress_type, body, raw_size, limits.raw_body_bytes_max), limits)


_SLICE_BYTES = 1024 * 1024
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_PARENT_CHECK_INTERVAL_S = 0.5


def _die_with_parent(parent_pid: int) -> None:
    """Worker initializer: the worker ends when the server does, however the server ends."""
    return_large_buffers_to_os()
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_PARENT_CHECK_INTERVAL_S)
        os._exit(1)

    threading.Thread(target=watch, name="loghub-parent-watch", daemon=True).start()


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while shift < 64:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    raise PostBodyInvalid("body is not a protobuf LogGroup (a varint runs too long)")


def _field_runs(raw: bytes, run_bytes: int) -> list[tuple[int, int]] | None:
    """(start, end) of consecutive runs of whole top-level protobuf fields, each at least
    run_bytes long but the last; None when a field uses a wire type the walk does not skip
    (groups), so the caller parses whole instead."""
    runs: list[tuple[int, int]] = []
    start = pos = 0
    end = len(raw)
    try:
        while pos < end:
            tag, pos = _varint(raw, pos)
            wire_type = tag & 7
            if wire_type == 2:
                length, pos = _varint(raw, pos)
                pos += length
            elif wire_type == 0:
                _value, pos = _varint(raw, pos)
            elif wire_type in (1, 5):
                pos += 8 if wire_type == 1 else 4
            else:
                return None
            if pos - start >= run_bytes:
                runs.append((start, pos))
                start = pos
    except IndexError:
        pos = end + 1
    if pos > end:
        raise PostBodyInvalid("body is not a protobuf LogGroup (it ends inside a field)")
    if start < end:
        runs.append((start, end))
    return runs


def count_logs(raw: bytes, slice_bytes: int = _SLICE_BYTES) -> int:
    """The number of logs in a LogGroup, proving it complete (PostBodyInvalid otherwise);
    a body over twice slice_bytes is parsed a slice at a time."""
    runs = _field_runs(raw, slice_bytes) if len(raw) > 2 * slice_bytes else None
    if runs is None:
        return len(parse_log_group(raw).Logs)
    view = memoryview(raw)
    return sum(len(parse_log_group(view[start:end].tobytes()).Logs) for start, end in runs)


def _check_raw(raw: bytes, limits: Limits) -> int:
    count = count_logs(raw)
    if not count:
        raise PostBodyInvalid("a log group must hold at least one log")
    if count > limits.logs_per_group_max:
        raise PostBodyTooLarge(
            f"a log group holds {count} logs; at most {limits.logs_per_group_max} are allowed"
        )
    return count


class BodyChecker:
    def __init__(self, limits: Limits, processes: int, inline_bytes_max: int) -> None:
        self._limits = limits
        self._processes = processes
        self._inline_bytes_max = inline_bytes_max
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def _worker_pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawn, not fork: the server has threads and an event loop to leave behind
                self._pool = ProcessPoolExecutor(
                    self._processes,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_die_with_parent,
                    initargs=(os.getpid(),),
                )
            return self._pool

    def checked_raw(
        self, compress_type: str | None, body: bytes, raw_size: int | None
    ) -> tuple[bytes, int]:
        """The decompressed body, once proven a complete LogGroup within the limits, and its
        log count (the check counts them anyway; the ingest metrics report it)."""
        raw_bytes_max = self._limits.raw_body_bytes_max
        if self._processes <= 0 or len(body) <= self._inline_bytes_max:
            raw = decompress(compress_type, body, raw_size, raw_bytes_max)
            return raw, _check_raw(raw, self._limits)
        pool = self._worker_pool()
        try:
            count = pool.submit(
                check_log_group, compress_type, body, raw_size, self._limits
            ).result()
        except BrokenProcessPool:
            log.error("a body-checking worker died; starting new ones")
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False)
            count = check_log_group(compress_type, body, raw_size, self._limits)
        # decompressing again here costs less than shipping the raw bytes back (lz4 and zstd
        # release the GIL)
        return decompress(compress_type, body, raw_size, raw_bytes_max), count

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
