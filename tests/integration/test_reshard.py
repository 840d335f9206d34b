"""Split, merge and auto-split against a real `loghub serve`, with writes flowing."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from aliyun.log import LogClient, LogItem, PutLogsRequest
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.errors import LogHubError, ShardReadOnly
from loghub.wire.logs import make_log_group

PRODUCERS = 4
KEYS_PER_PRODUCER = 6


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path / "data").start()
    try:
        yield process
    finally:
        process.stop()


def _hash_key(key: str) -> str:
    return hashlib.md5(key.encode()).hexdigest()


def _read_everything(
    client: LogHubClient, project: str, logstore: str
) -> dict[int, list[dict[str, str]]]:
    """Every log of every shard, in stored order, by shard id."""
    logs: dict[int, list[dict[str, str]]] = {}
    for shard in client.list_shards(project, logstore):
        begin = client.get_cursor(project, logstore, shard.shard_id, "begin")
        logs[shard.shard_id] = [
            {c.Key: c.Value for c in log.Contents}
            for result in client.iter_pull(project, logstore, shard.shard_id, begin)
            for group in result.log_groups
            for log in group.Logs
        ]
    return logs


def test_split_and_merge_while_producers_write_lose_nothing_and_keep_key_order(
    server: ServerProcess,
) -> None:
    with LogHubClient(server.endpoint) as admin:
        admin.create_project("reshard")
        admin.create_logstore("reshard", "events", shard_count=2)
    acked: list[tuple[str, int]] = []
    failures: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()

    def produce(producer: int) -> None:
        counters = dict.fromkeys((f"p{producer}-k{j}" for j in range(KEYS_PER_PRODUCER)), 0)
        with LogHubClient(server.endpoint) as client:
            while not stop.is_set():
                for key in counters:
                    n = counters[key]
                    group = make_log_group([(1_700_000_000, {"key": key, "n": str(n)})])
                    try:
                        client.put_log_group("reshard", "events", group, hash_key=_hash_key(key))
                    except LogHubError as exc:
                        failures.append(exc)
                        return
                    counters[key] = n + 1
                    with lock:
                        acked.append((key, n))

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    with LogHubClient(server.endpoint) as admin:
        changes = [
            lambda: admin.split_shard("reshard", "events", 0),  # -> 2, 3
            lambda: admin.split_shard("reshard", "events", 1),  # -> 4, 5
            lambda: admin.merge_shard("reshard", "events", 3),  # 3 + 4 -> 6
            lambda: admin.split_shard("reshard", "events", 6),  # -> 7, 8
            lambda: admin.merge_shard("reshard", "events", 2),  # 2 + 7 -> 9
        ]
        for change in changes:
            time.sleep(0.4)
            change()
        time.sleep(0.4)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not failures, failures
    assert len(acked) > 200, "the producers barely wrote"

    with LogHubClient(server.endpoint) as client:
        shards = {s.shard_id: s for s in client.list_shards("reshard", "events")}
        assert sorted(s.shard_id for s in shards.values() if s.writable) == [5, 8, 9]
        stored = _read_everything(client, "reshard", "events")
        # each readonly shard took writes only before it closed: its end never moved
        for shard in shards.values():
            if not shard.writable:
                assert shard.end_cursor is not None
                end = client.get_cursor("reshard", "events", shard.shard_id, "end")
                assert end == shard.end_cursor
    found: dict[tuple[str, int], int] = defaultdict(int)
    by_key: dict[str, list[int]] = defaultdict(list)
    for shard_id in sorted(stored):  # children have larger ids than their parents
        for fields in stored[shard_id]:
            found[(fields["key"], int(fields["n"]))] += 1
            by_key[fields["key"]].append(int(fields["n"]))
    assert set(found) == set(acked), "lost or unacknowledged logs"
    assert all(count == 1 for count in found.values()), "a log is stored twice"
    for key, numbers in by_key.items():
        assert numbers == sorted(numbers), f"{key}: out of order across the lineage"


def test_writes_to_a_readonly_shard_are_refused_and_lb_skips_it(server: ServerProcess) -> None:
    with LogHubClient(server.endpoint) as client:
        client.create_project("readonly")
        client.create_logstore("readonly", "store", shard_count=1)
        client.split_shard("readonly", "store", 0)
        group = make_log_group([(1_700_000_000, {"a": "b"})])
        with pytest.raises(ShardReadOnly):
            client.put_log_group("readonly", "store", group, shard_id=0)
        for _ in range(10):
            client.put_log_group("readonly", "store", group)
        assert client.get_cursor("readonly", "store", 0, "end") == "MA=="
        ends = [client.get_cursor("readonly", "store", s, "end") for s in (1, 2)]
        assert ends == ["NQ==", "NQ=="], "load-balanced writes go round the readwrite shards"


def test_official_sdk_split_merge_and_list_shards(
    signed_server: ServerProcess, sdk_proxy_env: None
) -> None:
    sdk = LogClient(signed_server.endpoint, "ak", "sk")
    sdk.create_project("sdkreshard", "")
    sdk.create_logstore("sdkreshard", "store", ttl=1, shard_count=2)
    split = sdk.split_shard("sdkreshard", "store", 1, "c0000000000000000000000000000000")
    assert [(s["shardID"], s["status"]) for s in split.get_shards_info()] == [
        (1, "readonly"),
        (2, "readwrite"),
        (3, "readwrite"),
    ]
    shards = sdk.list_shards("sdkreshard", "store").get_shards_info()
    assert {s["shardID"]: s["status"] for s in shards} == {
        0: "readwrite",
        1: "readonly",
        2: "readwrite",
        3: "readwrite",
    }
    assert shards[3]["inclusiveBeginKey"] == "c" + "0" * 31
    item = LogItem(timestamp=1_700_000_000)
    item.set_contents([("after", "split")])
    before = sdk.get_end_cursor("sdkreshard", "store", 3).get_cursor()
    sdk.put_logs(PutLogsRequest("sdkreshard", "store", "", "10.0.0.1", [item], hashKey="d0"))
    pulled = sdk.pull_logs("sdkreshard", "store", 3, before, count=10)
    assert [log["after"] for log in pulled.get_flatten_logs_json()] == ["split"]
    merged = sdk.merge_shard("sdkreshard", "store", 2)
    assert [(s["shardID"], s["status"]) for s in merged.get_shards_info()] == [
        (4, "readwrite"),
        (2, "readonly"),
        (3, "readonly"),
    ]
    sdk.put_logs(PutLogsRequest("sdkreshard", "store", "", "10.0.0.1", [item], hashKey="d0"))
    assert sdk.get_end_cursor("sdkreshard", "store", 4).get_cursor() == "MQ=="


def test_auto_split_splits_a_hot_shard_up_to_max_split_shard(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "data",
        extra_args=(
            "--auto-split-bytes-per-s",
            "2000",
            "--auto-split-sustain-ms",
            "1000",
            "--auto-split-check-interval-s",
            "0.2",
        ),
    ).start()
    try:
        with LogHubClient(server.endpoint) as client:
            client.create_project("auto")
            client.create_logstore("auto", "hot", shard_count=1, autoSplit=True, maxSplitShard=3)
            client.create_logstore("auto", "off", shard_count=1, autoSplit=False)
            # far over the limit even if this machine stalls the writer for a while
            group = make_log_group([(1_700_000_000, {"pad": "x" * 1000})] * 40)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                for logstore in ("hot", "off"):
                    client.put_log_group("auto", logstore, group)
                writable = [s for s in client.list_shards("auto", "hot") if s.writable]
                if len(writable) >= 3:
                    break
                time.sleep(0.01)
            for _ in range(20):  # several more checks while hot: the maximum holds
                client.put_log_group("auto", "hot", group)
                time.sleep(0.1)
            hot = client.list_shards("auto", "hot")
            assert len([s for s in hot if s.writable]) == 3
            assert hot[0].status == "readonly" and len(hot[0].children) == 2
            assert [s.status for s in client.list_shards("auto", "off")] == ["readwrite"]
    finally:
        server.stop()
