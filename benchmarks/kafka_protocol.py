"""Kafka-protocol produce and consume against the REST path, on the same `loghub serve`.

Starts a fresh server child with ``--kafka-port`` and two logstores of ``--shards`` shards.
Each case writes the same access logs (about 200 bytes each, as JSON values for Kafka, as
log contents for REST) and reads them all back, ``--runs`` times:

- Kafka produce: confluent-kafka (librdkafka), ``acks=all``, lz4, default batching;
- REST produce: LogHubClient PutLogs of ``--logs-per-request`` logs, lz4, one connection;
- Kafka consume: confluent-kafka ``assign`` from the beginning of every partition;
- REST consume: LogHubClient pulls of 1000 groups per request, every shard.

One client process each, so the figures compare the server paths, not client fan-out.

    .venv/bin/python benchmarks/kafka_protocol.py [--logs 100000] [--shards 4] [--runs 3]

Prints figures and saves ``results/kafka.json``; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    PROJECT,
    ServerChild,
    access_log_record,
    fmt_int,
    free_port,
    make_data_dir,
    remove_tree,
)
from _results import Reference, Row, save  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition  # noqa: E402

from loghub.client import LogHubClient  # noqa: E402
from loghub.wire.logs import make_log_group  # noqa: E402


def _records(count: int) -> list[tuple[int, dict[str, str]]]:
    rng = random.Random(7)
    now_s = int(time.time())
    return [access_log_record(rng, now_s) for _ in range(count)]


def kafka_produce(bootstrap: str, topic: str, records: list[tuple[int, dict[str, str]]]) -> float:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "compression.type": "lz4",
         "linger.ms": 5, "queue.buffering.max.messages": 1_000_000}
    )  # fmt: skip
    values = [json.dumps(contents).encode() for _, contents in records]
    failed = []
    started = time.perf_counter()
    for value in values:
        while True:
            try:
                producer.produce(
                    topic, value=value, on_delivery=lambda e, m: e and failed.append(e)
                )
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
    elapsed = time.perf_counter() - started
    assert not failed, failed[:3]
    return len(values) / elapsed


def kafka_consume(bootstrap: str, topic: str, shards: int, expected: int) -> float:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(shards)])
    count = 0
    while count < expected:
        for message in consumer.consume(10_000, 1.0):
            if not message.error():
                count += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return count / elapsed


def rest_produce(
    client: LogHubClient, logstore: str, records: list[tuple[int, dict[str, str]]], per: int
) -> float:
    groups = [
        make_log_group(records[i : i + per]).SerializeToString()
        for i in range(0, len(records), per)
    ]
    started = time.perf_counter()
    for raw in groups:
        client.put_log_group(PROJECT, logstore, raw)
    return len(records) / (time.perf_counter() - started)


def rest_consume(client: LogHubClient, logstore: str, shards: int) -> float:
    started = time.perf_counter()
    count = 0
    for shard in range(shards):
        cursor = client.get_cursor(PROJECT, logstore, shard, "begin")
        end = client.get_cursor(PROJECT, logstore, shard, "end")
        while cursor != end:
            result = client.pull_logs(PROJECT, logstore, shard, cursor)
            count += sum(len(group.Logs) for group in result.log_group_list.LogGroups)
            cursor = result.next_cursor
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--logs-per-request", type=int, default=1000)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--smoke", action="store_true", help="a tiny run, to check it works")
    args = parser.parse_args()
    if args.smoke:
        args.logs, args.runs = 2000, 1

    data_dir = make_data_dir(args.data_dir, "kafka-bench")
    kafka_port = free_port()
    server = ServerChild(data_dir, extra_args=("--kafka-port", str(kafka_port))).start()
    bootstrap = f"127.0.0.1:{kafka_port}"
    records = _records(args.logs)
    figures: dict[str, list[float]] = {
        "kafka produce": [],
        "rest produce": [],
        "kafka consume": [],
        "rest consume": [],
    }
    try:
        with LogHubClient(f"http://127.0.0.1:{server.port}") as client:
            client.create_project(PROJECT, "kafka benchmark")
            for run in range(args.runs):
                kafka_store, rest_store = f"kafka-{run}", f"rest-{run}"
                client.create_logstore(PROJECT, kafka_store, shard_count=args.shards)
                client.create_logstore(PROJECT, rest_store, shard_count=args.shards)
                topic = f"{PROJECT}.{kafka_store}"
                figures["kafka produce"].append(kafka_produce(bootstrap, topic, records))
                figures["rest produce"].append(
                    rest_produce(client, rest_store, records, args.logs_per_request)
                )
                figures["kafka consume"].append(
                    kafka_consume(bootstrap, topic, args.shards, len(records))
                )
                figures["rest consume"].append(rest_consume(client, rest_store, args.shards))
                print(
                    f"run {run + 1}: "
                    + ", ".join(f"{name} {fmt_int(v[-1])} logs/s" for name, v in figures.items())
                )
    finally:
        server.stop()
        remove_tree(data_dir)
    rows = [
        Row(
            f"produce {args.logs} logs, acks=all / PutLogs {args.logs_per_request}",
            "logs/s",
            figures["kafka produce"],
            reference=Reference("REST PutLogs, same server", figures["rest produce"]),
        ),
        Row(
            f"consume {args.logs} logs from {args.shards} shards",
            "logs/s",
            figures["kafka consume"],
            reference=Reference("REST PullLogs, same server", figures["rest consume"]),
        ),
    ]
    save(
        "kafka_protocol",
        "Kafka protocol against REST on one server",
        rows,
        notes=["confluent-kafka (librdkafka) lz4; LogHubClient lz4; one client process each"],
    )


if __name__ == "__main__":
    main()
