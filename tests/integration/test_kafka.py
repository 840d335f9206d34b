"""The Kafka listener against the real clients: kafka-python 3.0 and confluent-kafka 2
(librdkafka) talk to a real `loghub serve --kafka-port` child, and the official LogHub SDK
reads and writes the same shards."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from aliyun.log import LogClient, LogItem, PutLogsRequest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient
from kafka_python_sockets import collected_at_module_end, ignore_unclosed_sockets  # noqa: F401
from raw_sockets import kafka_call
from server_process import ServerProcess, free_port

from loghub.wire.kafka.records import Record, build_batch

with warnings.catch_warnings():  # kafka-python 3.0 reads its specs with a deprecated call
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

PROJECT = "kafkaproj"

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), ignore_unclosed_sockets]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    kafka_port = free_port()
    process = ServerProcess(
        tmp_path_factory.mktemp("kafka") / "data",
        extra_args=("--kafka-port", str(kafka_port), "--kafka-initial-rebalance-delay-ms", "100"),
    )
    process.kafka_port = kafka_port  # type: ignore[attr-defined]
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def sdk(server: ServerProcess) -> Iterator[LogClient]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HTTP_PROXY", f"http://{server.endpoint}")
        patch.setenv("http_proxy", f"http://{server.endpoint}")
        for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
            patch.delenv(name, raising=False)
        client = LogClient(server.endpoint, "ak", "sk")
        client.create_project(PROJECT, "kafka")
        yield client


def _bootstrap(server: ServerProcess) -> str:
    return f"127.0.0.1:{server.kafka_port}"  # type: ignore[attr-defined]


def _logstore(sdk: LogClient, name: str, shards: int = 2) -> str:
    sdk.create_logstore(PROJECT, name, ttl=7, shard_count=shards)
    return f"{PROJECT}.{name}"


def _kp_consume(server: ServerProcess, topic: str, partitions: int, expected: int) -> list[Any]:
    consumer = KafkaConsumer(bootstrap_servers=_bootstrap(server), auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    got: list[Any] = []
    deadline = time.monotonic() + 15
    while len(got) < expected and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            got.extend(records)
    consumer.close()
    return got


def _ck_consume(server: ServerProcess, topic: str, partitions: int, expected: int) -> list[Any]:
    from confluent_kafka import OFFSET_BEGINNING
    from confluent_kafka import TopicPartition as CkPartition

    consumer = Consumer({"bootstrap.servers": _bootstrap(server), "group.id": "assign-only"})
    consumer.assign([CkPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got: list[Any] = []
    deadline = time.monotonic() + 15
    while len(got) < expected and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            got.append(message)
    consumer.close()
    return got


def test_kafka_python_produces_with_every_compression_and_reads_back(
    server: ServerProcess, sdk: LogClient
) -> None:
    topic = _logstore(sdk, "kp-produce")
    sent = []
    for codec in (None, "gzip", "snappy", "lz4", "zstd"):
        producer = KafkaProducer(
            bootstrap_servers=_bootstrap(server), acks="all", compression_type=codec
        )
        for i in range(6):
            key = None if i % 2 else f"{codec}-k{i}".encode()
            value = f"{codec} value {i}".encode()
            headers = [("h", f"{i}".encode())]
            producer.send(topic, key=key, value=value, headers=headers).get(timeout=10)
            sent.append((key, value, [("h", f"{i}".encode())]))
        producer.close()
    got = _kp_consume(server, topic, 2, len(sent))
    assert sorted((m.key or b"", m.value, m.headers) for m in got) == sorted(
        (k or b"", v, h) for k, v, h in sent
    )
    # a keyed record lands in the partition the client chose, and offsets increase there
    for partition in (0, 1):
        offsets = [m.offset for m in got if m.partition == partition]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


def test_confluent_kafka_produces_with_every_compression_and_reads_back(
    server: ServerProcess, sdk: LogClient
) -> None:
    topic = _logstore(sdk, "ck-produce")
    sent, failed = [], []
    for codec in ("none", "gzip", "lz4", "zstd", "snappy"):
        producer = Producer(
            {"bootstrap.servers": _bootstrap(server), "acks": "all", "compression.type": codec,
             "message.timeout.ms": 5000, "retries": 0}
        )  # fmt: skip

        def report(error: KafkaError | None, message: Any, codec: str = codec) -> None:
            (failed if error else sent).append((codec, message.key(), message.value(), error))

        for i in range(5):
            key = f"{codec}-{i}".encode() if i % 2 else None
            producer.produce(topic, key=key, value=f"{codec} {i}".encode(), on_delivery=report)
        producer.flush(10)
    assert not failed, failed
    assert {codec for codec, *_ in sent} == {"none", "gzip", "lz4", "zstd", "snappy"}
    got = _ck_consume(server, topic, 2, len(sent))
    assert sorted((m.key() or b"", m.value()) for m in got) == sorted(
        (k or b"", v) for _, k, v, _ in sent
    )


def test_a_group_of_both_clients_shares_the_partitions_and_resumes_from_commits(
    server: ServerProcess, sdk: LogClient
) -> None:
    topic = _logstore(sdk, "groups", shards=4)
    kp = KafkaConsumer(
        topic, bootstrap_servers=_bootstrap(server), group_id="mixed", auto_offset_reset="earliest",
        enable_auto_commit=False, heartbeat_interval_ms=200, session_timeout_ms=6000,
    )  # fmt: skip
    ck = Consumer(
        {"bootstrap.servers": _bootstrap(server), "group.id": "mixed", "auto.offset.reset":
         "earliest", "enable.auto.commit": False, "heartbeat.interval.ms": 200,
         "session.timeout.ms": 6000}
    )  # fmt: skip
    ck.subscribe([topic])
    # both members hold partitions before anything is written. kafka-python's poll must
    # outlast a rebalance: 3.0.12 drops a join that completed between two polls and joins
    # again (its ``_join_task.is_done`` check), which against any broker loops while the
    # other member keeps rejoining (docs/kafka.md)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (kp.assignment() and ck.assignment()):
        kp.poll(timeout_ms=1500)
        ck.poll(0.1)
    kp_parts = {p.partition for p in kp.assignment()}
    ck_parts = {p.partition for p in ck.assignment()}
    if not (kp_parts and ck_parts):
        kp.close()  # no client may go on reconnecting after the server stops
        ck.close()
    assert kp_parts and ck_parts and not kp_parts & ck_parts
    assert kp_parts | ck_parts == {0, 1, 2, 3}

    producer = KafkaProducer(bootstrap_servers=_bootstrap(server), acks="all")
    for i in range(40):
        producer.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    producer.flush()
    read: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(read) < 40 and time.monotonic() < deadline:
        for records in kp.poll(timeout_ms=100).values():
            read.extend(r.value for r in records)
        message = ck.poll(0.1)
        if message is not None and not message.error():
            read.append(message.value())
    assert sorted(read) == sorted(f"v{i}".encode() for i in range(40))  # none lost, none twice
    kp.commit()
    ck.commit(asynchronous=False)
    kp.close()
    ck.close()

    for i in range(40, 45):
        producer.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    producer.close()
    resumed = KafkaConsumer(
        topic, bootstrap_servers=_bootstrap(server), group_id="mixed",
        auto_offset_reset="earliest", heartbeat_interval_ms=200,
    )  # fmt: skip
    again: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(again) < 5 and time.monotonic() < deadline:
        for records in resumed.poll(timeout_ms=200).values():
            again.extend(r.value for r in records)
    resumed.close()
    assert sorted(again) == sorted(f"v{i}".encode() for i in range(40, 45))
    # the commits are LogHub checkpoints of the group of the same name, read to the end
    described = _loghub(server, "group", "describe", "groups", "mixed", "--json")
    assert {s["shard"]: s["lagGroups"] for s in json.loads(described)["shards"]} == {
        0: 0,
        1: 0,
        2: 0,
        3: 0,
    }
    checkpoints = sdk.get_check_point(PROJECT, "groups", "mixed")
    assert {c["shard"] for c in checkpoints.get_consumer_group_check_points()} == {0, 1, 2, 3}


def test_admin_clients_list_topics_and_create_a_logstore(
    server: ServerProcess, sdk: LogClient
) -> None:
    topic = _logstore(sdk, "listed")
    admin = KafkaAdminClient(bootstrap_servers=_bootstrap(server))
    assert topic in admin.list_topics()
    admin.create_topics([NewTopic(f"{PROJECT}.created", num_partitions=3, replication_factor=1)])
    admin.close()
    assert sdk.get_logstore(PROJECT, "created").get_shard_count() == 3
    metadata = AdminClient({"bootstrap.servers": _bootstrap(server)}).list_topics(timeout=10)
    assert len(metadata.topics[f"{PROJECT}.created"].partitions) == 3
    assert topic in metadata.topics


def test_logs_cross_between_the_sdk_and_kafka_with_fields_intact(
    server: ServerProcess, sdk: LogClient
) -> None:
    topic = _logstore(sdk, "cross", shards=1)
    item = LogItem(timestamp=1_700_000_000)
    item.set_contents([("level", "INFO"), ("msg", "from the sdk")])
    sdk.put_logs(PutLogsRequest(PROJECT, "cross", "web", "10.0.0.1", [item]))
    (from_sdk,) = _kp_consume(server, topic, 1, 1)
    assert from_sdk.value == b'{"level":"INFO","msg":"from the sdk"}'
    assert from_sdk.timestamp // 1000 == 1_700_000_000  # the SDK adds a sub-second part
    assert ("__topic__", b"web") in from_sdk.headers

    producer = Producer({"bootstrap.servers": _bootstrap(server), "acks": "all"})
    producer.produce(topic, key=b"user-1", value=b"clicked", headers=[("page", b"/home")])
    producer.flush(10)
    cursor = sdk.get_cursor(PROJECT, "cross", 0, "begin").get_cursor()
    logs = sdk.pull_logs(PROJECT, "cross", 0, cursor, count=10).get_flatten_logs_json()
    assert logs[-1]["__key__"] == "user-1"
    assert logs[-1]["__value__"] == "clicked"
    assert logs[-1]["page"] == "/home"
    tailed = _loghub(server, "tail", "cross", "--from", "begin", "--no-follow")
    last = json.loads(tailed.splitlines()[-1])
    assert last["contents"]["__key__"] == "user-1"
    assert last["contents"]["__value__"] == "clicked"


def _loghub(server: ServerProcess, *args: str) -> str:
    """Runs the `loghub` command against the server; its standard output."""
    command = [sys.executable, "-m", "loghub", *args, "-p", PROJECT]
    command += ["--endpoint", server.endpoint]
    return subprocess.run(command, check=True, capture_output=True, text=True, timeout=60).stdout


# -- raw requests ----------------------------------------------------------------------------


def _produce(sock: socket.socket, topic: str, batch: bytes) -> dict[str, Any]:
    request = {
        "Acks": -1,
        "TimeoutMs": 5000,
        "TopicData": [{"Name": topic, "PartitionData": [{"Index": 0, "Records": batch}]}],
    }
    answer = kafka_call(sock, 0, 9, request)
    partition: dict[str, Any] = answer["Responses"][0]["PartitionResponses"][0]
    return partition


def test_a_retried_idempotent_batch_is_stored_once(server: ServerProcess, sdk: LogClient) -> None:
    topic = _logstore(sdk, "idempotent", shards=1)
    records = [Record(1_700_000_000_000, None, b"once", (), 0)]
    first = build_batch(0, records, producer_id=4242, base_sequence=0)
    gap = build_batch(0, records, producer_id=4242, base_sequence=5)
    with socket.create_connection(("127.0.0.1", server.kafka_port), timeout=10) as sock:  # type: ignore[attr-defined]
        answer = _produce(sock, topic, first)
        again = _produce(sock, topic, first)
        out_of_order = _produce(sock, topic, gap)
        offsets = kafka_call(
            sock, 2, 7,
            {"ReplicaId": -1, "Topics": [{"Name": topic, "Partitions": [
                {"PartitionIndex": 0, "Timestamp": -1}]}]},
        )  # fmt: skip
    assert (answer["ErrorCode"], again["ErrorCode"]) == (0, 0)
    assert again["BaseOffset"] == answer["BaseOffset"]
    assert out_of_order["ErrorCode"] == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
    end = offsets["Topics"][0]["Partitions"][0]["Offset"]
    assert end == 1 << 20  # one log group stored
    cursor = sdk.get_cursor(PROJECT, "idempotent", 0, "begin").get_cursor()
    assert sdk.pull_logs(PROJECT, "idempotent", 0, cursor, count=10).get_log_count() == 1


def test_an_unsupported_version_closes_the_connection(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.kafka_port), timeout=10) as sock:  # type: ignore[attr-defined]
        payload = struct.pack(">hhih", 1, 13, 1, -1) + b"\x00" + b"\x00" * 40
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        assert sock.recv(100) == b""


def test_with_access_keys_clients_authenticate_with_sasl_plain(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    kafka_port = free_port()
    server = ServerProcess(
        tmp_path_factory.mktemp("kafka-sasl") / "data",
        keys={"ak": "sk"},
        extra_args=("--kafka-port", str(kafka_port)),
    ).start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("HTTP_PROXY", f"http://{server.endpoint}")
            patch.setenv("http_proxy", f"http://{server.endpoint}")
            client = LogClient(server.endpoint, "ak", "sk")
            client.create_project(PROJECT, "sasl")
            client.create_logstore(PROJECT, "secured", ttl=7, shard_count=1)
        topic = f"{PROJECT}.secured"
        bootstrap = f"127.0.0.1:{kafka_port}"
        sasl = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}
        producer = Producer(
            {"bootstrap.servers": bootstrap, **sasl, "sasl.username": "ak", "sasl.password": "sk"}
        )
        producer.produce(topic, value=b"signed in")
        assert producer.flush(10) == 0
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN", sasl_plain_username="ak", sasl_plain_password="sk",
            auto_offset_reset="earliest",
        )  # fmt: skip
        consumer.assign([TopicPartition(topic, 0)])
        got = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(r.value for r in records)
        consumer.close()
        assert got == [b"signed in"]
        # a wrong secret, or no SASL at all, gets nothing
        errors: list[Any] = []
        delivered: list[Any] = []
        intruder = Producer(
            {"bootstrap.servers": bootstrap, **sasl, "sasl.username": "ak",
             "sasl.password": "wrong", "message.timeout.ms": 1000, "error_cb": errors.append}
        )  # fmt: skip
        intruder.produce(topic, value=b"intruder", on_delivery=lambda e, m: delivered.append(e))
        intruder.flush(5)
        assert delivered and delivered[0] is not None  # not stored
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors)
        with (
            socket.create_connection(("127.0.0.1", kafka_port), timeout=10) as sock,
            pytest.raises(ConnectionError),
        ):
            kafka_call(sock, 3, 1, {"Topics": None})
    finally:
        server.stop()


def test_assign_from_latest_and_from_a_time(server: ServerProcess, sdk: LogClient) -> None:
    topic = _logstore(sdk, "positions", shards=1)
    producer = KafkaProducer(bootstrap_servers=_bootstrap(server), acks="all")
    for i in range(3):
        producer.send(topic, value=f"old {i}".encode()).get(timeout=10)
    time.sleep(0.05)
    between_ms = int(time.time() * 1000)
    time.sleep(0.05)
    consumer = KafkaConsumer(bootstrap_servers=_bootstrap(server), auto_offset_reset="latest")
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_end(partition)
    end = consumer.position(partition)
    for i in range(2):
        producer.send(topic, value=f"new {i}".encode()).get(timeout=10)
    producer.close()
    got: list[bytes] = []
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            got.extend(r.value for r in records)
    assert got == [b"new 0", b"new 1"]  # from latest: nothing older
    found = consumer.offsets_for_times({partition: between_ms})[partition]
    assert found is not None and found.offset == end  # the first record received after
    consumer.close()


@pytest.mark.parametrize("commits", [True, False], ids=["committing", "before-any-commit"])
def test_a_split_during_produce_and_group_consume_loses_nothing(
    server: ServerProcess, sdk: LogClient, commits: bool
) -> None:
    """Without commits the group has no checkpoint when the split comes (as when its first
    auto-commit timed out on a loaded machine): the children must still be read from their
    start, not from ``latest``."""
    store = "resharded" if commits else "resharded-uncommitted"
    topic = _logstore(sdk, store, shards=2)
    consumer = KafkaConsumer(
        topic, bootstrap_servers=_bootstrap(server), group_id=f"splitters-{store}",
        auto_offset_reset="latest", enable_auto_commit=commits, auto_commit_interval_ms=200,
        heartbeat_interval_ms=200, metadata_max_age_ms=60_000,
    )  # fmt: skip
    read: list[tuple[int, bytes, bytes]] = []

    def poll(seconds: float, until: int = 0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and (not until or len(read) < until):
            for records in consumer.poll(timeout_ms=100).values():
                read.extend((r.partition, r.key, r.value) for r in records)

    while not consumer.assignment():
        poll(0.2)
    # kafka-python resolves "latest" after the poll that brought the assignment, in the
    # background: a record acked before its ListOffsets reaches the server would be behind
    # the position and never read. position() waits for it.
    for partition in consumer.assignment():
        consumer.position(partition)
    producer = KafkaProducer(bootstrap_servers=_bootstrap(server), acks="all")
    sent = []
    for i in range(60):
        if i == 30:  # split shard 0 in the middle of the produce
            sdk.split_shard(PROJECT, store, 0, "40000000000000000000000000000000")
        key, value = f"k{i % 5}".encode(), f"{i:03d}".encode()
        producer.send(topic, key=key, value=value).get(timeout=10)  # acked
        sent.append(value)
        poll(0.01)
    producer.close()
    poll(20, until=60)
    assignment = {p.partition for p in consumer.assignment()}
    consumer.close()
    assert sorted(v for _, _, v in read) == sorted(sent)  # no acked record lost, none twice
    assert {2, 3} <= assignment  # the group picked up the children
    for partition in {p for p, _, _ in read}:
        for key in {k for _, k, _ in read}:
            values = [v for p, k, v in read if (p, k) == (partition, key)]
            assert values == sorted(values)  # order per key holds within each partition


@pytest.mark.slow  # two server starts and a kill: about 10 s
def test_a_sigkill_during_acks_all_produce_loses_no_acked_record(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    kafka_port = free_port()
    data_dir = tmp_path_factory.mktemp("kafka-kill") / "data"
    args = ("--kafka-port", str(kafka_port))
    server = ServerProcess(data_dir, extra_args=args).start()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HTTP_PROXY", f"http://{server.endpoint}")
        patch.setenv("http_proxy", f"http://{server.endpoint}")
        client = LogClient(server.endpoint, "ak", "sk")
        client.create_project(PROJECT, "kill")
        client.create_logstore(PROJECT, "durable", ttl=7, shard_count=2)
    topic = f"{PROJECT}.durable"
    acked: list[bytes] = []
    producer = Producer(
        {"bootstrap.servers": f"127.0.0.1:{kafka_port}", "acks": "all", "linger.ms": 1,
         "message.timeout.ms": 1000, "retries": 0}
    )  # fmt: skip

    def report(error: KafkaError | None, message: Any) -> None:
        if error is None:
            acked.append(message.value())

    try:
        for i in range(3000):
            producer.produce(topic, value=f"{i:05d}".encode(), on_delivery=report)
            producer.poll(0.005 if i % 10 == 0 else 0)
            if i == 1500:
                server.kill()  # SIGKILL, with records in flight
        producer.flush(5)
        server = ServerProcess(data_dir, extra_args=args).start()
        server.kafka_port = kafka_port  # type: ignore[attr-defined]
        stored = _kp_consume(server, topic, 2, len(acked))
    finally:
        server.stop()
    assert 0 < len(acked) < 3000, "the kill came before any ack or after all of them"
    assert set(acked) <= {m.value for m in stored}


def test_a_consumer_moves_past_a_log_group_larger_than_its_fetch_size(
    server: ServerProcess, sdk: LogClient
) -> None:
    topic = _logstore(sdk, "big-groups", shards=1)
    value = b"x" * 1500
    with socket.create_connection(("127.0.0.1", server.kafka_port), timeout=10) as sock:  # type: ignore[attr-defined]
        for _batch in range(2):  # two log groups of about 1.5 MB each
            records = [Record(1_700_000_000_000, None, value, (), i) for i in range(1000)]
            assert _produce(sock, topic, build_batch(0, records))["ErrorCode"] == 0
    got = _kp_consume(server, topic, 1, 2000)  # fetches of at most 1 MiB a partition
    assert len(got) == 2000


def test_members_of_both_clients_join_and_leave_without_losing_or_repeating_records(
    server: ServerProcess, sdk: LogClient
) -> None:
    topic = _logstore(sdk, "churn", shards=4)
    producer = KafkaProducer(bootstrap_servers=_bootstrap(server), acks="all")
    read: dict[str, list[bytes]] = {"kp": [], "ck": []}
    sent: list[bytes] = []

    def produce(first: int) -> None:
        for i in range(first, first + 20):
            sent.append(f"{i:03d}".encode())
            producer.send(topic, key=f"k{i}".encode(), value=sent[-1])
        producer.flush()

    def poll(members: dict[str, Any], seconds: float, until_all_read: bool = True) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if until_all_read and sum(map(len, read.values())) >= len(sent):
                return
            if "kp" in members:
                # long enough to outlast a rebalance (see the mixed group test above)
                for records in members["kp"].poll(timeout_ms=1000).values():
                    read["kp"].extend(r.value for r in records)
            if "ck" in members:
                message = members["ck"].poll(0.05)
                if message is not None and not message.error():
                    read["ck"].append(message.value())

    kp = KafkaConsumer(
        topic, bootstrap_servers=_bootstrap(server), group_id="churn",
        auto_offset_reset="earliest", auto_commit_interval_ms=200, heartbeat_interval_ms=200,
    )  # fmt: skip
    while not kp.assignment():
        kp.poll(timeout_ms=1000)
    produce(0)
    poll({"kp": kp}, 15)  # kp alone
    ck = Consumer(
        {"bootstrap.servers": _bootstrap(server), "group.id": "churn", "auto.offset.reset":
         "earliest", "heartbeat.interval.ms": 200, "auto.commit.interval.ms": 200}
    )  # fmt: skip
    ck.subscribe([topic])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (ck.assignment() and kp.assignment()):
        poll({"kp": kp, "ck": ck}, 0.1, until_all_read=False)
    assert ck.assignment() and kp.assignment()  # ck joined, the partitions are shared
    produce(20)
    poll({"kp": kp, "ck": ck}, 15)
    kp.close()  # commits and leaves: ck takes over every partition
    produce(40)
    poll({"ck": ck}, 20)
    ck.close()
    producer.close()
    everything = read["kp"] + read["ck"]
    assert sorted(everything) == sorted(sent)  # none lost, none read twice
    assert read["kp"] and read["ck"]
