"""Nemesis runs against a real LogHub cluster, each checked from its history.

    python tests/nemesis/run.py --runs N --seconds S [--seed X] [--faults a,b,...]
        [--writers 2] [--settle 3] [--keep DIR] [--network auto|netns|proxy]

(``make nemesis`` runs 100 x 60 s.) A run starts 3 etcd members and 3 ``loghub serve
--cluster`` nodes whose network the nemesis can cut (nemesis.py): each node in a network
namespace of its own, cut by nft rules (``--network netns``, root only: netns.py), or on
loopback behind TCP proxies (``--network proxy``: proxy.py). ``auto``, the default, is
netns when this process is root and a throwaway namespace with a veth pair, a bridge and an
nft table can be made, else proxy; the header says which and why. It makes a logstore of 6
shards, starts
writers (LogHub's client and the official SDK, ``--writers`` of each) and a reader, and
injects faults for ``--seconds``. Then it heals everything, lets the writers go on through
the settle period, stops them, reads every shard through every node and runs the checker.

Seeds: the base seed is ``--seed``, else ``LOGHUB_SEED``, else random, and is printed; run
``i`` uses base + i and prints it, so ``--runs 1 --seed <that>`` replays one run's schedule
(which faults, on which node, for how long). What the processes do in between is up to the
machine's timing, so a replay brings back the faults, not every interleaving.

Exit status 1 when a run lost an acknowledged write or gave one position two values.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

from clients import KEYS, LOGSTORE, PROJECT, read_everything  # noqa: E402
from history import HistoryFile, Op, now_ns, read_history  # noqa: E402
from nemesis import FAULTS, REPLICATED_FAULTS, Nemesis, NemesisCluster, nemesis_cluster  # noqa: E402
from nemesis_checker import (  # noqa: E402
    Report,
    check,
    check_flips,
    check_handovers,
    check_replicas,
    check_torn_tails,
    format_report,
    leader_loss_failover,
    percentile,
)
from netns import NETWORKS, NetnsError, resolve_network  # noqa: E402
from segments import Copy, copy_difference, read_copy  # noqa: E402

from loghub.client import LogHubClient  # noqa: E402

SHARDS = 6
WRITER_STOP_S = 20.0  # an SDK op retries for up to ~40 s; past this it is left info
# after healing, how long every shard's ISR may take to hold all its replicas, then how long
# the copies may take to become identical (an ISR member may be a fetch behind)
REPLICA_ISR_WAIT_S = 30.0
REPLICA_COPY_WAIT_S = 10.0


@dataclass
class Options:
    seconds: float = 60.0
    seed: int = 0
    faults: tuple[str, ...] = FAULTS
    writers: int = 2  # of each kind
    settle_s: float = 3.0
    keep: Path | None = None
    # copies of each shard (``--replication-factor``); 1: one copy, moved by hand-overs
    replication_factor: int = 1
    # how partitions are made: "netns" (root), "proxy", or "auto" (netns when it can run)
    network: str = "auto"


@dataclass
class RunResult:
    seed: int
    report: Report
    injected: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    kept: Path | None = None


def _start_clients(
    cluster: NemesisCluster, options: Options, base: Path
) -> list[subprocess.Popen[bytes]]:
    nodes = ",".join(cluster.endpoint(i) for i in range(len(cluster.nodes)))
    script = str(_HERE / "clients.py")
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "no_proxy")}
    commands = [
        [script, "writer", "--kind", kind, "--process", f"{kind}-{i}"]
        for kind in ("loghub", "sdk")
        for i in range(options.writers)
    ] + [[script, "reader"]]
    procs = []
    for command in commands:
        name = command[-1] if command[1] == "writer" else "reader"
        with open(base / f"{name}.err", "wb") as errors:  # the child keeps its own copy
            procs.append(
                subprocess.Popen(
                    [sys.executable, *command, "--nodes", nodes, "--seed", str(options.seed),
                     "--history", str(base / f"history-{name}.jsonl")],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                )
            )  # fmt: skip
    return procs


def _stop_clients(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM: each finishes its op in flight; one that takes too long is killed, and its
    op reads as never completed (info)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + WRITER_STOP_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def run_once(options: Options, log: Callable[[str], None] = print) -> RunResult:
    """One run: cluster, clients, faults, heal, final reads, checks. A failed run keeps
    its histories, final reads and server logs (not the shards' files); so does a run that
    raised, whose directory is named in the log."""
    started = time.monotonic()
    network, why = resolve_network(options.network)
    base = Path(tempfile.mkdtemp(prefix="loghub-nemesis-"))
    how = network if why == "asked" else f"{network} ({why})"
    log(f"run seed {options.seed} ({options.seconds:.0f} s, faults {','.join(options.faults)}, "
        f"network {how})")  # fmt: skip
    try:
        result = _run(options, network, base, log)
    except BaseException:
        log(f"  the run failed; its files are in {base}")
        raise
    result.wall_s = time.monotonic() - started
    if not result.report.valid or options.keep is not None:
        kept = options.keep or Path(tempfile.gettempdir()) / f"loghub-nemesis-kept-{options.seed}"
        shutil.rmtree(kept, ignore_errors=True)
        # replicas that differ: their files are the evidence, kept whole
        shutil.copytree(base, kept, ignore=None if result.report.replica_differences
                        else _segment_files)  # fmt: skip
        result.kept = kept
    shutil.rmtree(base, ignore_errors=True)
    return result


def _run(options: Options, network: str, base: Path, log: Callable[[str], None]) -> RunResult:
    (base / "cluster").mkdir()
    replicated = options.replication_factor > 1
    faults = tuple(f for f in options.faults if replicated or f not in REPLICATED_FAULTS)
    extra = ("--replication-factor", str(options.replication_factor))
    with nemesis_cluster(base / "cluster", network, extra_args=extra) as cluster:
        with LogHubClient(cluster.nodes[0].endpoint, *next(iter(KEYS.items()))) as client:
            client.create_project(PROJECT, "writes under faults")
            client.create_logstore(PROJECT, LOGSTORE, shard_count=SHARDS)
        cluster.wait_placed(shards=SHARDS)
        with HistoryFile(base / "history-nemesis.jsonl") as history:
            # the two clocks side by side: server logs are in wall-clock time
            history.append(Op("nemesis", "info", "clock", now_ns(),
                              detail={"wall_ns": time.time_ns()}))  # fmt: skip
            nemesis = Nemesis(cluster, random.Random(options.seed), faults, history, log)
            procs = _start_clients(cluster, options, base)
            try:
                nemesis.run(now_ns() + int(options.seconds * 1e9))
                log("  healing")
                nemesis.heal(options.settle_s)
            finally:
                _stop_clients(procs)
        finals = [read_everything(node.endpoint) for node in cluster.nodes]
        replicas = _settled_replicas(cluster, log) if replicated else None
        server_logs = {f"n{i}": node.log_path.read_text(errors="replace")
                       for i, node in enumerate(cluster.nodes)}  # fmt: skip
    for index, final in enumerate(finals):  # kept with the histories, for a diagnosis
        (base / f"final-read-n{index}.json").write_text(json.dumps(final.observations))
    ops = read_history(sorted(base.glob("history-*.jsonl")))
    report = check(ops, [o for final in finals for o in final.observations])
    check_torn_tails(report, ops, server_logs)
    check_handovers(report, ops, server_logs)
    if replicas is not None:
        check_replicas(report, *replicas)
        final_values = {o[3] for final in finals for o in final.observations}
        check_flips(report, ops, server_logs, final_values)
    for index, final in enumerate(finals):
        report.unreadable_after_heal += [f"through n{index}: shard {s}: {e}"
                                         for s, e in final.unreadable.items()]  # fmt: skip
        report.notes += [f"final read through n{index}: {gap}" for gap in final.gaps]
    if report.unreadable_after_heal and report.lost:
        report.notes.append("a lost write may sit in a shard that was unreadable after healing")
    report.notes += nemesis.crashes
    report.notes += [f"{node} refused to start while its old lease lived; started again after "
                     "the TTL" for node in nemesis.restarts_refused]  # fmt: skip
    return RunResult(options.seed, report, nemesis.injected, nemesis.crashes)


def _settled_replicas(
    cluster: NemesisCluster, log: Callable[[str], None]
) -> tuple[dict[int, str], dict[int, dict[str, Copy | None]], list[str], float]:
    """After healing, with the writers stopped: waits (REPLICA_ISR_WAIT_S at most) until
    every shard's ISR holds all its replicas, then (REPLICA_COPY_WAIT_S at most) until each
    shard's copies are byte-identical; returns check_replicas' arguments: the leaders, every
    replica's copy of every shard, the shards whose ISR stayed short, the seconds waited."""
    started = time.monotonic()
    records = {}
    error = ""
    while True:
        try:
            records, error = cluster.replica_records(), ""
        except Exception as exc:  # noqa: BLE001 (etcd should answer; if not, that is the finding)
            records, error = {}, repr(exc)
        short = [r for r in records.values() if set(r.isr) != set(r.replicas)]
        if (records and not short) or time.monotonic() - started > REPLICA_ISR_WAIT_S:
            break
        time.sleep(0.2)
    waited = time.monotonic() - started
    isr_not_full = [f"shard {r.shard_id}: replicas {list(r.replicas)}, ISR {list(r.isr)}, "
                    f"leader {r.leader} in epoch {r.epoch}" for r in short]  # fmt: skip
    if not records:
        isr_not_full.append(f"no replica record readable {error}".strip())
    deadline = time.monotonic() + REPLICA_COPY_WAIT_S
    while True:
        copies: dict[int, dict[str, Copy | None]] = {}
        for shard, record in sorted(records.items()):
            copies[shard] = {}
            for node in record.replicas:
                shard_dir = cluster.shard_dir(int(node.removeprefix("n")), shard)
                copies[shard][node] = None if shard_dir is None else read_copy(shard_dir)
        if all(_identical(by_node) for by_node in copies.values()):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    log(f"  replicas: ISR full after {waited:.1f} s" if not isr_not_full else
        f"  replicas: ISR not full after {waited:.1f} s")  # fmt: skip
    return {s: r.leader for s, r in records.items()}, copies, isr_not_full, waited


def _identical(by_node: dict[str, Copy | None]) -> bool:
    present = list(by_node.values())
    if any(copy is None for copy in present):
        return False
    first = present[0]
    return all(copy_difference(first, copy) is None for copy in present[1:])  # type: ignore[arg-type]


def _segment_files(directory: str, names: list[str]) -> set[str]:
    """The shards' files, left out of a kept run (its histories and server logs are kept)."""
    del directory
    return {n for n in names if n.split(".")[0].isdigit() and len(n.split(".")[0]) == 20}


def _by_fault(results: list[RunResult]) -> dict[str, dict[str, float | int | None]]:
    times: dict[str, list[float]] = {}
    never: dict[str, int] = {}
    for result in results:
        for figure in result.report.failover:
            times.setdefault(figure.fault, [])
            if figure.first_ack_in_ranges_s is None:
                never[figure.fault] = never.get(figure.fault, 0) + 1
            else:
                times[figure.fault].append(figure.first_ack_in_ranges_s)
    return {fault: {"n": len(t) + never.get(fault, 0), "p50": percentile(t, 50),
                    "max": percentile(t, 100)} for fault, t in sorted(times.items())}  # fmt: skip


def total(results: list[RunResult]) -> dict[str, object]:
    figures = [f.first_ack_in_ranges_s for r in results for f in r.report.failover]
    known = [f for f in figures if f is not None]
    replicated = [r for r in results if r.report.replicated]
    duplicates: dict[str, int] = {}
    for result in results:
        for kind, values in result.report.duplicates.items():
            duplicates[kind] = duplicates.get(kind, 0) + len(values)
    return {
        "runs": len(results),
        "invalid_runs": sum(not r.report.valid for r in results),
        "acked_values": sum(r.report.acked_values for r in results),
        "lost": sum(len(r.report.lost) for r in results),
        "lost_during_handover": sum(len(r.report.lost_during_handover) for r in results),
        "inconsistent_offsets": sum(len(r.report.inconsistent) for r in results),
        "duplicates": duplicates,
        "unexpected": sum(len(r.report.unexpected) for r in results),
        "info": sum(r.report.info for r in results),
        "info_found": sum(r.report.info_found for r in results),
        "reads_above_final_hw": sum(len(r.report.reads_above_final_hw) for r in results),
        "unreadable_after_heal": sum(len(r.report.unreadable_after_heal) for r in results),
        "failover_in_ranges_s": {"n": len(figures), "never": len(figures) - len(known),
                                 "p50": percentile(known, 50), "max": percentile(known, 100)},
        "failover_in_ranges_by_fault_s": _by_fault(results),
        "leader_loss_failover_s": leader_loss_failover(
            [f for r in results for f in r.report.failover]),
        **({"replicas": {
                "shards": sum(r.report.replica_shards for r in replicated),
                "identical": sum(r.report.replica_shards_identical for r in replicated),
                "differing_copies": sum(len(r.report.replica_differences) for r in replicated),
                "isr_not_full": sum(len(r.report.isr_not_full) for r in replicated),
                "runs_all_identical": sum(not r.report.replica_differences
                                          and not r.report.isr_not_full for r in replicated)},
            "flipped_bytes": {"n": sum(r.report.flips for r in replicated),
                              "detected": sum(r.report.flips_detected for r in replicated),
                              "repaired": sum(r.report.flips_repaired for r in replicated)}}
           if replicated else {}),
        "node_crashes": sum(len(r.crashes) for r in results),
    }  # fmt: skip


def _terminated(signum: int, _frame: object) -> None:
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    # SIGTERM (a timeout, make interrupted) unwinds as Ctrl-C does: the cluster's processes
    # are stopped and its network namespaces, veths and bridge deleted on the way out
    signal.signal(signal.SIGTERM, _terminated)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--writers", type=int, default=2, help="writers of each client kind")
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--keep", type=Path, default=None, help="copy each run's histories here")
    parser.add_argument("--replication-factor", type=int, default=1, help="copies of each shard")
    parser.add_argument("--network", choices=NETWORKS, default="auto",
                        help="how partitions are made: network namespaces and nft rules "
                             "(netns, root only), userspace TCP proxies (proxy), or netns when "
                             "it can run (auto)")  # fmt: skip
    args = parser.parse_args(argv)
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}; known: {','.join(FAULTS)}")
    seed = args.seed if args.seed is not None else int(os.environ.get("LOGHUB_SEED", "0") or 0)
    seed = seed or random.SystemRandom().randrange(1, 2**31)
    try:
        network, why = resolve_network(args.network)  # once: every run uses the same backend
    except NetnsError as exc:
        parser.error(str(exc))
    print(f"nemesis: {args.runs} runs x {args.seconds:.0f} s, network {network} ({why}), "
          f"base seed {seed} (LOGHUB_SEED={seed} replays; run i uses seed {seed}+i)",
          flush=True)  # fmt: skip
    results = []
    aborted: list[str] = []  # runs that raised: no verdict, and the campaign fails
    for run in range(args.runs):
        keep = args.keep / f"run-{seed + run}" if args.keep else None
        options = Options(args.seconds, seed + run, faults, args.writers, args.settle, keep,
                          args.replication_factor, network)  # fmt: skip
        try:
            result = run_once(options, log=lambda line: print(line, flush=True))
        except Exception as exc:  # noqa: BLE001 (the next runs still tell what they find)
            traceback.print_exc()
            aborted.append(f"seed {seed + run}: {type(exc).__name__}: {str(exc)[:300]}")
            print(f"  run {run + 1}/{args.runs} seed {seed + run}: ABORTED, no verdict",
                  flush=True)  # fmt: skip
            continue
        results.append(result)
        print(format_report(result.report), flush=True)
        print(f"  summary: {result.report.summary()}", flush=True)
        kept = f", histories kept in {result.kept}" if result.kept else ""
        print(f"  run {run + 1}/{args.runs} seed {result.seed}: {result.wall_s:.0f} s wall{kept}",
              flush=True)  # fmt: skip
    totals = total(results)
    print(f"total: {totals}", flush=True)
    figures = totals["leader_loss_failover_s"]
    print(f"failover after a leader's loss (fault -> first ack in its ranges), over "
          f"{figures['n']} faults ({figures['never']} never): p50 {figures['p50']} s, "
          f"p99 {figures['p99']} s, max {figures['max']} s", flush=True)  # fmt: skip
    if "replicas" in totals:
        print(f"replicas byte-identical after healing: {totals['replicas']}; "
              f"flipped bytes: {totals['flipped_bytes']}", flush=True)  # fmt: skip
    if aborted:
        print(f"aborted runs (no verdict): {len(aborted)}", flush=True)
        for line in aborted:
            print(f"  {line}", flush=True)
    return 0 if all(r.report.valid for r in results) and not aborted else 1


if __name__ == "__main__":
    sys.exit(main())
