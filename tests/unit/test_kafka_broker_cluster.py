"""The Kafka broker as one node of a cluster, with the cluster's view replaced by a fixed one:
Metadata names each shard's holder as the partition's leader, requests for partitions held
elsewhere and for groups coordinated elsewhere are refused with the errors that send Kafka
clients to the right node, and a produce to a read-only partition reaches a writable shard
wherever it is."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loghub._clock import SystemClock
from loghub.cluster.membership import NodeInfo
from loghub.kafka.broker import Broker, BrokerConfig, Session
from loghub.kafka.cluster import BrokerAddress, KafkaCluster
from loghub.server.config import ServerConfig
from loghub.server.service import LogHubService
from loghub.wire.kafka.codec import RequestHeader
from loghub.wire.kafka.records import Record, build_batch

TOPIC = "proj.logs"
THIS = BrokerAddress(1, "h1", 9001, None)
OTHER = BrokerAddress(2, "h2", 9002, "r2")


class FixedCluster(KafkaCluster):
    """A cluster whose placement is set by the test: shard -> (leader or None, holder)."""

    def __init__(self) -> None:
        self.this = THIS
        self.placed: dict[int, tuple[int | None, int]] = {}
        self.local: list[int] = []
        self.group_coordinator: BrokerAddress | None = THIS
        self.remote_appends: list[tuple[str, int]] = []

    def brokers(self) -> list[BrokerAddress]:
        return [THIS, OTHER]

    def leader(self, project: str, logstore: str, shard_id: int) -> tuple[int | None, int]:
        return self.placed.get(shard_id, (None, -1))

    def serves(self, project: str, logstore: str, shard_id: int) -> bool:
        return self.placed.get(shard_id, (None, -1))[0] == THIS.broker_id

    def local_writable(self, project: str, logstore: str, writable: list[int]) -> list[int]:
        return [s for s in writable if s in self.local]

    def owner_node(self, project: str, logstore: str, shard_id: int) -> NodeInfo | None:
        return NodeInfo("n2", "h2:8080", kafka="h2:9002")

    def controller_id(self) -> int:
        return OTHER.broker_id

    def coordinator(self, group_id: str) -> BrokerAddress | None:
        return self.group_coordinator

    def append_remote(
        self, node: NodeInfo, project: str, logstore: str, shard_id: int, raw: bytes
    ) -> None:
        self.remote_appends.append((node.node_id, shard_id))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Broker, FixedCluster, LogHubService]]:
    service = LogHubService(ServerConfig(data_dir=tmp_path / "data", port=0), SystemClock())
    service.metadata.create_project("proj", "")
    service.create_logstore("proj", {"logstoreName": "logs", "shardCount": 3})
    cluster = FixedCluster()
    broker = Broker(service, BrokerConfig("h1", 9001), SystemClock(), cluster)
    try:
        yield broker, cluster, service
    finally:
        broker.close()
        service.close()


def header(api_key: int, version: int) -> RequestHeader:
    return RequestHeader(api_key, version, 1, "test")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def produce(broker: Broker, partition: int) -> dict[str, Any]:
    batch = build_batch(0, [Record(int(time.time() * 1000), None, b"v", (), 0)])
    request = {
        "Acks": -1,
        "TimeoutMs": 1000,
        "TopicData": [{"Name": TOPIC, "PartitionData": [{"Index": partition, "Records": batch}]}],
    }
    answer = run(broker._produce(request, header(0, 8), Session("c")))
    partition_answer: dict[str, Any] = answer["Responses"][0]["PartitionResponses"][0]
    return partition_answer


def test_metadata_names_each_shards_holder_and_no_leader_for_a_gone_or_unplaced_one(
    node: tuple[Broker, FixedCluster, LogHubService],
) -> None:
    broker, cluster, _service = node
    cluster.placed = {0: (1, 1), 1: (None, 2)}  # shard 1's node is gone; 2 is not placed
    answer = run(broker._metadata({"Topics": [{"Name": TOPIC}]}, header(3, 8), Session("c")))
    assert [(b["NodeId"], b["Host"], b["Port"], b["Rack"]) for b in answer["Brokers"]] == [
        (1, "h1", 9001, None),
        (2, "h2", 9002, "r2"),
    ]
    assert answer["ControllerId"] == 2
    partitions = {p["PartitionIndex"]: p for p in answer["Topics"][0]["Partitions"]}
    assert (partitions[0]["ErrorCode"], partitions[0]["LeaderId"]) == (0, 1)
    assert partitions[0]["IsrNodes"] == [1] and partitions[0]["OfflineReplicas"] == []
    assert (partitions[1]["ErrorCode"], partitions[1]["LeaderId"]) == (5, -1)
    assert partitions[1]["ReplicaNodes"] == [2] and partitions[1]["OfflineReplicas"] == [2]
    assert (partitions[2]["ErrorCode"], partitions[2]["LeaderId"]) == (5, -1)
    assert partitions[2]["ReplicaNodes"] == []


def test_produce_fetch_and_list_offsets_for_a_partition_held_elsewhere_are_refused(
    node: tuple[Broker, FixedCluster, LogHubService], tmp_path: Path
) -> None:
    broker, cluster, _service = node
    cluster.placed = {0: (1, 1), 1: (2, 2)}
    assert produce(broker, 0)["ErrorCode"] == 0
    assert produce(broker, 1)["ErrorCode"] == 6  # NOT_LEADER_OR_FOLLOWER
    assert produce(broker, 9)["ErrorCode"] == 3  # UNKNOWN_TOPIC_OR_PARTITION
    fetch = {
        "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1 << 20,
        "Topics": [{"Topic": TOPIC, "Partitions": [
            {"Partition": p, "FetchOffset": 0, "PartitionMaxBytes": 1 << 20} for p in (0, 1)]}],
    }  # fmt: skip
    answer = run(broker._fetch(fetch, header(1, 11), Session("c")))
    errors = [p["ErrorCode"] for p in answer["Responses"][0]["Partitions"]]
    assert errors == [0, 6]
    offsets = {"Topics": [{"Name": TOPIC, "Partitions": [
        {"PartitionIndex": p, "Timestamp": -1} for p in (0, 1)]}]}  # fmt: skip
    answer = run(broker._list_offsets(offsets, header(2, 5), Session("c")))
    assert [p["ErrorCode"] for p in answer["Topics"][0]["Partitions"]] == [0, 6]
    # nothing of shard 1 was opened or written on this node (a shard's directory is its id)
    shard_dirs = {p.name for p in (tmp_path / "data").rglob("*") if p.is_dir()}
    assert "0" in shard_dirs and "1" not in shard_dirs


def test_group_requests_reaching_a_node_that_does_not_coordinate_the_group_are_refused(
    node: tuple[Broker, FixedCluster, LogHubService],
) -> None:
    broker, cluster, _service = node
    cluster.group_coordinator = OTHER
    found = run(broker._find_coordinator({"Key": "g", "KeyType": 0}, header(10, 2), Session("c")))
    assert (found["ErrorCode"], found["NodeId"], found["Host"], found["Port"]) == (
        0, 2, "h2", 9002,
    )  # fmt: skip
    found = run(
        broker._find_coordinator({"CoordinatorKeys": ["g"], "KeyType": 0}, header(10, 4),
                                 Session("c"))
    )  # fmt: skip
    assert found["Coordinators"][0]["NodeId"] == 2
    join = {
        "GroupId": "g", "SessionTimeoutMs": 6000, "RebalanceTimeoutMs": 6000, "MemberId": "",
        "ProtocolType": "consumer", "Protocols": [{"Name": "range", "Metadata": b""}],
    }  # fmt: skip
    assert run(broker._join_group(join, header(11, 5), Session("c")))["ErrorCode"] == 16
    sync = {"GroupId": "g", "GenerationId": 1, "MemberId": "m", "Assignments": []}
    assert run(broker._sync_group(sync, header(14, 3), Session("c")))["ErrorCode"] == 16
    beat = {"GroupId": "g", "GenerationId": 1, "MemberId": "m"}
    assert run(broker._heartbeat(beat, header(12, 3), Session("c")))["ErrorCode"] == 16
    commit = {"GroupId": "g", "GenerationIdOrMemberEpoch": 1, "MemberId": "m", "Topics": [
        {"Name": TOPIC, "Partitions": [{"PartitionIndex": 0, "CommittedOffset": 0}]}]}  # fmt: skip
    answer = run(broker._offset_commit(commit, header(8, 7), Session("c")))
    assert answer["Topics"][0]["Partitions"][0]["ErrorCode"] == 16
    fetched = {"GroupId": "g", "Topics": [{"Name": TOPIC, "PartitionIndexes": [0]}]}
    answer = run(broker._offset_fetch(fetched, header(9, 5), Session("c")))
    assert answer["ErrorCode"] == 16
    assert answer["Topics"][0]["Partitions"][0]["ErrorCode"] == 16
    # no coordinator now (no controller elected)
    cluster.group_coordinator = None
    found = run(broker._find_coordinator({"Key": "g", "KeyType": 0}, header(10, 2), Session("c")))
    assert found["ErrorCode"] == 15  # COORDINATOR_NOT_AVAILABLE


def test_a_produce_to_a_read_only_partition_goes_to_a_writable_shard_here_or_elsewhere(
    node: tuple[Broker, FixedCluster, LogHubService],
) -> None:
    broker, cluster, service = node
    service.split_shard("proj", "logs", 0, None)  # shard 0 turns read-only; 3 and 4 take writes
    cluster.placed = {0: (1, 1), 1: (2, 2), 2: (2, 2), 3: (2, 2), 4: (2, 2)}
    answer = produce(broker, 0)
    assert (answer["ErrorCode"], answer["BaseOffset"]) == (0, -1)
    assert len(cluster.remote_appends) == 1 and cluster.remote_appends[0][0] == "n2"
    assert cluster.remote_appends[0][1] in (1, 2, 3, 4)
    cluster.placed[3] = (1, 1)
    cluster.local = [3]
    assert produce(broker, 0)["ErrorCode"] == 0
    assert len(cluster.remote_appends) == 1  # written here, to shard 3
    assert service.shard_range("proj", "logs", 3) == (0, 1)


def test_before_the_node_has_joined_it_leads_nothing_and_names_no_coordinator() -> None:
    """The Kafka listener opens before the node's agent has started: its view is empty, and
    requests get the errors that make clients retry, never a crash."""
    from loghub.server.cluster_routing import ClusterRouting

    routing = ClusterRouting(
        "etcd://127.0.0.1:1", NodeInfo("n1", "h1:8080"), None, service_stub(), 3
    )
    view = KafkaCluster(routing, THIS)
    assert view.brokers() == [THIS]
    assert view.leader("proj", "logs", 0) == (None, -1)
    assert not view.serves("proj", "logs", 0)
    assert view.coordinator("g") is None and view.controller_id() == -1


def service_stub() -> Any:
    class Logs:
        def seal_log(self, project: str, logstore: str, shard_id: int) -> int:
            raise AssertionError("not called")

    return Logs()
