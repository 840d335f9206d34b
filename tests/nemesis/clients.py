"""The clients of a nemesis run: writers of unique ids, and a reader that follows every shard.

    python tests/nemesis/clients.py writer --kind loghub|sdk --process NAME --nodes A,B,C \
        --history FILE --seed N
    python tests/nemesis/clients.py reader --nodes A,B,C --history FILE

Each is a process of its own (one op in flight at a time, as Jepsen's processes), stopped by
SIGTERM after its current op. A writer writes one log group of 1 to 3 logs per op, each log
one unique id (``<process>-<n>``), routed by a random hash key so that every shard, hence
every node, takes writes. It talks to a random node and leaves a node that failed it for
another. The official SDK (``aliyun-log-python-sdk``) reaches a node through ``HTTP_PROXY``,
as tests/cluster does; it retries 5xx and some connection errors itself (10 attempts), so an
SDK op that was applied then retried is stored twice: the checker counts duplicates per
client kind.

What a completion claims, and no more: ``ok`` on a 200; ``fail`` on a 4xx (the request was
refused before anything was written); ``info`` on everything else (a timeout, a connection
closed after the request went out, a 5xx from a node that may have forwarded it to an owner
that wrote it).

The reader records what it saw at which (shard, sequence, index) during the run: the checker
compares that with the final read (two values at one place are inconsistent offsets; a value
seen and later gone is a read above the final high watermark).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent))

from aliyun.log import LogException  # noqa: E402
from history import HistoryFile, Op, now_ns  # noqa: E402

from loghub.client import LogHubClient  # noqa: E402
from loghub.errors import DataCorrupted, LogHubError  # noqa: E402
from loghub.wire.cursor import decode_cursor  # noqa: E402
from loghub.wire.logs import make_log_group  # noqa: E402
from loghub.wire.producer_ids import ProducerIds, WriteId  # noqa: E402

__all__ = ["KEYS", "LOGSTORE", "PROJECT", "ReadResult", "read_everything"]

PROJECT = "nemesis"
LOGSTORE = "ids"
KEYS = {"ak": "sk"}
OP_TIMEOUT_S = 3.0  # a node paused or cut off answers nothing: the op is then indeterminate
PAUSE_BETWEEN_OPS_S = (0.02, 0.06)  # four writers at about 20 ops/s each: room on 2 cores
READ_INTERVAL_S = 0.3
RETRIES_MAX = 5  # sends of one LogHub write whose outcome stayed unknown
PULL_GROUPS_MAX = 200
FINAL_READ_BUDGET_S = 5.0
_RESUME_AT = re.compile(r"resume at cursor (\S+)")

_stopping = False
# what the SDK's connection errors say, to tell them apart in the report
_SDK_TRANSPORT = ("Read timed out", "Connection aborted", "Connection refused", "ProxyError",
                  "RemoteDisconnected", "timed out")  # fmt: skip


def _stop(_signum: int, _frame: FrameType | None) -> None:
    global _stopping
    _stopping = True


Put = Callable[[list[str], str, list[str], WriteId | None], None]


def _put_loghub(endpoint: str) -> Put:
    client = LogHubClient(endpoint, *next(iter(KEYS.items())), timeout_s=OP_TIMEOUT_S)

    def put(
        values: list[str], hash_key: str, retried_after: list[str], write_id: WriteId | None
    ) -> None:
        del retried_after  # LogHub's client does not retry a write by itself
        group = make_log_group([(int(time.time()), {"v": value}) for value in values])
        client.put_log_group(PROJECT, LOGSTORE, group, hash_key=hash_key, write_id=write_id)

    return put


def _put_sdk(endpoint: str) -> Put:
    """The SDK's put; the errors of the attempts it retried by itself are noted in
    ``retried_after``, so that a duplicate can be traced to its retry."""
    from aliyun.log import LogClient, LogItem, PutLogsRequest

    client = LogClient(endpoint, *next(iter(KEYS.items())))
    client.timeout = OP_TIMEOUT_S  # type: ignore[assignment]  # the SDK takes seconds
    attempts: list[str] = []
    send = client._sendRequest  # type: ignore[attr-defined]  # each attempt of its retry loop

    def noted(*args: object, **kwargs: object) -> object:
        try:
            return send(*args, **kwargs)
        except Exception as exc:
            attempts.append(classify(exc)[1])
            raise

    client._sendRequest = noted  # type: ignore[attr-defined]

    def put(
        values: list[str], hash_key: str, retried_after: list[str], write_id: WriteId | None
    ) -> None:
        del write_id  # the official SDK has no write ids
        attempts.clear()
        # one process, one op at a time: the environment is this op's to set
        os.environ["HTTP_PROXY"] = os.environ["http_proxy"] = f"http://{endpoint}"
        items = []
        for value in values:
            item = LogItem()
            item.set_time(int(time.time()))
            item.set_contents([("v", value)])
            items.append(item)
        try:
            client.put_logs(PutLogsRequest(PROJECT, LOGSTORE, "", "", items, hashKey=hash_key))
        finally:
            retried_after += attempts

    return put


def classify(exc: BaseException) -> tuple[str, str]:
    """(``fail`` or ``info``, a short error text) for an exception of either client."""
    status = getattr(exc, "status", None) or getattr(exc, "resp_status", None)
    if isinstance(exc, LogHubError):
        code = getattr(exc, "code", "") or type(exc).__name__
        if exc.__cause__ is not None:  # a transport error: which one (timeout, reset...)
            code += f"/{type(exc.__cause__).__name__}"
    elif isinstance(exc, LogException):
        code = exc.get_error_code()
        if code == "LogRequestError":  # the SDK's wrapper of a connection error
            status = None
            message = exc.get_error_message()
            code += "/" + next((k for k in _SDK_TRANSPORT if k in message), "other")
    else:
        code = type(exc).__name__
    text = f"{code} {status or ''}".strip()
    refused = isinstance(status, int) and 400 <= status < 500
    return ("fail" if refused else "info"), text


def run_writer(
    kind: str, process: str, endpoints: list[str], history: HistoryFile, seed: int
) -> None:
    rng = random.Random(f"{seed}-{process}")
    make = _put_loghub if kind == "loghub" else _put_sdk
    puts = [make(endpoint) for endpoint in endpoints]
    # LogHub's client names each write (idempotent writes): a write whose outcome is unknown
    # is sent again, under the same id, as the next op (through another node), up to
    # RETRIES_MAX times, so that its values must be stored exactly once
    ids = ProducerIds(f"{process}-{seed}".replace(".", "-")[:32]) if kind == "loghub" else None
    n = 0
    avoid = -1
    pending: tuple[list[str], str, WriteId] | None = None
    retries = 0
    while not _stopping:
        node = rng.choice([i for i in range(len(endpoints)) if i != avoid])
        write_id: WriteId | None = None
        if pending is not None:
            values, hash_key, write_id = pending
        else:
            values = [f"{process}-{n + i}" for i in range(rng.randint(1, 3))]
            n += len(values)
            hash_key = f"{rng.getrandbits(128):032x}"
            write_id = ids.next() if ids is not None else None
        invoke = Op(process, "invoke", "write", now_ns(), tuple(values), kind, f"n{node}", hash_key)
        history.append(invoke)
        retried: list[str] = []
        try:
            puts[node](values, hash_key, retried, write_id)
        except Exception as exc:  # any failure is recorded, never raised: the run goes on
            outcome, text = classify(exc)
            history.append(Op(process, outcome, "write", now_ns(), invoke.values, kind,  # type: ignore[arg-type]
                              invoke.node, hash_key, error=text,
                              detail={"retried_after": retried} if retried else {}))  # fmt: skip
            avoid = node
            if write_id is not None and outcome == "info" and retries < RETRIES_MAX:
                pending, retries = (values, hash_key, write_id), retries + 1
            else:
                pending, retries = None, 0
            continue
        noted = {"retried_after": retried} if retried else {}
        history.append(Op(process, "ok", "write", now_ns(), invoke.values, kind, invoke.node,
                          hash_key, detail=noted))  # fmt: skip
        pending, retries = None, 0
        avoid = -1
        time.sleep(rng.uniform(*PAUSE_BETWEEN_OPS_S))


class ReadResult:
    """What one pass over every shard saw: ``observations`` (shard, sequence, index, value)
    and each shard's end sequence (``ends``), and the shards it could not read."""

    def __init__(self) -> None:
        self.observations: list[tuple[int, int, int, str]] = []
        self.ends: dict[int, int] = {}
        self.unreadable: dict[int, str] = {}
        self.gaps: list[str] = []


def pull_from(
    client: LogHubClient, shard: int, cursor: str, result: ReadResult, groups_max: int = 0
) -> str:
    """Pulls ``shard`` from ``cursor`` to its end (or ``groups_max`` groups), adding what it
    saw to ``result``; returns the cursor after the last group read. Each group is one
    sequence: a pull that moves the cursor by more than its groups is a gap, noted. Records
    the serving node lost to damage on disk (``DataCorrupted``, 410) are a gap too: noted,
    and the read resumes after them, so that only their values go missing."""
    read = 0
    while True:
        try:
            reply = client.pull_logs(PROJECT, LOGSTORE, shard, cursor, PULL_GROUPS_MAX)
        except DataCorrupted as exc:
            resume = _RESUME_AT.search(str(exc))
            if resume is None:
                raise
            result.gaps.append(f"shard {shard}: DataCorrupted from seq {decode_cursor(cursor)} "
                               f"to {decode_cursor(resume[1])}: {exc}")  # fmt: skip
            cursor = resume[1]
            continue
        first = decode_cursor(cursor)
        groups = reply.log_groups
        for i, group in enumerate(groups):
            for j, log in enumerate(group.Logs):
                value = next((c.Value for c in log.Contents if c.Key == "v"), "")
                result.observations.append((shard, first + i, j, value))
        moved = decode_cursor(reply.next_cursor) - first
        if moved != len(groups):
            result.gaps.append(f"shard {shard}: {len(groups)} groups from {first} moved {moved}")
        read += len(groups)
        if not groups or reply.next_cursor == cursor or (groups_max and read >= groups_max):
            result.ends[shard] = decode_cursor(reply.next_cursor)
            return reply.next_cursor
        cursor = reply.next_cursor


def read_everything(endpoint: str, budget_s: float = FINAL_READ_BUDGET_S) -> ReadResult:
    """Every shard of the logstore, read-only ones included, from its beginning to its end,
    through ``endpoint`` (which forwards to each owner). Retries a shard that does not
    answer for ``budget_s``: the cluster was healed, so one still unreadable then is a
    finding (reported, never skipped silently), not something to wait out."""
    result = ReadResult()
    with LogHubClient(endpoint, *next(iter(KEYS.items())), timeout_s=10) as client:
        shards = [s.shard_id for s in client.list_shards(PROJECT, LOGSTORE)]
        for shard in shards:
            deadline = time.monotonic() + budget_s
            for attempt in itertools.count():
                if attempt and time.monotonic() > deadline:
                    break
                partial = ReadResult()
                try:
                    cursor = client.get_cursor(PROJECT, LOGSTORE, shard, "begin")
                    pull_from(client, shard, cursor, partial)
                except LogHubError as exc:
                    result.unreadable[shard] = f"{type(exc).__name__}: {exc}"
                    time.sleep(0.5)
                    continue
                result.unreadable.pop(shard, None)
                result.observations += partial.observations
                result.ends.update(partial.ends)
                result.gaps += partial.gaps
                break
    return result


def run_reader(endpoints: list[str], history: HistoryFile, seed: int) -> None:
    """Follows every shard from its beginning, READ_INTERVAL_S apart, through random nodes."""
    rng = random.Random(f"{seed}-reader")
    clients = [
        LogHubClient(endpoint, *next(iter(KEYS.items())), timeout_s=OP_TIMEOUT_S)
        for endpoint in endpoints
    ]
    cursors: dict[int, str] = {}
    while not _stopping:
        node = rng.randrange(len(endpoints))
        client = clients[node]
        invoke = history.append(Op("reader", "invoke", "read", now_ns(), node=f"n{node}"))
        seen = ReadResult()
        try:
            for shard in client.list_shards(PROJECT, LOGSTORE):
                try:
                    cursor = cursors.get(shard.shard_id) or client.get_cursor(
                        PROJECT, LOGSTORE, shard.shard_id, "begin"
                    )
                    cursors[shard.shard_id] = pull_from(
                        client, shard.shard_id, cursor, seen, PULL_GROUPS_MAX
                    )
                except LogHubError as exc:
                    seen.unreadable[shard.shard_id] = type(exc).__name__
        except LogHubError as exc:
            seen.unreadable[-1] = type(exc).__name__
        trouble = {"unreadable": seen.unreadable, "gaps": seen.gaps}
        history.append(
            Op("reader", "ok", "read", now_ns(), node=invoke.node,
               observations=tuple(seen.observations),
               detail=trouble if seen.gaps or seen.unreadable else {})
        )  # fmt: skip
        time.sleep(READ_INTERVAL_S)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("writer", "reader"))
    parser.add_argument("--kind", choices=("loghub", "sdk"), default="loghub")
    parser.add_argument("--process", default="reader")
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--history", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    endpoints = args.nodes.split(",")
    with HistoryFile(args.history) as history:
        if args.role == "writer":
            run_writer(args.kind, args.process, endpoints, history, args.seed)
        else:
            run_reader(endpoints, history, args.seed)


if __name__ == "__main__":
    main()
