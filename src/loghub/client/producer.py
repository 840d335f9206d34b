"""JSON lines to log groups: what ``loghub produce`` runs, usable from Python too.

Input is lines of bytes, each one JSON object (a log); ``time_field`` (``__time__``) holds
its time in unix seconds (an integer, a number, or a string of digits), and a log without it
gets the time it was read. The other fields become the log's contents: strings as they
are, numbers as written in the line (``1.50`` stays ``1.50``), anything else as compact
JSON. A line that is not a JSON object, or whose time is not a time (not a number, negative,
past 2106), is a ``BadLine`` with its line number: it is skipped, not sent with a silent
"now", and the others go on.

Speed: a batch is decoded in one ``json`` call over the joined lines (each line the value
of its own key, see ``_decode_joined``); the logs are then written as protobuf wire bytes by
a small C encoder (``_encode.c``, built by setup.py) and parsed back into a ``LogGroup`` by
the protobuf runtime (about 0.4 us a log), which together take a third of building the
group in place through the runtime's objects. That in-place build is the pure-Python path,
used when the extension is missing or a value is not a string, and gives the same group.
When the joined decode fails, each line is decoded alone to find the bad ones, so bad input
costs time only in the batches that hold it.

``Sender`` sends groups from one background thread, so reading and encoding the next batch
overlaps the round trip of the last; at most ``inflight_batches_max`` wait for it, so a slow
server slows the reader rather than filling memory. Retryable errors are retried with
backoff (``loghub._retry``); any other error stops the sender, and the next ``submit`` or
``close`` raises it.
"""

from __future__ import annotations

import json
import math
import queue
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

from loghub._retry import RetryPolicy, retry_call
from loghub.wire.proto import LogGroup

try:  # the compiled encoder (setup.py); without a C compiler, the path below gives the same
    from loghub.client import _encode as _native  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the install
    _native = None
# Tests turn the compiled path off to hold the two paths to the same answers.
_native_enabled = True

__all__ = ["BadLine", "ParsedBatch", "Sender", "parse_lines"]

T = TypeVar("T")
_MISSING = object()  # no time field at all (a null one is a bad time)
_TIME_S_MAX = 2**32 - 1  # the protobuf field is uint32: the year 2106
_decode_numbers_as_text = json.JSONDecoder(parse_int=str, parse_float=str).decode
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@dataclass(frozen=True)
class BadLine:
    number: int  # 1-based, counted over every line read, empty ones included
    reason: str


@dataclass
class ParsedBatch:
    """The logs of a batch as one ``LogGroup``, the hash-key field's value of each log (when
    asked for), and the lines that could not be sent."""

    group: LogGroup = field(default_factory=LogGroup)
    keys: list[str] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.group.Logs)


def parse_lines(
    lines: Sequence[bytes],
    first_number: int,
    time_field: str,
    now_s: int,
    hash_key_field: str | None = None,
) -> ParsedBatch:
    """The logs of ``lines`` (line ``first_number`` first); blank lines are skipped."""
    numbered = [(first_number + i, line) for i, line in enumerate(lines) if line.strip()]
    batch = ParsedBatch()
    values = _decode_joined([line for _, line in numbered])
    if values is None:
        values = [_decode_one(number, line, batch.bad) for number, line in numbered]
    good: list[tuple[int, bytes, dict[str, Any], int]] = []
    for (number, line), value in zip(numbered, values, strict=True):
        if value is None:
            continue
        time_value = value.pop(time_field, _MISSING)
        log_time_s = now_s if time_value is _MISSING else _time_s(time_value)
        if log_time_s is None:
            batch.bad.append(BadLine(number, f"{time_field} {time_value!r} is not unix seconds"))
            continue
        good.append((number, line, value, log_time_s))
    if _native is not None and _native_enabled:
        try:
            encoded = _native.encode_logs([g[2] for g in good], [g[3] for g in good])
        except (TypeError, UnicodeEncodeError):
            pass  # not a string, or a lone surrogate: the general path below decides
        else:
            batch.group = LogGroup.FromString(encoded)
            if hash_key_field is not None:
                batch.keys = [g[2].get(hash_key_field, "") for g in good]
            batch.bad.sort(key=lambda bad: bad.number)
            return batch
    _build_in_place(batch, good, time_field, hash_key_field)
    batch.bad.sort(key=lambda bad: bad.number)
    return batch


def _build_in_place(
    batch: ParsedBatch,
    good: list[tuple[int, bytes, dict[str, Any], int]],
    time_field: str,
    hash_key_field: str | None,
) -> None:
    """The general path (and the pure-Python one): the group built through the protobuf
    runtime's objects, any value allowed (non-strings become compact JSON); a line whose
    text cannot be UTF-8 (a lone surrogate written as an escape) is a bad line."""
    for number, line, value, log_time_s in good:
        try:
            value = _add_log(batch.group, line, value, log_time_s, time_field)
        except UnicodeEncodeError:
            del batch.group.Logs[-1]
            batch.bad.append(BadLine(number, "text that is not valid Unicode (a lone surrogate)"))
            continue
        if hash_key_field is not None:
            batch.keys.append(value.get(hash_key_field, ""))


def _add_log(
    group: LogGroup, line: bytes, value: dict[str, Any], log_time_s: int, time_field: str
) -> dict[str, Any]:
    """Appends one log; returns its contents as sent (non-strings made JSON text)."""
    log = group.Logs.add()
    log.Time = log_time_s
    add_content = log.Contents.add
    try:
        for key, text in value.items():
            content = add_content()
            content.Key = key
            content.Value = text  # a TypeError unless a string: see below
    except TypeError:
        # true/false/null or nested (rare, so not checked up front): from an ordinary
        # parse, where nested numbers are numbers again, as compact JSON
        value = _plain_values(line, time_field)
        del log.Contents[:]
        for key, text in value.items():
            content = add_content()
            content.Key = key
            content.Value = text
    return value


def _plain_values(line: bytes, time_field: str) -> dict[str, str]:
    plain = json.loads(line)
    plain.pop(time_field, None)
    return {k: v if type(v) is str else _compact(v) for k, v in plain.items()}


def _decode_joined(lines: list[bytes]) -> list[Any] | None:
    """Each line's object from one decode, or None when some line is not one on its own.

    The lines become the values of one object, keyed by a fresh random prefix and the line's
    index. A line that is not one complete value on its own (``{"a": [1`` followed by
    ``2]}``) either breaks the decode or moves a key off the top level, leaving some
    expected key missing or an extra one present; no line can name an expected key without
    knowing the prefix. So the answer is exactly that of decoding line by line."""
    prefix = secrets.token_hex(8)
    try:
        text = (
            "{"
            + ",\n".join(f'"{prefix}{index}":{line.decode()}' for index, line in enumerate(lines))
            + "}"
        )
        by_key = _decode_numbers_as_text(text)
    except ValueError:  # also UnicodeDecodeError
        return None
    if len(by_key) != len(lines):
        return None
    try:
        values = [by_key[f"{prefix}{index}"] for index in range(len(lines))]
    except KeyError:
        return None
    if not all(type(v) is dict for v in values):
        return None
    return values


def _decode_one(number: int, line: bytes, bad: list[BadLine]) -> Any:
    try:
        value = _decode_numbers_as_text(line.decode())
    except UnicodeDecodeError:
        bad.append(BadLine(number, "not UTF-8"))
        return None
    except ValueError as exc:
        bad.append(BadLine(number, f"not JSON ({exc})"))
        return None
    if type(value) is not dict:
        bad.append(BadLine(number, f"a JSON {type(value).__name__}, not an object"))
        return None
    return value


def _time_s(value: Any) -> int | None:
    """Unix seconds from a number or a numeric string (fractions cut), None if not a time."""
    if type(value) is not str:
        return None  # true, null, an object: not a time
    try:
        seconds = float(value)
    except ValueError:
        return None
    if not math.isfinite(seconds) or not 0 <= seconds <= _TIME_S_MAX:
        return None
    return int(seconds)


class Sender(Generic[T]):
    """Hands batches to ``send`` in order from one background thread, with retries."""

    def __init__(
        self,
        send: Callable[[T], None],
        policy: RetryPolicy,
        *,
        inflight_batches_max: int = 2,
        on_retry: Callable[[int, BaseException, float], None] | None = None,
    ) -> None:
        self._send = send
        self._policy = policy
        self._on_retry = on_retry
        self._queue: queue.Queue[tuple[T, int] | None] = queue.Queue(inflight_batches_max)
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self.sent_logs = 0  # acknowledged by the server
        self._thread = threading.Thread(target=self._run, name="loghub-producer", daemon=True)
        self._thread.start()

    def submit(self, batch: T, logs: int) -> None:
        """Queues ``batch`` (of ``logs`` logs); blocks while the queue is full."""
        self._raise_if_failed()
        while True:
            try:
                self._queue.put((batch, logs), timeout=0.1)
                return
            except queue.Full:
                self._raise_if_failed()

    def close(self) -> None:
        """Waits until everything queued is sent; raises the error that stopped sending."""
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=0.1)
                break
            except queue.Full:
                continue
        self._thread.join()
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        with self._lock:
            error = self._error
        if error is not None:
            raise error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch, logs = item
            try:
                retry_call(partial(self._send, batch), self._policy, on_retry=self._on_retry)
            except BaseException as exc:  # handed to the caller's thread
                with self._lock:
                    self._error = exc
                self._drain()
                return
            with self._lock:
                self.sent_logs += logs

    def _drain(self) -> None:
        """After a failure: empty the queue so a blocked submit or close wakes up."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return
