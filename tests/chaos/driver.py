"""A chaos run: real processes under real faults for a bounded time, then the checker.

    python tests/chaos/driver.py [--seconds 180] [--faults a,b] [--spark] [--seed N] [--keep DIR]

(``make chaos CHAOS_SECONDS=600`` runs it). One logstore, written by a producer that records
every acknowledged log, is read by two ordered consumer groups of ``loghub.consumer`` worker
processes at once: one coordinated by the server (heartbeats), one by leases in a throwaway
PostgreSQL; with ``--spark``, also by a Spark Structured Streaming query. The server keeps
its data on a small tmpfs. A fault driver injects a fault every few seconds (faults.py),
chosen by a random generator seeded from ``LOGHUB_SEED`` or ``--seed`` (printed at start,
to replay).

At the end the producer stops, the faults stop, every group is given time to catch up, and
the checker prints what was lost, duplicated (and why) and reordered, and how long recovery
took. The exit status is 1 when an acknowledged log was lost (from storage or by a group)
or an ordered group processed a key's logs out of order.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the helpers of the other test directories (server_process, postgres, the worker script)
_TESTS = Path(__file__).resolve().parents[1]
sys.path[1:1] = [str(_TESTS), str(_TESTS / "integration")]

from checker import GroupReport, check_group, recovery_times_s, summary  # noqa: E402
from faults import ALL, SURVIVED, Fault, Target  # noqa: E402
from postgres import create_schema, running_postgres  # noqa: E402
from processes import PROJECT, ChaosServer, Fleet, Producer, SmallDisk, SparkStream  # noqa: E402

from loghub.client import LogHubClient  # noqa: E402
from loghub.errors import LogHubError  # noqa: E402
from loghub.wire.cursor import decode_cursor, encode_cursor  # noqa: E402

SHARDS = 4
KEYS = 16
WORKERS_PER_GROUP = 2
DISK_MIB = 32
SEGMENT_BYTES = 32 * 1024


@dataclass
class Options:
    seconds: float = 180.0
    faults: tuple[str, ...] = ALL
    spark: bool = False
    seed: int = 0
    fault_gap_s: tuple[float, float] = (1.0, 4.0)
    catch_up_s: float = 90.0
    write_rate_per_s: float = 80.0
    keep: Path | None = None
    # a database of a PostgreSQL server the caller runs (the test suite's), used by this run
    # alone; empty: the run starts a server of its own
    postgres_url: str = ""


@dataclass
class Result:
    seed: int
    acked: int = 0
    producer_errors: dict[str, int] = field(default_factory=dict)
    storage_lost: list[tuple[str, int]] = field(default_factory=list)
    storage_errors: list[str] = field(default_factory=list)
    # unreadable groups that each held a flipped byte themselves (one group per flip, each
    # group one log here): that loss is the damage itself, the rest is loss beyond it
    storage_lost_in_damaged_groups: int = 0
    groups: list[GroupReport] = field(default_factory=list)
    spark_lost: int = 0
    spark_duplicates: int = 0  # rows twice in the sink, not explained by a retried write
    spark_stored_twice: int = 0  # rows of a log the producer stored twice
    faults: list[Fault] = field(default_factory=list)
    recovery_s: dict[str, list[float]] = field(default_factory=dict)
    orphans: int = 0
    workers_exited: list[str] = field(default_factory=list)  # by themselves, mid-run
    spark_restarts: int = 0
    spark_ran: bool = False
    disk_full_available: bool = False

    @property
    def lost(self) -> int:
        return (
            self.storage_lost_beyond_damage
            + sum(len(g.lost) for g in self.groups)
            + self.spark_lost
        )

    @property
    def storage_lost_beyond_damage(self) -> int:
        return len(self.storage_lost) - self.storage_lost_in_damaged_groups

    @property
    def order_violations(self) -> int:
        return sum(len(g.order_violations) for g in self.groups)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.order_violations == 0


def run(options: Options, log: Callable[[str], None] = print) -> Result:
    base = Path(tempfile.mkdtemp(prefix="loghub-chaos-"))
    result = Result(options.seed)
    rng = random.Random(options.seed)
    log(f"LOGHUB_SEED={options.seed} in {base}, {options.seconds:.0f} s, faults "
        f"{','.join(options.faults)}{' + spark' if options.spark else ''}")  # fmt: skip
    try:
        with ExitStack() as stack:
            disk = stack.enter_context(SmallDisk(base / "disk", DISK_MIB))
            result.disk_full_available = disk.mounted
            faults = options.faults
            if not disk.mounted and "fill_disk" in faults:
                log("tmpfs could not be mounted (not root?): fill_disk left out")
                faults = tuple(f for f in faults if f != "fill_disk")
            postgres_url = options.postgres_url or stack.enter_context(running_postgres())
            server = ChaosServer(disk.path, SEGMENT_BYTES)
            server.start()
            stack.callback(server.crash)  # after stop(): whatever is left, by PID
            stack.callback(server.stop)
            _run_with_server(options, faults, base, disk, server, postgres_url, rng, result, log)
            result.orphans = server.orphans_found
    finally:
        if options.keep:
            shutil.copytree(base, options.keep, dirs_exist_ok=True, ignore=_skip_filler)
        shutil.rmtree(base, ignore_errors=True)
    return result


def _skip_filler(directory: str, names: list[str]) -> list[str]:
    return [name for name in names if name == "chaos-filler"]


def _run_with_server(options: Options, faults: tuple[str, ...], base: Path, disk: SmallDisk,
                     server: ChaosServer, postgres_url: str, rng: random.Random, result: Result,
                     log: Callable[[str], None]) -> None:  # fmt: skip
    logstore = "events"
    client = LogHubClient(server.endpoint, "ak", "sk", timeout_s=10)
    client.create_project(PROJECT)
    client.create_logstore(PROJECT, logstore, shard_count=SHARDS)
    lease_url = create_schema(postgres_url, f"leases_{uuid.uuid4().hex[:8]}")
    fleets = [
        Fleet(server.endpoint, logstore, "by-server", "server", "", base / "events-server"),
        Fleet(server.endpoint, logstore, "by-lease", "lease", lease_url, base / "events-lease"),
    ]
    spark = SparkStream(server.endpoint, logstore, base) if options.spark else None
    producer = Producer(server.endpoint, logstore, [f"k{i}" for i in range(KEYS)],
                        options.write_rate_per_s)  # fmt: skip
    target = Target(server, client, logstore, fleets, disk, postgres_url, spark, rng, log)
    try:
        for fleet in fleets:
            for _ in range(WORKERS_PER_GROUP):
                fleet.start_one()
        if spark is not None:
            spark.start()
        producer.start()
        _inject_until(target, faults, options, time.monotonic() + options.seconds)
        producer.stop()
        log(f"producer stopped: {len(producer.acked)} logs acknowledged; catching up")
        _catch_up(fleets, spark, set(producer.acked), options.catch_up_s, log)
        for fleet in fleets:
            fleet.stop_all()
    finally:
        producer.stop()
        for fleet in fleets:
            fleet.kill_all()
        if spark is not None:
            spark.kill()
    _check(result, producer, target, fleets, spark)
    client.close()


def _inject_until(target: Target, faults: tuple[str, ...], options: Options,
                  deadline: float) -> None:  # fmt: skip
    """Every fault kind once, in a seeded order (a short run still meets them all, even past
    the deadline), then kinds chosen at random until the deadline."""
    # let every shard find a consumer first: each group's workers share the shards
    settle_until = time.monotonic() + min(5.0, options.seconds / 4)
    while time.monotonic() < settle_until and not all(_settled(f) for f in target.fleets):
        time.sleep(0.05)
    first_round = target.rng.sample(faults, len(faults))
    while faults and (time.monotonic() < deadline or first_round):
        kind = first_round.pop() if first_round else target.rng.choice(faults)
        if kind in ("split", "merge"):
            kind = target.reshard_kind(kind)
        if kind == "kill_spark" and (target.spark is None or target.spark.age_s() < 40):
            time.sleep(0.1)  # no stream, or one still starting (a JVM takes ~20 s here)
            continue
        _restart_dead_stream(target)
        for fleet in target.fleets:
            for name in fleet.replace_exited():
                target.log(f"{name} had exited by itself: replaced")
        try:
            target.inject(kind)
        except LogHubError as exc:  # a split or merge the server refused (e.g. still down)
            target.log(f"{kind} refused: {exc!r}")
        time.sleep(target.rng.uniform(*options.fault_gap_s))
    time.sleep(max(0.0, deadline - time.monotonic()))


def _settled(fleet: Fleet) -> bool:
    """Every shard is held by a worker of the group and every worker holds one (from the
    start and stop events the workers record)."""
    held: dict[int, set[int]] = {}
    for event in fleet.events():
        if event["e"] == "start":
            held.setdefault(event["pid"], set()).add(event["shard"])
        elif event["e"] == "stop":
            held.get(event["pid"], set()).discard(event["shard"])
    running = [fleet.pid(name) for name in fleet.running()]
    covered = set().union(*(held.get(pid, set()) for pid in running))
    return covered == set(range(SHARDS)) and all(held.get(pid) for pid in running)


def _restart_dead_stream(target: Target) -> None:
    """A streaming query stops when its source fails (the server was down): start it again
    from its checkpoint, as an operator's supervisor would."""
    if target.spark is not None and not target.spark.alive():
        target.spark.start()
        target.spark_restarts += 1
        target.log("spark stream had stopped: started again")


def _catch_up(fleets: list[Fleet], spark: SparkStream | None, acked: set[tuple[str, int]],
              timeout_s: float, log: Callable[[str], None]) -> None:  # fmt: skip
    """Waits until every group (and the stream) has processed every acknowledged log."""
    deadline = time.monotonic() + timeout_s
    pending = {fleet.group for fleet in fleets} | ({"spark"} if spark else set())
    while pending and time.monotonic() < deadline:
        for fleet in fleets:
            for name in fleet.replace_exited():
                log(f"{name} had exited by itself: replaced")
            seen = {(key, n) for e in fleet.events() if e["e"] == "logs" for key, n, _ in e["logs"]}
            if acked <= seen:
                pending.discard(fleet.group)
        if spark is not None and "spark" in pending and acked <= set(spark.logs()):
            pending.discard("spark")
        if pending:
            time.sleep(0.2)
    if pending:
        log(f"still behind after {timeout_s:.0f} s: {', '.join(sorted(pending))}")


def _check(result: Result, producer: Producer, target: Target, fleets: list[Fleet],
           spark: SparkStream | None) -> None:  # fmt: skip
    acked = producer.acked
    result.acked, result.producer_errors = len(acked), dict(producer.errors)
    result.faults = target.faults
    result.workers_exited = [name for fleet in fleets for name in fleet.exited]
    result.spark_restarts = target.spark_restarts
    unreadable: list[tuple[int, int, int]] = []
    stored = _stored_logs(target.client, target.logstore, result.storage_errors, unreadable)
    result.storage_lost = sorted(acked.keys() - stored)
    damaged = [fault.damaged for fault in target.faults if fault.damaged]
    result.storage_lost_in_damaged_groups = min(
        len(result.storage_lost), _groups_holding_a_flip(unreadable, damaged)
    )
    group_events = {fleet.group: fleet.events() for fleet in fleets}
    for name, events in group_events.items():
        result.groups.append(check_group(name, events, acked, producer.failed, target.faults))
    if spark is not None:
        result.spark_ran = True
        rows = spark.logs()
        result.spark_lost = len(acked.keys() - set(rows))
        extra = Counter(rows) - Counter(set(rows))
        result.spark_stored_twice = sum(c for log, c in extra.items() if log in producer.failed)
        result.spark_duplicates = extra.total() - result.spark_stored_twice
    result.recovery_s = recovery_times_s(target.faults, acked, group_events)


def _groups_holding_a_flip(unreadable: list[tuple[int, int, int]],
                           damaged: list[tuple[int, int, int]]) -> int:  # fmt: skip
    """How many unreadable groups a flipped byte can explain: one per flip, a group of the
    segment file that was damaged. Wider damage is loss beyond the damaged record."""
    explained = 0
    remaining = [[shard, lo, hi] for shard, lo, hi in unreadable]
    for shard, begin, end in damaged:
        for entry in remaining:
            if entry[0] == shard and begin <= entry[1] <= entry[2] and entry[1] < end:
                entry[1] += 1  # one unreadable sequence of this range taken by this flip
                explained += 1
                break
    return explained


def _stored_logs(client: LogHubClient, logstore: str, errors: list[str],
                 unreadable: list[tuple[int, int, int]]) -> set[tuple[str, int]]:  # fmt: skip
    """Every (key, n) the server returns when every shard is read from its beginning. A pull
    that fails is tried again one sequence further on, so damage costs only what the server
    cannot serve; each unreadable range is listed in ``errors`` and, as (shard, first, last
    sequence), in ``unreadable``."""
    stored: set[tuple[str, int]] = set()
    for shard in client.list_shards(PROJECT, logstore):
        shard_id = shard.shard_id
        seq = decode_cursor(client.get_cursor(PROJECT, logstore, shard_id, "begin"))
        end = decode_cursor(client.get_cursor(PROJECT, logstore, shard_id, "end"))
        bad_from, first_error = -1, ""
        while seq < end:
            try:
                pulled = _pull_around_damage(client, logstore, shard_id, seq)
            except LogHubError as exc:
                if bad_from < 0:
                    bad_from, first_error = seq, str(exc)
                seq += 1
                continue
            if bad_from >= 0:
                errors.append(f"shard {shard_id} sequences {bad_from}..{seq - 1}: {first_error}")
                unreadable.append((shard_id, bad_from, seq - 1))
                bad_from = -1
            for group in pulled.log_groups:
                for entry in group.Logs:
                    fields = {c.Key: c.Value for c in entry.Contents}
                    stored.add((fields["key"], int(fields["n"])))
            seq = max(seq + 1, decode_cursor(pulled.next_cursor))
        if bad_from >= 0:
            errors.append(f"shard {shard_id} sequences {bad_from}..{end - 1}: {first_error}")
            unreadable.append((shard_id, bad_from, end - 1))
    return stored


def _pull_around_damage(client: LogHubClient, logstore: str, shard_id: int, seq: int) -> Any:
    """A pull of many groups from ``seq``; if it fails, of the one group at ``seq``, so that
    damage further on does not hide the groups before it."""
    cursor = encode_cursor(seq)
    try:
        return client.pull_logs(PROJECT, logstore, shard_id, cursor, 100)
    except LogHubError:
        return client.pull_logs(PROJECT, logstore, shard_id, cursor, 1)


def report(result: Result, log: Callable[[str], None] = print) -> None:
    log(f"--- chaos report (LOGHUB_SEED={result.seed}) ---")
    kinds: dict[str, int] = {}
    for fault in result.faults:
        kinds[fault.kind] = kinds.get(fault.kind, 0) + 1
    log(f"faults: {', '.join(f'{k} x{v}' for k, v in sorted(kinds.items())) or 'none'}")
    errors = ", ".join(f"{kind} x{count}" for kind, count in sorted(result.producer_errors.items()))
    log(f"acknowledged logs: {result.acked}; failed write attempts: {errors or 'none'}")
    log(f"acked logs lost from storage: {result.storage_lost_beyond_damage} beyond the "
        f"damaged records, {result.storage_lost_in_damaged_groups} in a record that held a "
        f"flipped byte {_sample(result.storage_lost)}")  # fmt: skip
    for error in result.storage_errors:
        log(f"  unreadable: {error}")
    for group in result.groups:
        log(f"group {group.name}: {group.processed} processed, acked logs lost "
            f"{len(group.lost)} {_sample(group.lost)}; duplicates: "
            f"{group.redelivered_explained} redelivered after a crash past the last durable "
            f"checkpoint, {group.stored_twice_explained} stored twice by a retried failed "
            f"write, {len(group.unexplained)} unexplained; order violations "
            f"{len(group.order_violations)}")  # fmt: skip
        for line in (group.unexplained + group.order_violations)[:5]:
            log(f"  {line}")
    log(f"consumer workers that exited by themselves mid-run (replaced): "
        f"{', '.join(result.workers_exited) or 'none'}")  # fmt: skip
    if result.spark_ran:
        log(
            f"spark stream: acked logs lost {result.spark_lost}, duplicates "
            f"{result.spark_duplicates} (and {result.spark_stored_twice} of logs stored twice "
            f"by a retried write), stopped by itself {result.spark_restarts} times"
        )
    for kind, values in sorted(result.recovery_s.items()):
        log(f"recovery after {kind}: {summary(values)}")
    log(f"server worker processes orphaned by SIGKILL (stopped by PID): {result.orphans}")
    log("PASS" if result.ok else "FAIL: acknowledged logs lost or order violated")


def _sample(logs: list[tuple[str, int]]) -> str:
    return f"e.g. {logs[:5]}" if logs else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="driver.py", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--faults", default=",".join(ALL), help=f"any of {','.join(ALL)}")
    parser.add_argument("--survived", action="store_true", help=f"only {','.join(SURVIVED)}")
    parser.add_argument("--spark", action="store_true", help="also run a Spark stream")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="copy the run's files here")
    args = parser.parse_args(argv)
    faults = SURVIVED if args.survived else tuple(f for f in args.faults.split(",") if f)
    unknown = set(faults) - set(ALL)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    seed = args.seed if args.seed is not None else _seed_from_env()
    options = Options(seconds=args.seconds, faults=faults, spark=args.spark, seed=seed,
                      keep=args.keep)  # fmt: skip
    result = run(options)
    report(result)
    return 0 if result.ok else 1


def _seed_from_env() -> int:
    return int(os.environ.get("LOGHUB_SEED", random.randrange(2**32)))


if __name__ == "__main__":
    sys.exit(main())
