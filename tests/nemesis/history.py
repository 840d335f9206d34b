"""A history of operations, as Jepsen keeps one: each client operation is an ``invoke`` and
then exactly one of ``ok`` (it happened), ``fail`` (it certainly did not) or ``info`` (no one
knows: a timeout, a connection cut after the request went out, a 5xx from a node that may
have forwarded it). The checker decides with these alone, so they must never claim more
than the client knew.

On disk: JSON lines, one file per process (a writer, the reader, the nemesis), appended and
flushed line by line so that a process killed mid-run leaves every completed line. Times
are CLOCK_MONOTONIC nanoseconds, one clock for every process on the machine, so the files
merge into one order. An ``invoke`` with no completion (its process was killed) reads as
``info``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

__all__ = ["HistoryFile", "Op", "OpType", "complete", "now_ns", "read_history"]

OpType = Literal["invoke", "ok", "fail", "info"]
TYPES = ("invoke", "ok", "fail", "info")


def now_ns() -> int:
    """The history's clock: monotonic, shared by every process of the run."""
    return time.monotonic_ns()


@dataclass(frozen=True)
class Op:
    """One line of the history.

    ``f`` is what was done: ``write`` (``values`` are the unique ids written, ``hash_key``
    where it was routed), ``read`` (``observations`` are ``[shard, sequence, index, value]``
    seen), or a fault's name for the nemesis (``detail`` says on what)."""

    process: str
    type: OpType
    f: str
    time_ns: int
    values: tuple[str, ...] = ()
    client: str = ""  # "loghub" or "sdk" for writes: duplicates are counted per kind
    node: str = ""
    hash_key: str = ""
    error: str = ""
    observations: tuple[tuple[int, int, int, str], ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.type in TYPES, self.type

    def to_json(self) -> str:
        record = {k: v for k, v in asdict(self).items() if v not in ((), "", {})}
        return json.dumps(record, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Op:
        record = json.loads(line)
        record["values"] = tuple(record.get("values", ()))
        record["observations"] = tuple(tuple(o) for o in record.get("observations", ()))
        return cls(**record)


class HistoryFile:
    """One process's history file, written line by line (flushed: a SIGKILL loses at most
    the line being written, which the reader skips)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close)

    def append(self, op: Op) -> Op:
        self._file.write(op.to_json() + "\n")
        self._file.flush()
        return op

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> HistoryFile:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def read_history(paths: Iterable[Path]) -> list[Op]:
    """Every op of these files in time order; a torn last line (process killed) is skipped."""
    ops: list[Op] = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                ops.append(Op.from_json(line))
            except (ValueError, TypeError, KeyError):
                continue
    ops.sort(key=lambda op: op.time_ns)
    return ops


def complete(ops: Iterable[Op]) -> Iterator[tuple[Op, Op]]:
    """Each client op as (invoke, completion); an invoke whose process never completed it
    is paired with a synthetic ``info`` at the same time. A process has one op in flight at
    a time, as in Jepsen, so an invoke is completed by the next op of its process."""
    pending: dict[str, Op] = {}
    for op in ops:
        if op.type == "invoke":
            if op.process in pending:
                yield pending[op.process], _unknown(pending[op.process])
            pending[op.process] = op
        elif op.process in pending:
            yield pending.pop(op.process), op
    for invoke in pending.values():
        yield invoke, _unknown(invoke)


def _unknown(invoke: Op) -> Op:
    return Op(
        invoke.process,
        "info",
        invoke.f,
        invoke.time_ns,
        invoke.values,
        invoke.client,
        invoke.node,
        invoke.hash_key,
        error="never completed (process stopped)",
    )
