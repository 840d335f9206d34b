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

Thread-safety: ``check`` may be called from many threads at once.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from loghub.errors import PostBodyInvalid, PostBodyTooLarge
from loghub.server.config import Limits
from loghub.wire.compression import decompress
from loghub.wire.logs import parse_log_group

__all__ = ["BodyChecker", "check_log_group"]

log = logging.getLogger("loghub.server")


def check_log_group(
    compress_type: str | None, body: bytes, raw_size: int | None, limits: Limits
) -> int:
    """Proves `body` a complete, non-empty LogGroup within the limits; returns its log count.
    Raises PostBodyInvalid, PostBodyTooLarge or InvalidCompressType."""
    return _check_raw(decompress(compress_type, body, raw_size, limits.raw_body_bytes_max), limits)


def _check_raw(raw: bytes, limits: Limits) -> int:
    group = parse_log_group(raw)
    count = len(group.Logs)
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
                    self._processes, mp_context=multiprocessing.get_context("spawn")
                )
            return self._pool

    def checked_raw(self, compress_type: str | None, body: bytes, raw_size: int | None) -> bytes:
        """The decompressed body, once proven a complete LogGroup within the limits."""
        raw_bytes_max = self._limits.raw_body_bytes_max
        if self._processes <= 0 or len(body) <= self._inline_bytes_max:
            raw = decompress(compress_type, body, raw_size, raw_bytes_max)
            _check_raw(raw, self._limits)
            return raw
        pool = self._worker_pool()
        try:
            pool.submit(check_log_group, compress_type, body, raw_size, self._limits).result()
        except BrokenProcessPool:
            log.error("a body-checking worker died; starting new ones")
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False)
            check_log_group(compress_type, body, raw_size, self._limits)
        # decompressing again here costs less than shipping the raw bytes back (lz4 and zstd
        # release the GIL)
        return decompress(compress_type, body, raw_size, raw_bytes_max)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
