"""Kafka clients against a 3-node LogHub cluster on a 3-member etcd, every node with a Kafka
listener: clients bootstrapped from one node find every partition's leader, the node holding
its shard, and the group's coordinator; a node that does not hold a partition refuses it with
NOT_LEADER_OR_FOLLOWER; after a node is killed, its partitions have no leader and the
producers go on writing to the others, the shards that took its hash ranges among them."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_nodes import NODE_TTL_S, LogHubCluster, running_cluster
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as CkPartition
from kafka_python_sockets import collected_at_module_end, ignore_unclosed_sockets  # noqa: F401
from server_process import free_port

from loghub.client import LogHubClient
from loghub.cluster.membership import kafka_broker_id
from loghub.cluster.status import set_drain
from loghub.wire.kafka.codec import decode_response, encode_request
from loghub.wire.kafka.records import Record, build_batch

with warnings.catch_warnings():  # kafka-python 3.0 reads its specs with a deprecated call
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), ignore_unclosed_sockets]

PROJECT = "kproj"
NOT_LEADER_OR_FOLLOWER = 6
LEADER_NOT_AVAILABLE = 5
NOT_COORDINATOR = 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LogHubCluster]:
    with running_cluster(tmp_path_factory.mktemp("kcluster"), 3, kafka=True) as running:
        running.wait_placed()
        with LogHubClient(running.nodes[0].endpoint) as client:
            client.create_project(PROJECT, "Kafka clients on a cluster")
        yield running


def bootstrap(cluster: LogHubCluster, index: int) -> str:
    return f"127.0.0.1:{cluster.kafka_ports[index]}"


def call(port: int, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
    """One request on a new connection to the Kafka listener on ``port``, non-flexible
    versions only (header v1, response header v0)."""
    header = struct.pack(">hhih", api_key, version, 7, 4) + b"test"
    payload = header + encode_request(api_key, version, body)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", receive(sock, 4))[0]
        frame = receive(sock, size)
    return decode_response(api_key, version, frame[4:])


def receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def metadata(port: int, topic: str) -> dict[str, Any]:
    return call(port, 3, 8, {"Topics": [{"Name": topic}], "AllowAutoTopicCreation": False})


def leaders(port: int, topic: str) -> dict[int, tuple[int, int]]:
    """Partition -> (error code, leader id), from Metadata sent to ``port``."""
    topics = metadata(port, topic)["Topics"]
    return {p["PartitionIndex"]: (p["ErrorCode"], p["LeaderId"]) for p in topics[0]["Partitions"]}


def produce(port: int, topic: str, partition: int, value: bytes) -> dict[str, Any]:
    batch = build_batch(0, [Record(int(time.time() * 1000), None, value, (), 0)])
    answer = call(port, 0, 8, {
        "Acks": -1, "TimeoutMs": 5000,
        "TopicData": [{"Name": topic, "PartitionData": [{"Index": partition, "Records": batch}]}],
    })  # fmt: skip
    partition_answer: dict[str, Any] = answer["Responses"][0]["PartitionResponses"][0]
    return partition_answer


def fetch_error(port: int, topic: str, partition: int) -> int:
    answer = call(port, 1, 11, {
        "ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1 << 20,
        "IsolationLevel": 0, "SessionId": 0, "SessionEpoch": -1, "RackId": "",
        "Topics": [{"Topic": topic, "Partitions": [{
            "Partition": partition, "CurrentLeaderEpoch": -1, "FetchOffset": 0,
            "LogStartOffset": -1, "PartitionMaxBytes": 1 << 20}]}],
        "ForgottenTopicsData": [],
    })  # fmt: skip
    error: int = answer["Responses"][0]["Partitions"][0]["ErrorCode"]
    return error


def broker_of(node_id: str) -> int:
    return kafka_broker_id(node_id)


def consume_group(
    cluster: LogHubCluster,
    topic: str,
    group: str,
    expected: int,
    timeout_s: float = 25,
    node: int = 0,
) -> list[bytes]:
    """Reads ``expected`` records through group ``group`` (bootstrapped from ``node``),
    commits and leaves."""
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap(cluster, node), group_id=group,
        auto_offset_reset="earliest", enable_auto_commit=False, heartbeat_interval_ms=300,
        session_timeout_ms=6000,
    )  # fmt: skip
    read: list[bytes] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(read) < expected and time.monotonic() < deadline:
            # kafka-python 3.0.12 needs a poll longer than a rebalance (docs/kafka.md)
            for records in consumer.poll(timeout_ms=1500).values():
                read.extend(r.value for r in records)
        consumer.commit()
    finally:
        consumer.close()
    return read


def test_clients_bootstrapped_from_one_node_reach_every_partition_leader(
    cluster: LogHubCluster,
) -> None:
    topic = f"{PROJECT}.spread"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(cluster, 0))
    try:  # kafka-python sends CreateTopics to the controller Metadata names
        admin.create_topics([NewTopic(topic, num_partitions=6, replication_factor=1)])
    finally:
        admin.close()
    cluster.wait_placed(shards=6)
    owners = cluster.owners(PROJECT, "spread")
    status = cluster.status()
    assert len(set(owners.values())) == 3, owners
    # each node's view follows etcd by a watch: on a loaded machine it may be a moment behind
    # the read above; a view that never catches up still fails below
    expected = {shard: (0, broker_of(node)) for shard, node in owners.items()}
    deadline = time.monotonic() + 10
    for index in range(3):
        while leaders(cluster.kafka_ports[index], topic) != expected:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    # Metadata, asked of any node, matches the placement `loghub cluster status` reads
    for index in range(3):
        answer = metadata(cluster.kafka_ports[index], topic)
        brokers = {b["NodeId"]: b["Port"] for b in answer["Brokers"]}
        assert brokers == {broker_of(f"n{i}"): cluster.kafka_ports[i] for i in range(3)}
        assert answer["ControllerId"] == broker_of(str(status["controller"]))
        assert leaders(cluster.kafka_ports[index], topic) == {
            shard: (0, broker_of(node)) for shard, node in owners.items()
        }
    assert {n["node"]: n["kafka_broker_id"] for n in status["nodes"]} == {  # type: ignore[attr-defined]
        f"n{i}": broker_of(f"n{i}") for i in range(3)
    }
    table = subprocess.run(
        [sys.executable, "-m", "loghub", "cluster", "status", "--cluster", cluster.etcd.url],
        capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout  # fmt: skip
    for i in range(3):
        assert f"127.0.0.1:{cluster.kafka_ports[i]} ({broker_of(f'n{i}')})" in table, table
    # a request sent straight to a node that does not hold the partition is refused
    held_by_0 = next(s for s, node in owners.items() if node == "n0")
    elsewhere = next(s for s, node in owners.items() if node != "n0")
    assert produce(cluster.kafka_ports[0], topic, elsewhere, b"x")["ErrorCode"] == (
        NOT_LEADER_OR_FOLLOWER
    )
    assert fetch_error(cluster.kafka_ports[0], topic, elsewhere) == NOT_LEADER_OR_FOLLOWER
    assert produce(cluster.kafka_ports[0], topic, held_by_0, b"direct")["ErrorCode"] == 0

    producer = KafkaProducer(bootstrap_servers=bootstrap(cluster, 0), acks="all")
    sent = [f"v{i}".encode() for i in range(60)]
    futures = [producer.send(topic, value=v, partition=i % 6) for i, v in enumerate(sent)]
    offsets = {(m.partition, m.offset) for m in (f.get(timeout=15) for f in futures)}
    producer.close()
    assert len(offsets) == 60 and {p for p, _ in offsets} == set(range(6))

    read = consume_group(cluster, topic, "spreaders", 61)
    assert sorted(read) == sorted([*sent, b"direct"])
    # a group request to a node that does not coordinate the group is refused, and every
    # node names the same coordinator (the group's, placed like any group: not always the
    # controller)
    named = {
        call(cluster.kafka_ports[i], 10, 2, {"Key": "spreaders", "KeyType": 0})["NodeId"]
        for i in range(3)
    }
    assert len(named) == 1
    coordinator = next(f"n{i}" for i in range(3) if broker_of(f"n{i}") in named)
    other = next(i for i in range(3) if f"n{i}" != coordinator)
    heartbeat = call(cluster.kafka_ports[other], 12, 3,
                     {"GroupId": "spreaders", "GenerationId": 1, "MemberId": "m"})  # fmt: skip
    assert heartbeat["ErrorCode"] == NOT_COORDINATOR
    found = call(cluster.kafka_ports[other], 10, 2, {"Key": "spreaders", "KeyType": 0})
    assert (found["ErrorCode"], found["NodeId"]) == (0, broker_of(coordinator))
    # the commits are checkpoints in etcd: the group resumes after them
    producer = KafkaProducer(bootstrap_servers=bootstrap(cluster, 1), acks="all")
    for i in range(6):
        producer.send(topic, value=f"w{i}".encode(), partition=i).get(timeout=15)
    producer.close()
    assert sorted(consume_group(cluster, topic, "spreaders", 6)) == [
        f"w{i}".encode() for i in range(6)
    ]
    # librdkafka, bootstrapped from another node, writes to and reads from every leader
    producer = Producer({"bootstrap.servers": bootstrap(cluster, 2), "acks": "all"})
    delivered: list[Any] = []
    for i in range(6):
        producer.produce(topic, value=f"ck{i}".encode(), partition=i,
                         on_delivery=lambda err, msg: delivered.append(err))  # fmt: skip
    assert producer.flush(15) == 0 and delivered == [None] * 6
    consumer = Consumer({"bootstrap.servers": bootstrap(cluster, 2), "group.id": "ck-assign"})
    consumer.assign([CkPartition(topic, p, OFFSET_BEGINNING) for p in range(6)])
    values = []
    deadline = time.monotonic() + 20
    while len(values) < 73 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            values.append(message.value())
    consumer.close()
    assert sorted(values) == sorted(
        [*sent, b"direct", *(f"w{i}".encode() for i in range(6)),
         *(f"ck{i}".encode() for i in range(6))]
    )  # fmt: skip


def test_a_produce_to_a_read_only_partition_reaches_a_writable_shard_on_another_node(
    cluster: LogHubCluster,
) -> None:
    """A drained node keeps its read-only partitions and holds no writable shard: a record
    produced to one of them goes, as a PutLogs, to a node that holds a writable shard."""
    topic = f"{PROJECT}.drained"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(cluster, 2))
    try:
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        admin.close()
    deadline = time.monotonic() + 20
    while len(owners := cluster.owners(PROJECT, "drained")) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    drained = int(owners[0][1:])
    asyncio.run(set_drain(cluster.etcd.url, f"n{drained}", True))
    try:
        with LogHubClient(cluster.nodes[drained].endpoint) as client:
            while True:  # its writable shard of the logstore was handed over
                owners = cluster.owners(PROJECT, "drained")
                shards = client.list_shards(PROJECT, "drained")
                writable = [s.shard_id for s in shards if s.status == "readwrite"]
                if shards[0].status == "readonly" and all(
                    owners.get(s, f"n{drained}") != f"n{drained}" for s in writable
                ):
                    break
                assert time.monotonic() < deadline + 20, (owners, shards)
                time.sleep(0.05)
        answer = produce(cluster.kafka_ports[drained], topic, 0, b"redirected")
        assert (answer["ErrorCode"], answer["BaseOffset"]) == (0, -1)
        partitions = sorted(leaders(cluster.kafka_ports[0], topic))
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap(cluster, 0), auto_offset_reset="earliest"
        )
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        found: dict[bytes, int] = {}
        while b"redirected" not in found:
            assert time.monotonic() < deadline + 40
            for records in consumer.poll(timeout_ms=500).values():
                found.update((r.value, r.partition) for r in records)
        consumer.close()
        assert found[b"redirected"] in writable
    finally:
        asyncio.run(set_drain(cluster.etcd.url, f"n{drained}", False))
    cluster.wait_placed()


def test_producers_go_on_after_a_node_is_killed_and_read_everything_when_it_returns(
    cluster: LogHubCluster,
) -> None:
    """A node's SIGKILL: once its lease has expired its partitions have no leader and the
    shards that took their hash ranges are new partitions on the survivors; producers write
    to those. When it returns, it leads its old (read-only) partitions again, a write to one
    of them lands in a writable shard, and a group reads every record."""
    topic = f"{PROJECT}.moves"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(cluster, 1))
    try:
        admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    finally:
        admin.close()
    deadline = time.monotonic() + 20
    while len(owners := cluster.owners(PROJECT, "moves")) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    controller = str(cluster.status()["controller"])
    victim = next(int(node[1:]) for node in owners.values() if node != controller)
    parent = next(shard for shard, node in owners.items() if node == f"n{victim}")
    survivor = next(i for i in range(3) if i != victim)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap(cluster, survivor), acks="all", metadata_max_age_ms=500
    )
    for i in range(9):
        producer.send(topic, value=f"before{i}".encode(), partition=i % 3).get(timeout=15)

    cluster.nodes[victim].kill()
    killed = time.monotonic()
    port = cluster.kafka_ports[survivor]
    while True:  # the victim's partition loses its leader; its child is led by a survivor
        found = leaders(port, topic)
        if len(found) == 4 and found[parent][0] == LEADER_NOT_AVAILABLE and found[3][0] == 0:
            break
        assert time.monotonic() - killed < NODE_TTL_S + 10, found
        time.sleep(0.05)
    moved_s = time.monotonic() - killed
    assert found[parent] == (LEADER_NOT_AVAILABLE, -1)
    assert found[3][1] in {broker_of(f"n{i}") for i in range(3) if i != victim}
    assert produce(port, topic, parent, b"x")["ErrorCode"] == NOT_LEADER_OR_FOLLOWER
    time.sleep(1.0)  # the producer's metadata (500 ms old at most) shows the new partition
    unkeyed = [producer.send(topic, value=f"after{i}".encode()) for i in range(30)]
    used = {future.get(timeout=20).partition for future in unkeyed}
    assert parent not in used and used <= {0, 1, 2, 3} - {parent}
    for i in range(5):
        assert (
            producer.send(topic, value=f"child{i}".encode(), partition=3).get(timeout=15).partition
            == 3
        )

    cluster.start_node(victim)
    returned = time.monotonic()
    while leaders(port, topic)[parent] != (0, broker_of(f"n{victim}")):
        assert time.monotonic() - returned < 30
        time.sleep(0.1)
    time.sleep(1.0)  # the producer's metadata names the returned leader
    for i in range(5):  # a write to the read-only partition goes to a writable shard
        producer.send(topic, value=f"parent{i}".encode(), partition=parent).get(timeout=15)
    producer.close()
    read = consume_group(cluster, topic, "movers", 49)
    assert sorted(read) == sorted(
        [f"{kind}{i}".encode() for kind, count in
         (("before", 9), ("after", 30), ("child", 5), ("parent", 5)) for i in range(count)]
    )  # fmt: skip
    print(f"node SIGKILL -> its partition's child led by a survivor after {moved_s:.2f} s")


def test_a_node_whose_broker_id_a_live_node_has_exits_at_start(
    cluster: LogHubCluster, tmp_path: Path
) -> None:
    clash = str(broker_of("n0"))  # a decimal node id is its own broker id
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "loghub", "serve", "--data-dir", str(tmp_path), "--port",
         str(port), "--cluster", cluster.etcd.url, "--node-id", clash,
         "--kafka-port", str(free_port()), "--node-ttl-s", str(NODE_TTL_S)],
        capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"node ids {clash} and n0 (live) give the same Kafka broker id" in result.stderr
    assert clash not in {n["node"] for n in cluster.status()["nodes"]}  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_group_resumes_from_its_commits_after_its_coordinator_is_killed(
    tmp_path: Path,
) -> None:
    """The coordinator (the controller) is SIGKILLed: another node takes the role, the group
    forms again there and resumes from the offsets it committed (checkpoints in etcd),
    reading only what was written since, the shards that took the dead node's ranges
    included."""
    with running_cluster(tmp_path, 3, kafka=True) as cluster:
        cluster.wait_placed()
        with LogHubClient(cluster.nodes[0].endpoint) as client:
            client.create_project(PROJECT, "")
        topic = f"{PROJECT}.durable"
        admin = KafkaAdminClient(bootstrap_servers=bootstrap(cluster, 0))
        try:
            admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
        finally:
            admin.close()
        cluster.wait_placed(shards=3)
        coordinator = str(cluster.status()["controller"])
        survivor = next(i for i in range(3) if f"n{i}" != coordinator)
        producer = KafkaProducer(
            bootstrap_servers=bootstrap(cluster, survivor), acks="all", metadata_max_age_ms=500
        )
        for i in range(30):
            producer.send(topic, value=f"old{i}".encode(), partition=i % 3).get(timeout=15)
        old = consume_group(cluster, topic, "durable", 30, node=survivor)
        assert sorted(old) == sorted(f"old{i}".encode() for i in range(30))

        cluster.nodes[int(coordinator[1:])].kill()
        killed = time.monotonic()
        port = cluster.kafka_ports[survivor]
        while True:  # a new controller, and a leader for every writable shard
            status = cluster.status()
            found = leaders(port, topic)
            if (
                status["controller"] not in (None, coordinator)
                and len(found) > 3
                and all(error == 0 for p, (error, _l) in found.items() if p >= 3)
            ):
                break
            assert time.monotonic() - killed < NODE_TTL_S + 15, (status, found)
            time.sleep(0.1)
        took_over_s = time.monotonic() - killed
        time.sleep(1.0)  # the producer's metadata shows the new partitions
        futures = [producer.send(topic, value=f"new{i}".encode()) for i in range(20)]
        for future in futures:
            future.get(timeout=20)
        producer.close()
        new = consume_group(cluster, topic, "durable", 20, node=survivor)
        assert sorted(new) == sorted(f"new{i}".encode() for i in range(20))
        print(f"coordinator SIGKILL -> new coordinator and leaders after {took_over_s:.2f} s")
