"""The server's check of PutLogs bodies: decompressed once, walked in the calling thread, with
the compiled walk or its pure-Python fallback giving the same answers, and no process or
thread started for it."""

from __future__ import annotations

import multiprocessing
import threading
import warnings
from pathlib import Path

import pytest

from loghub.errors import LogHubError
from loghub.server.config import Limits, ServerConfig
from loghub.server.validation import BodyChecker
from loghub.wire import logcheck
from loghub.wire.compression import compress
from loghub.wire.logs import make_log_group

LIMITS = Limits(logs_per_group_max=2000)
GROUP = make_log_group([(1_700_000_000, {"k": f"v{i}"}) for i in range(10)]).SerializeToString()
LARGE = make_log_group(
    [(1_700_000_000, {"line": f"{i:06d} " + "x" * 180}) for i in range(2000)]
).SerializeToString()


def _bodies() -> list[tuple[str | None, bytes, int | None]]:
    """(compress type, body, x-log-bodyrawsize): accepted and refused ones."""
    too_many = make_log_group([(1, {"k": "v"})] * 2001).SerializeToString()
    no_time = b"\x0a\x06\x12\x04\x0a\x00\x12\x00"
    bodies: list[tuple[str | None, bytes, int | None]] = []
    for raw in (GROUP, LARGE, b"", too_many, no_time, GROUP[:-1], GROUP + b"\x0f", b"\x0a\xff"):
        bodies.append((None, raw, None))
        for codec in ("lz4", "zstd", "deflate"):
            bodies.append((codec, compress(codec, raw), len(raw)))
    bodies.append(("lz4", compress("lz4", GROUP), len(GROUP) + 1))  # a wrong raw size
    bodies.append(("lz4", b"\xff" * 20, 100))  # not lz4
    return bodies


def _outcome(checker: BodyChecker, body: tuple[str | None, bytes, int | None]) -> object:
    try:
        raw, count = checker.checked_raw(*body)
    except LogHubError as exc:
        return exc.code, str(exc)
    return len(raw), count


def test_the_fallback_gives_what_the_compiled_walk_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    checker = BodyChecker(LIMITS)
    assert logcheck.IMPLEMENTATION == "compiled"
    compiled = [_outcome(checker, body) for body in _bodies()]
    monkeypatch.setattr(logcheck, "_scan", logcheck.scan_python)
    assert [_outcome(checker, body) for body in _bodies()] == compiled
    assert compiled[0] == (len(GROUP), 10)
    assert compiled[4] == (len(LARGE), 2000)
    codes = {outcome[0] for outcome in compiled if isinstance(outcome[0], str)}
    assert codes == {"PostBodyInvalid", "PostBodyTooLarge"}


def test_a_raw_body_is_returned_as_received() -> None:
    """No copy of an uncompressed body: the bytes checked are the bytes stored."""
    raw, count = BodyChecker(LIMITS).checked_raw(None, GROUP, None)
    assert raw is GROUP and count == 10


def test_a_large_body_is_checked_without_a_process_or_a_thread() -> None:
    threads_before = threading.active_count()
    checker = BodyChecker(Limits())
    for _ in range(3):
        assert checker.checked_raw("lz4", compress("lz4", LARGE), len(LARGE))[1] == 2000
    assert multiprocessing.active_children() == []
    assert threading.active_count() == threads_before
    checker.close()


def test_bodies_are_checked_from_many_threads_at_once() -> None:
    checker = BodyChecker(Limits())
    results: list[int] = []

    def check() -> None:
        for _ in range(5):
            results.append(checker.checked_raw(None, LARGE, None)[1])

    threads = [threading.Thread(target=check) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [2000] * 20


def test_asking_for_worker_processes_is_deprecated(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match="parse_processes is ignored"):
        ServerConfig(data_dir=tmp_path, parse_processes=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ServerConfig(data_dir=tmp_path, parse_processes=0, parse_inline_bytes_max=1)
        ServerConfig(data_dir=tmp_path)
