"""Replication on a real cluster: 3 etcd members and 3 `loghub serve --cluster
--replication-factor 3` nodes on loopback ports, driven with LogHub's client.

Checked here: a write is on every replica's disk when it is acknowledged and the replicas'
logs are byte-identical; a leader killed with SIGKILL is replaced by an in-sync replica
within seconds, no acknowledged write is lost and none of the idempotent client's retries
is stored twice; with one replica left in sync writes are
refused, not acknowledged on one copy; a restarted replica catches up and rejoins the ISR;
a drained node hands its leaderships over with no write refused.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_nodes import NODE_TTL_S, LogHubCluster, running_cluster

from loghub.client import LogHubClient
from loghub.cluster.etcd_store import EtcdStore
from loghub.cluster.replicas import ReplicaRecord, read_replica_records_at
from loghub.errors import LogHubError
from loghub.wire.cursor import decode_cursor
from loghub.wire.logs import make_log_group
from loghub.wire.producer_ids import ProducerIds, WriteId

KEYS = {"ak": "sk"}
PROJECT = "replicated"
ARGS = ("--replication-factor", "3", "--min-insync-replicas", "2", "--replica-lag-ms", "1500")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LogHubCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("replicated"), 3, KEYS, extra_args=ARGS
    ) as running:
        try:
            client(running, 0).create_project(PROJECT, "replicated shards")
            yield running
        finally:
            for made in _clients.values():
                made.close()
            _clients.clear()


@pytest.fixture(autouse=True)
def every_node_running_after(cluster: LogHubCluster) -> Iterator[None]:
    """Starts again the nodes a test killed and did not bring back (it failed half-way):
    the next test then finds three nodes, and fails, if it does, for its own reasons."""
    yield
    for index in range(len(cluster.nodes)):
        if not alive(cluster, index):
            cluster.start_node(index)


_clients: dict[tuple[str, float], LogHubClient] = {}


def client(cluster: LogHubCluster, index: int, timeout_s: float = 10.0) -> LogHubClient:
    """A client of node ``index`` (one per node and timeout, closed with the cluster)."""
    key = (cluster.nodes[index].endpoint, timeout_s)
    if key not in _clients:
        _clients[key] = LogHubClient(key[0], "ak", "sk", timeout_s=timeout_s)
    return _clients[key]


def records(cluster: LogHubCluster, logstore: str) -> dict[int, ReplicaRecord]:
    async def read() -> dict[int, ReplicaRecord]:
        async with EtcdStore(cluster.etcd.url) as store:
            found, _revision = await read_replica_records_at(store)
        return {k[2]: r for k, r in found.items() if k[:2] == (PROJECT, logstore)}

    return asyncio.run(read())


def wait_for(check, timeout_s: float = 20.0, what: str = "") -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def index_of(node_id: str) -> int:
    return int(node_id.removeprefix("n"))


def put(
    writer: LogHubClient, logstore: str, value: str, shard_id: int, write_id: WriteId | None = None
) -> None:
    group = make_log_group([(int(time.time()), {"v": value})])
    writer.put_log_group(PROJECT, logstore, group, shard_id=shard_id, write_id=write_id)


class Writers:
    """One thread per node index, writing ``<prefix><index>-<n>`` to shard ``n % shards``
    of ``logstore`` until ``stop``; the values acknowledged and the failures, in order."""

    def __init__(
        self, cluster: LogHubCluster, logstore: str, indexes: list[int], prefix: str, shards: int
    ) -> None:
        self.acked: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._write, args=(cluster, logstore, i, prefix, shards))
            for i in indexes
        ]
        for thread in self._threads:
            thread.start()

    def _write(
        self, cluster: LogHubCluster, logstore: str, index: int, prefix: str, shards: int
    ) -> None:
        writer = LogHubClient(cluster.nodes[index].endpoint, "ak", "sk", timeout_s=10.0)
        n = 0
        while not self._stop.is_set():
            value = f"{prefix}{index}-{n}"
            n += 1
            try:
                put(writer, logstore, value, n % shards)
                self.acked.append(value)
            except LogHubError as exc:
                self.failures.append(f"{value}: {exc}")
        writer.close()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def read_values(reader: LogHubClient, logstore: str, shard_id: int) -> list[str]:
    cursor = reader.get_cursor(PROJECT, logstore, shard_id, "begin")
    values = []
    for result in reader.iter_pull(PROJECT, logstore, shard_id, cursor):
        for group in result.log_group_list.LogGroups:
            for log in group.Logs:
                values += [c.Value for c in log.Contents if c.Key == "v"]
    return values


def shard_files(cluster: LogHubCluster, index: int, logstore: str, shard_id: int) -> bytes:
    """The node's segment files of the shard, concatenated in order."""
    base = cluster.nodes[index].data_dir / "shards" / PROJECT
    found = [d for d in base.glob(f"{logstore}-*/{shard_id}") if d.is_dir()]
    assert len(found) == 1, found
    return b"".join(p.read_bytes() for p in sorted(found[0].glob("*.log")))


def identical_everywhere(cluster: LogHubCluster, logstore: str, shard_id: int) -> bool:
    copies = {shard_files(cluster, i, logstore, shard_id) for i in range(len(cluster.nodes))}
    return len(copies) == 1


def alive(cluster: LogHubCluster, index: int) -> bool:
    proc = cluster.nodes[index].proc
    return proc is not None and proc.poll() is None


def test_an_acknowledged_write_is_on_every_replica(cluster: LogHubCluster) -> None:
    client(cluster, 0).create_logstore(PROJECT, "copies", shard_count=2)
    wait_for(lambda: len(records(cluster, "copies")) == 2, what="replica records")
    placed = records(cluster, "copies")
    for record in placed.values():
        assert sorted(record.replicas) == ["n0", "n1", "n2"] and set(record.isr) == {
            "n0",
            "n1",
            "n2",
        }
        assert record.epoch == 1 and record.leader == record.replicas[0]
    assert {r.leader for r in placed.values()} != {placed[0].leader} or len(placed) == 1
    written = {0: [], 1: []}
    for n in range(60):
        shard_id = n % 2
        # through every node: the ones that do not lead the shard forward the write
        put(client(cluster, n % 3), "copies", f"c{n}", shard_id)
        written[shard_id].append(f"c{n}")
    for shard_id in (0, 1):
        for index in range(3):
            assert read_values(client(cluster, index), "copies", shard_id) == written[shard_id]
        # acknowledged means in sync: the followers hold it (they fetch it before the ack)
        wait_for(lambda s=shard_id: identical_everywhere(cluster, "copies", s), 5, "copies")


def test_a_follower_fetch_needs_a_node_key(cluster: LogHubCluster) -> None:
    """A fetch reports what a follower holds, which acknowledges writes: a request without
    a valid signature is refused like any other, a malformed one or one from a node that is
    not a follower is a 400, and a fetch for an epoch the node does not lead is refused
    (503, retryable: the follower's view is behind) without effect on the record."""
    import httpx

    from loghub.wire.signing import Credentials, sign_v1

    record = records(cluster, "copies")[0]
    leader = cluster.nodes[index_of(record.leader)]
    follower = next(r for r in record.replicas if r != record.leader)
    path = "/logstores/copies/shards/0"

    def fetch(signed: bool, **params: object) -> httpx.Response:
        query = [("type", "replica")] + [(k, str(v)) for k, v in params.items()]
        headers = {"host": f"{PROJECT}.{leader.endpoint}", "x-log-apiversion": "0.6.0",
                   "x-log-bodyrawsize": "0"}  # fmt: skip
        if signed:
            sign_v1("GET", path, query, headers, b"", Credentials("ak", "sk"), time.time())
        url = f"http://{leader.endpoint}{path}?" + "&".join(f"{k}={v}" for k, v in query)
        with httpx.Client() as http:
            return http.get(url, headers=headers)

    valid = {"replica": follower, "leaderEpoch": record.epoch, "offset": 0, "lastEpoch": -1,
             "fsyncedEnd": 0}  # fmt: skip
    assert fetch(False, **valid).status_code == 401
    for wrong in ({"replica": "n9"}, {"replica": record.leader}, {"leaderEpoch": -1},
                  {"offset": "x"}, {"fsyncedEnd": 5}, {"lastEpoch": -2},
                  {"lastEpoch": -1, "offset": 3, "fsyncedEnd": 0}):  # fmt: skip
        reply = fetch(True, **{**valid, **wrong})
        assert reply.status_code == 400, (wrong, reply.text)
        assert reply.json()["errorCode"] == "ParameterInvalid"
    stale = fetch(True, **{**valid, "leaderEpoch": record.epoch + 5})
    assert stale.status_code == 503 and stale.json()["errorCode"] == "ServerBusy"
    assert records(cluster, "copies")[0] == record


def test_leader_sigkill_fails_over_to_an_in_sync_replica_without_loss(
    cluster: LogHubCluster,
) -> None:
    client(cluster, 0).create_logstore(PROJECT, "failover", shard_count=1)
    wait_for(lambda: len(records(cluster, "failover")) == 1, what="replica record")
    before = records(cluster, "failover")[0]
    victim = index_of(before.leader)
    survivors = [i for i in range(3) if i != victim]
    acked: list[str] = []
    acked_at: list[float] = []
    stop = threading.Event()

    def write(index: int) -> None:
        # LogHub's idempotent writes: each value has a write id, kept over its retries
        writer = LogHubClient(cluster.nodes[index].endpoint, "ak", "sk", timeout_s=3.0)
        ids = ProducerIds()
        n = 0
        while not stop.is_set():
            value, write_id = f"w{index}-{n}", ids.next()
            n += 1
            while not stop.is_set():
                try:
                    put(writer, "failover", value, 0, write_id)
                except LogHubError:
                    time.sleep(0.05)
                    continue
                acked.append(value)
                acked_at.append(time.monotonic())
                break
        writer.close()

    threads = [threading.Thread(target=write, args=(i,)) for i in survivors]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(acked) >= 50, what="writes before the kill")
    os.kill(cluster.nodes[victim].pid, signal.SIGKILL)
    cluster.nodes[victim].proc.wait()  # type: ignore[union-attr]
    killed_at = time.monotonic()  # gone: every later ack comes from the new leader
    wait_for(lambda: acked_at[-1] > killed_at + 0.5, 30, "a write after the failover")
    stop.set()
    for thread in threads:
        thread.join()
    first_after = min(t for t in acked_at if t > killed_at)
    after = records(cluster, "failover")[0]
    assert after.leader != before.leader and after.epoch == before.epoch + 1
    assert before.leader not in after.isr
    print(f"leader SIGKILL -> first acknowledged write: {first_after - killed_at:.2f} s")
    assert first_after - killed_at < NODE_TTL_S + 6
    reader = client(cluster, survivors[0])
    stored = read_values(reader, "failover", 0)
    assert not set(acked) - set(stored), "acknowledged writes lost"
    duplicates = [v for v, count in Counter(stored).items() if count > 1]
    assert duplicates == [], "a retried write stored twice"
    # the killed leader comes back as a follower, cuts what it alone had, and catches up
    cluster.start_node(victim)
    wait_for(lambda: set(records(cluster, "failover")[0].isr) == {"n0", "n1", "n2"}, 30, "ISR")
    wait_for(lambda: identical_everywhere(cluster, "failover", 0), 10, "identical replicas")
    assert read_values(client(cluster, victim), "failover", 0) == stored


def test_writes_are_refused_with_one_replica_in_sync_and_resume_when_one_returns(
    cluster: LogHubCluster,
) -> None:
    client(cluster, 0).create_logstore(PROJECT, "minisr", shard_count=1)
    wait_for(lambda: len(records(cluster, "minisr")) == 1, what="replica record")
    wait_for(lambda: all(alive(cluster, i) for i in range(3)), what="three nodes")
    leader = index_of(records(cluster, "minisr")[0].leader)
    put(client(cluster, leader), "minisr", "before", 0)
    followers = [i for i in range(3) if i != leader]
    for index in followers:
        os.kill(cluster.nodes[index].pid, signal.SIGKILL)
        cluster.nodes[index].proc.wait()  # type: ignore[union-attr]
    wait_for(lambda: records(cluster, "minisr")[0].isr == (f"n{leader}",), 20, "ISR shrink")
    with pytest.raises(LogHubError) as refused:
        put(client(cluster, leader), "minisr", "alone", 0)
    assert refused.value.code == "ServerBusy" and "min_insync_replicas" in str(refused.value)
    cluster.start_node(followers[0])
    wait_for(lambda: len(records(cluster, "minisr")[0].isr) == 2, 30, "ISR growth")
    put(client(cluster, leader), "minisr", "after", 0)
    assert read_values(client(cluster, leader), "minisr", 0) == ["before", "after"]
    cluster.start_node(followers[1])
    wait_for(lambda: len(records(cluster, "minisr")[0].isr) == 3, 30, "all back")


def test_a_drained_node_hands_its_leaderships_over_with_no_write_refused(
    cluster: LogHubCluster,
) -> None:
    client(cluster, 0).create_logstore(PROJECT, "drain", shard_count=3)
    wait_for(lambda: len(records(cluster, "drain")) == 3, what="replica records")
    wait_for(lambda: all(len(r.isr) == 3 for r in records(cluster, "drain").values()), 30, "ISR")
    target = records(cluster, "drain")[0].leader
    others = [i for i in range(3) if f"n{i}" != target]
    writers = Writers(cluster, "drain", others, "d", 3)
    try:
        wait_for(lambda: len(writers.acked) >= 30, what="writes before the drain")
        drained = _loghub_cli(cluster, "node", "drain", target)
        assert drained.returncode == 0, drained.stderr
        wait_for(
            lambda: all(r.leader != target for r in records(cluster, "drain").values()),
            20,
            "leaderships moved",
        )
        count = len(writers.acked)
        wait_for(lambda: len(writers.acked) > count + 20, 10, "writes after the move")
    finally:
        writers.stop()
        _loghub_cli(cluster, "node", "undrain", target)
    failures, acked = writers.failures, writers.acked
    assert failures == []
    reader = client(cluster, others[0])
    stored = [v for s in range(3) for v in read_values(reader, "drain", s)]
    assert sorted(stored) == sorted(acked)


def _loghub_cli(cluster: LogHubCluster, *args: str):  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "loghub", *args, "--cluster", cluster.etcd.url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")},
    )


def test_a_node_stopped_with_sigterm_hands_its_leaderships_over_first(
    cluster: LogHubCluster,
) -> None:
    """Kafka's controlled shutdown: a node asked to stop moves each shard it leads to an
    in-sync replica while it still answers, so writes through the other nodes never fail."""
    client(cluster, 0).create_logstore(PROJECT, "sigterm", shard_count=3)
    wait_for(lambda: len(records(cluster, "sigterm")) == 3, what="replica records")
    wait_for(lambda: all(alive(cluster, i) for i in range(3)), what="three nodes")
    wait_for(lambda: all(len(r.isr) == 3 for r in records(cluster, "sigterm").values()), 30, "ISR")
    target = records(cluster, "sigterm")[0].leader
    victim = index_of(target)
    others = [i for i in range(3) if i != victim]
    writers = Writers(cluster, "sigterm", others, "t", 3)
    try:
        wait_for(lambda: len(writers.acked) >= 30, what="writes before the stop")
        cluster.nodes[victim].stop()  # SIGTERM, and wait for the exit
        after = records(cluster, "sigterm")
        assert all(r.leader != target for r in after.values()), after
        count = len(writers.acked)
        wait_for(lambda: len(writers.acked) > count + 20, 10, "writes after the stop")
    finally:
        writers.stop()
    failures, acked = writers.failures, writers.acked
    assert failures == []
    stored = [v for s in range(3) for v in read_values(client(cluster, others[0]), "sigterm", s)]
    assert sorted(stored) == sorted(acked)
    cluster.start_node(victim)
    wait_for(
        lambda: all(len(r.isr) == 3 for r in records(cluster, "sigterm").values()), 30, "rejoin"
    )


def test_split_and_merge_of_replicated_shards(cluster: LogHubCluster) -> None:
    """The children of a split, and the shard a merge makes, are placed with full replica
    sets; the parents stay readable through any node, every write in its place."""
    client(cluster, 0).create_logstore(PROJECT, "reshard", shard_count=1)
    wait_for(lambda: len(records(cluster, "reshard")) == 1, what="replica record")
    wait_for(lambda: all(alive(cluster, i) for i in range(3)), what="three nodes")
    writer = client(cluster, 1)
    for n in range(20):
        put(writer, "reshard", f"before{n}", 0)
    parent, left, right = writer.split_shard(PROJECT, "reshard", 0)
    assert parent.shard_id == 0 and not parent.writable
    wait_for(lambda: {left.shard_id, right.shard_id} <= set(records(cluster, "reshard")), 20,
             "children placed")  # fmt: skip
    children = records(cluster, "reshard")
    for child in (left.shard_id, right.shard_id):
        assert len(children[child].replicas) == 3 and len(children[child].isr) == 3
        for n in range(10):
            put(client(cluster, n % 3), "reshard", f"c{child}-{n}", child)
    merged, _, _ = writer.merge_shard(PROJECT, "reshard", left.shard_id)
    wait_for(lambda: merged.shard_id in records(cluster, "reshard"), 20, "merged shard placed")
    for n in range(10):
        put(client(cluster, n % 3), "reshard", f"m{n}", merged.shard_id)
    for index in range(3):
        reader = client(cluster, index)
        assert read_values(reader, "reshard", 0) == [f"before{n}" for n in range(20)]
        for child in (left.shard_id, right.shard_id):
            assert read_values(reader, "reshard", child) == [f"c{child}-{n}" for n in range(10)]
        assert read_values(reader, "reshard", merged.shard_id) == [f"m{n}" for n in range(10)]


def test_a_consumer_group_reads_through_a_leader_failover(
    cluster: LogHubCluster, tmp_path: Path
) -> None:
    """LogHub's ConsumerWorker (its own process, through a node that stays up) consumes
    two shards while their writes go on and one leader is killed: every acknowledged log is
    processed, and no checkpoint is ever beyond what the shard holds (reads stop at the high
    watermark, so a consumer never sees what a failover takes back)."""
    import json
    import subprocess
    import sys

    client(cluster, 0).create_logstore(PROJECT, "consumed", shard_count=2)
    wait_for(lambda: len(records(cluster, "consumed")) == 2, what="replica records")
    wait_for(lambda: all(alive(cluster, i) for i in range(3)), what="three nodes")
    wait_for(lambda: all(len(r.isr) == 3 for r in records(cluster, "consumed").values()), 30,
             "ISR")  # fmt: skip
    client(cluster, 0).create_consumer_group(PROJECT, "consumed", "readers", 10, False)
    victim = index_of(records(cluster, "consumed")[0].leader)
    through = (victim + 1) % 3
    out = tmp_path / "consumer"
    out.mkdir()
    worker_script = (
        Path(__file__).resolve().parents[1] / "integration" / "loghub_consumer_worker.py"
    )
    consumer = subprocess.Popen(
        [sys.executable, str(worker_script), str(out), cluster.nodes[through].endpoint, PROJECT,
         "consumed", "readers", "w1", "server"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    writer = LogHubClient(cluster.nodes[through].endpoint, "ak", "sk", timeout_s=3.0)
    ids = ProducerIds()
    acked: set[tuple[str, int]] = set()
    try:
        for n in range(300):
            if n == 100:
                os.kill(cluster.nodes[victim].pid, signal.SIGKILL)
                cluster.nodes[victim].proc.wait()  # type: ignore[union-attr]
            key = f"k{n % 2}"
            group = make_log_group([(int(time.time()), {"key": key, "n": str(n)})])
            write_id = ids.next()
            deadline = time.monotonic() + 30
            while True:
                try:
                    writer.put_log_group(PROJECT, "consumed", group, shard_id=n % 2,
                                         write_id=write_id)  # fmt: skip
                    acked.add((key, n))
                    break
                except LogHubError:
                    assert time.monotonic() < deadline, "writes did not resume"
                    time.sleep(0.05)

        def processed() -> set[tuple[str, int]]:
            seen = set()
            for path in out.glob("*.jsonl"):
                for line in path.read_text().splitlines():
                    event = json.loads(line)
                    if event["e"] == "logs":
                        seen |= {(k, n) for k, n, _seq in event["logs"]}
            return seen

        wait_for(lambda: acked <= processed(), 60, "every acknowledged log processed")
    finally:
        consumer.terminate()
        consumer.wait(timeout=30)
        writer.close()
        cluster.start_node(victim)
    ends = {}
    reader = client(cluster, through)
    for shard_id in (0, 1):  # the high watermark: what the shard holds for readers
        ends[shard_id] = decode_cursor(reader.get_cursor(PROJECT, "consumed", shard_id, "end"))
    checkpoints = reader.get_checkpoints(PROJECT, "consumed", "readers")
    assert all(checkpoints.values()), checkpoints
    for shard_id, checkpoint in checkpoints.items():
        assert decode_cursor(checkpoint) <= ends[shard_id], (shard_id, checkpoint, ends)
    wait_for(lambda: all(len(r.isr) == 3 for r in records(cluster, "consumed").values()), 60,
             "the killed node back in sync")  # fmt: skip


def test_a_follower_copy_damaged_on_disk_is_copied_again_from_the_leader(
    cluster: LogHubCluster,
) -> None:
    """A byte flipped in an acknowledged record of a follower's segment (the node stopped,
    the file changed, the node started): the follower finds the damage, cuts its log there
    and copies the rest again, so its copy equals the leader's and reads of it, once it
    leads, return every record."""
    import random
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nemesis"))
    from nemesis import flip_byte

    client(cluster, 0).create_logstore(PROJECT, "flipped", shard_count=1)
    wait_for(lambda: len(records(cluster, "flipped")) == 1, what="replica record")
    wait_for(lambda: all(alive(cluster, i) for i in range(3)), what="three nodes")
    wait_for(lambda: len(records(cluster, "flipped")[0].isr) == 3, 30, "ISR")
    for n in range(20):
        put(client(cluster, 0), "flipped", f"f{n}", 0)
    record = records(cluster, "flipped")[0]
    follower = index_of(next(r for r in record.replicas if r != record.leader))
    cluster.nodes[follower].kill()
    shard_dir = next((cluster.nodes[follower].data_dir / "shards" / PROJECT).glob("flipped-*/0"))
    assert flip_byte(shard_dir, 20, random.Random(1)) is not None
    cluster.start_node(follower)
    wait_for(lambda: identical_everywhere(cluster, "flipped", 0), 30, "the copy repaired")
    assert "lost to damage" in cluster.nodes[follower].log_path.read_text()
    # the repaired copy leads: every record reads back
    others = [f"n{i}" for i in range(3) if i != follower]
    try:
        for node_id in others:
            assert _loghub_cli(cluster, "node", "drain", node_id).returncode == 0
        wait_for(lambda: records(cluster, "flipped")[0].leader == f"n{follower}", 30, "move")
        for index in range(3):
            assert read_values(client(cluster, index), "flipped", 0) == [f"f{n}" for n in range(20)]
    finally:
        for node_id in others:
            _loghub_cli(cluster, "node", "undrain", node_id)


def test_a_reassignment_moves_a_shard_to_another_node_with_no_write_refused(
    cluster: LogHubCluster,
) -> None:
    """Kafka's order: the new replica catches up from nothing and joins the ISR, the leader
    (whose node leaves the set) hands over to a target replica, which ends the move. Runs
    last: it adds a fourth node."""
    client(cluster, 0).create_logstore(PROJECT, "moving", shard_count=1)
    wait_for(lambda: len(records(cluster, "moving")) == 1, what="replica record")
    wait_for(lambda: all(alive(cluster, i) for i in range(3)), what="three nodes")
    wait_for(lambda: len(records(cluster, "moving")[0].isr) == 3, 30, "ISR")
    for n in range(200):
        put(client(cluster, n % 3), "moving", f"m{n}", 0)
    cluster.start_node(3)
    before = records(cluster, "moving")[0]
    leaving = before.leader  # the leader's node leaves: leadership must move first
    target = tuple(r for r in before.replicas if r != leaving) + ("n3",)
    writers = Writers(cluster, "moving", [index_of(target[0])], "r", 1)
    try:
        moved = _loghub_cli(
            cluster, "cluster", "reassign", PROJECT, "moving", "0", "--replicas", ",".join(target)
        )
        assert moved.returncode == 0, moved.stderr
        wait_for(
            lambda: (lambda r: set(r.replicas) == set(target) and not r.target)(
                records(cluster, "moving")[0]
            ),
            30,
            "the reassignment to end",
        )
        count = len(writers.acked)
        wait_for(lambda: len(writers.acked) > count + 20, 10, "writes after the move")
    finally:
        writers.stop()
    failures, acked = writers.failures, [f"m{n}" for n in range(200)] + writers.acked
    after = records(cluster, "moving")[0]
    assert after.leader in target and set(after.isr) == set(target)
    assert failures == []
    wait_for(lambda: _same_copies(cluster, "moving", [index_of(r) for r in target]), 10, "copies")
    assert sorted(read_values(client(cluster, 3), "moving", 0)) == sorted(acked)
    # the node the shard left deletes its copy once the move has ended (after a grace period
    # for requests that reached it while it led); the others keep theirs
    wait_for(lambda: not _copy_dirs(cluster, index_of(leaving), "moving"), 20, "the old copy gone")
    assert all(_copy_dirs(cluster, index_of(r), "moving") for r in target)
    assert sorted(read_values(client(cluster, index_of(leaving)), "moving", 0)) == sorted(acked)


def _copy_dirs(cluster: LogHubCluster, index: int, logstore: str) -> list[Path]:
    base = cluster.nodes[index].data_dir / "shards" / PROJECT
    return [d for d in base.glob(f"{logstore}-*/0") if d.is_dir()]


def _same_copies(cluster: LogHubCluster, logstore: str, indexes: list[int]) -> bool:
    return len({shard_files(cluster, i, logstore, 0) for i in indexes}) == 1
