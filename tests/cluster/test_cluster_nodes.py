"""A 3-node LogHub cluster on a 3-member etcd, driven with the official SDK through every
node: shards spread over the nodes, any node answers for any shard, a consumer group works
through a node that is not its coordinator, and a node killed with SIGKILL has its shards
succeeded on the others within its TTL and a controller round."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from aliyun.log import LogClient, LogItem, PutLogsRequest
from cluster_nodes import NODE_TTL_S, LogHubCluster, running_cluster
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.errors import ServerBusy

KEYS = {"ak": "sk"}
PROJECT = "clustered"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LogHubCluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster"), 3, KEYS) as running:
        with sdk(running.nodes[0]) as client:
            client.create_project(PROJECT, "a clustered project")
        yield running


@contextlib.contextmanager
def sdk(node: ServerProcess) -> Iterator[LogClient]:
    """The official SDK, its `<project>.127.0.0.1:PORT` requests sent to ``node``."""
    saved = {k: os.environ.get(k) for k in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")}
    os.environ["HTTP_PROXY"] = os.environ["http_proxy"] = f"http://{node.endpoint}"
    os.environ.pop("NO_PROXY", None)
    os.environ.pop("no_proxy", None)
    try:
        yield LogClient(node.endpoint, "ak", "sk")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def put(
    client: LogClient, logstore: str, tag: str, count: int, hash_key: str | None = None
) -> None:
    items = []
    for i in range(count):
        item = LogItem()
        item.set_time(int(time.time()))
        item.set_contents([("tag", tag), ("i", str(i))])
        items.append(item)
    client.put_logs(PutLogsRequest(PROJECT, logstore, "", "", items, hashKey=hash_key))


def pull_all(client: LogClient, logstore: str) -> list[tuple[str, str]]:
    seen = []
    for shard in client.list_shards(PROJECT, logstore).get_shards_info():
        shard_id = shard["shardID"]
        cursor = client.get_cursor(PROJECT, logstore, shard_id, "begin").get_cursor()
        while True:
            reply = client.pull_logs(PROJECT, logstore, shard_id, cursor, 1000)
            for group in reply.get_loggroup_json_list():
                for log in group["logs"]:
                    seen.append((log["tag"], log["i"]))
            if reply.get_log_count() == 0:
                break
            cursor = reply.get_next_cursor()
    return seen


def test_any_node_serves_any_shard_with_the_official_sdk(cluster: LogHubCluster) -> None:
    first, second, third = cluster.nodes
    with sdk(first) as client:
        client.create_logstore(PROJECT, "spread", shard_count=6)
    wait_owned(cluster, "spread", set(range(6)))
    owners = cluster.owners(PROJECT, "spread")
    assert sorted(Counter(owners.values()).values()) == [2, 2, 2]
    for index, node in enumerate(cluster.nodes):
        with sdk(node) as client:
            put(client, "spread", f"lb{index}", 50)  # load-balanced
            for key in ("00" * 16, "7f" + "00" * 15, "ff" * 16):
                put(client, "spread", f"route{index}-{key[:2]}", 10, hash_key=key)
    expected = sorted(
        [(f"lb{n}", str(i)) for n in range(3) for i in range(50)]
        + [(f"route{n}-{k}", str(i)) for n in range(3) for k in ("00", "7f", "ff")
           for i in range(10)]
    )  # fmt: skip
    for node in (third, second, first):
        with sdk(node) as client:
            assert sorted(pull_all(client, "spread")) == expected


def wait_owned(cluster: LogHubCluster, logstore: str, shard_ids: set[int]) -> None:
    """Until each of ``shard_ids`` is placed on a live node."""
    deadline = time.monotonic() + 20
    while True:
        owners = cluster.owners(PROJECT, logstore)
        live = {n["node"] for n in cluster.status()["nodes"]}  # type: ignore[attr-defined]
        if all(owners.get(s) in live for s in shard_ids):
            return
        assert time.monotonic() < deadline, owners
        time.sleep(0.05)


def test_split_merge_and_an_ordered_group_across_nodes(cluster: LogHubCluster) -> None:
    with sdk(cluster.nodes[1]) as client:
        client.create_logstore(PROJECT, "reshard", shard_count=2)
    wait_owned(cluster, "reshard", {0, 1})
    low, high = "00" * 16, "ff" * 16
    owners = cluster.owners(PROJECT, "reshard")
    # split shard 0 through a node that does not hold it: the request goes to its owner,
    # which seals its log before the split commits
    entry = next(n for i, n in enumerate(cluster.nodes) if f"n{i}" != owners[0])
    with sdk(entry) as client:
        put(client, "reshard", "a", 20, hash_key=low)
        put(client, "reshard", "a", 20, hash_key=high)
        client.split_shard(PROJECT, "reshard", 0, "40" + "00" * 15)
    wait_owned(cluster, "reshard", {0, 1, 2, 3})
    with sdk(cluster.nodes[0]) as client:
        put(client, "reshard", "b", 20, hash_key=low)
        put(client, "reshard", "b", 20, hash_key="7f" + "00" * 15)
        shards = client.list_shards(PROJECT, "reshard").get_shards_info()
    by_id = {s["shardID"]: s for s in shards}
    assert by_id[0]["status"] == "readonly" and {2, 3} <= set(by_id)
    # merge two neighbours held by two nodes: the owner of the left one seals the right one
    # on its node too
    owners = cluster.owners(PROJECT, "reshard")
    assert owners[2] != owners[3] or owners[3] != owners[1]
    left = 2 if owners[2] != owners[3] else 3
    with sdk(cluster.nodes[2]) as client:
        client.merge_shard(PROJECT, "reshard", left)
    wait_owned(cluster, "reshard", {0, 1, 2, 3, 4})
    with sdk(cluster.nodes[2]) as client:
        put(client, "reshard", "c", 20, hash_key=low)
        put(client, "reshard", "c", 20, hash_key=high)
        shards = client.list_shards(PROJECT, "reshard").get_shards_info()
        seen = pull_all(client, "reshard")
    merged = max(s["shardID"] for s in shards)
    parents = [s for s in shards if merged in (s.get("children") or [])]
    assert len(parents) == 2 and all(p["status"] == "readonly" for p in parents)
    with sdk(cluster.nodes[0]) as client:
        for parent in parents:  # each parent's recorded end is its log's end, on its node
            end = client.get_cursor(PROJECT, "reshard", parent["shardID"], "end").get_cursor()
            assert parent["endCursor"] == end, parent
    assert sorted(t for t, _ in seen) == ["a"] * 40 + ["b"] * 40 + ["c"] * 40
    # an ordered group, driven through a node that is not its coordinator: the children of
    # the unfinished parent are not handed out before it
    controller = cluster.status()["controller"]
    other = next(n for i, n in enumerate(cluster.nodes) if f"n{i}" != controller)
    with sdk(other) as client:
        client.create_consumer_group(PROJECT, "reshard", "ordered", 20, in_order=True)
        granted: list[int] = []
        for _ in range(3):
            granted = client.heart_beat(PROJECT, "reshard", "ordered", "c1", granted).get_shards()
    assert 0 in granted and 1 in granted
    assert not {2, 3, merged} & set(granted), granted


def test_a_killed_node_has_its_shards_succeeded_and_writes_go_on(cluster: LogHubCluster) -> None:
    with sdk(cluster.nodes[0]) as client:
        client.create_logstore(PROJECT, "failover", shard_count=3)
    wait_owned(cluster, "failover", {0, 1, 2})
    status = cluster.status()
    controller = status["controller"]
    victim_index = next(i for i in range(3) if f"n{i}" != controller)
    victim = cluster.nodes[victim_index]
    survivor = cluster.nodes[next(i for i in range(3) if i not in (victim_index,))]
    with sdk(survivor) as client:
        put(client, "failover", "before", 30)
    victim.kill()
    killed = time.monotonic()
    moved_after = None
    deadline = killed + 20
    with sdk(survivor) as client:
        while time.monotonic() < deadline:
            placed = cluster.status()
            gone = {(s["logstore"], s["shard"]) for s in placed["unavailable_shards"]}  # type: ignore[union-attr]
            shards = client.list_shards(PROJECT, "failover").get_shards_info()
            writable_gone = [
                s for s in shards
                if s["status"] == "readwrite" and ("failover", s["shardID"]) in gone
            ]  # fmt: skip
            if not writable_gone and len(placed["nodes"]) == 2:  # type: ignore[arg-type]
                moved_after = time.monotonic() - killed
                break
            time.sleep(0.05)
        assert moved_after is not None, cluster.status()
        # every hash range takes writes again, through the survivors
        for key in ("00" * 16, "7f" + "00" * 15, "ff" * 16):
            put(client, "failover", f"after-{key[:2]}", 5, hash_key=key)
        put(client, "failover", "after-lb", 20)
    print(f"node SIGKILL -> shards succeeded after {moved_after:.2f} s (TTL {NODE_TTL_S} s)")
    assert moved_after < NODE_TTL_S + 1.0 + 3.0
    # the victim returns: its logs are readable again, and every log written is there
    cluster.start_node(victim_index)
    cluster.wait_placed()
    with sdk(cluster.nodes[victim_index]) as client:
        seen = pull_all(client, "failover")
    assert sorted(t for t, _ in seen).count("before") == 30
    assert len(seen) == 30 + 15 + 20


@pytest.mark.slow
def test_node_kill_failover_times_over_twenty_trials(tmp_path: Path) -> None:
    """p50/p99 of SIGKILL -> every writable shard placed on a live node, 20 trials."""
    times = []
    with running_cluster(tmp_path, 3, KEYS) as cluster:
        with sdk(cluster.nodes[0]) as client:
            client.create_project(PROJECT, "")
            client.create_logstore(PROJECT, "trials", shard_count=6)
        for _trial in range(20):
            cluster.wait_placed(shards=6)
            controller = cluster.status()["controller"]
            index = next(i for i in range(3) if f"n{i}" != controller)
            cluster.nodes[index].kill()
            killed = time.monotonic()
            while True:
                status = cluster.status()
                if len(status["nodes"]) == 2 and not _writable_unavailable(cluster, status):  # type: ignore[arg-type]
                    times.append(time.monotonic() - killed)
                    break
                time.sleep(0.02)
            cluster.start_node(index)
    p50 = statistics.median(times)
    p99 = sorted(times)[min(len(times) - 1, int(0.99 * len(times)))]
    print(f"node SIGKILL -> shards placed: p50 {p50:.2f} s, p99 {p99:.2f} s over {len(times)}")
    assert p99 < NODE_TTL_S + 4


def _writable_unavailable(cluster: LogHubCluster, status: dict[str, object]) -> bool:
    gone = {(s["logstore"], s["shard"]) for s in status["unavailable_shards"]}  # type: ignore[attr-defined]
    with sdk(next(n for n in cluster.nodes if n.proc and n.proc.poll() is None)) as client:
        shards = client.list_shards(PROJECT, "trials").get_shards_info()
    return any(s["status"] == "readwrite" and ("trials", s["shardID"]) in gone for s in shards)


def test_a_killed_controller_is_replaced_and_its_shards_move(cluster: LogHubCluster) -> None:
    cluster.wait_placed()
    before = cluster.status()
    index = int(str(before["controller"]).removeprefix("n"))
    cluster.nodes[index].kill()
    killed = time.monotonic()
    while True:
        status = cluster.status()
        if status["controller"] not in (None, before["controller"]):
            break
        assert time.monotonic() - killed < NODE_TTL_S + 5, status
        time.sleep(0.05)
    took_over_s = time.monotonic() - killed
    assert status["controller_epoch"] > before["controller_epoch"]  # type: ignore[operator]
    survivor = cluster.nodes[(index + 1) % 3]
    with sdk(survivor) as client:
        client.create_logstore(PROJECT, "after-controller", shard_count=2)
        wait_owned(cluster, "after-controller", {0, 1})
        put(client, "after-controller", "x", 10, hash_key="00" * 16)
        put(client, "after-controller", "x", 10, hash_key="ff" * 16)
        assert len(pull_all(client, "after-controller")) == 20
    print(f"controller SIGKILL -> new controller after {took_over_s:.2f} s")
    cluster.start_node(index)
    cluster.wait_placed()


def test_writes_go_on_while_the_etcd_leader_is_killed(cluster: LogHubCluster) -> None:
    cluster.wait_placed()
    with sdk(cluster.nodes[0]) as client:
        client.create_logstore(PROJECT, "etcd-kill", shard_count=3)
        wait_owned(cluster, "etcd-kill", {0, 1, 2})
        leader = cluster.etcd.leader()
        written = failed = 0
        started = time.monotonic()
        killed = False
        while time.monotonic() - started < 4:
            if not killed and time.monotonic() - started > 1:
                cluster.etcd.kill(leader)
                killed = True
            try:
                put(client, "etcd-kill", "w", 10)
                written += 10
            except Exception:
                failed += 1
        assert killed and failed == 0 and written > 0
        assert len(pull_all(client, "etcd-kill")) == written
    cluster.etcd.start(leader, "existing")
    cluster.etcd.wait_healthy()


def test_a_node_paused_past_its_lease_rejoins(cluster: LogHubCluster) -> None:
    """SIGSTOP longer than the TTL: the cluster succeeds the node's shards; woken, the node
    finds its lease gone, joins again with a new one, and seals what was succeeded. A request
    another node forwarded to it meanwhile is answered 503 once the node's lease has ended,
    not left waiting for the forward's timeout (a minute) as a paused kernel lets it."""
    cluster.wait_placed()
    controller = cluster.status()["controller"]
    index = next(i for i in range(3) if f"n{i}" != controller)
    node = cluster.nodes[index]
    held = [k for k, v in cluster.owners(PROJECT, "spread").items() if v == f"n{index}"]
    entry = cluster.nodes[next(i for i in range(3) if i != index)]
    node.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        paused = time.monotonic()
        client = LogHubClient(entry.endpoint, *next(iter(KEYS.items())), timeout_s=30)
        with client, pytest.raises(ServerBusy, match="left the cluster"):
            client.get_cursor(PROJECT, "spread", held[0], "begin")
        answered_after_s = time.monotonic() - paused
        assert answered_after_s < NODE_TTL_S + 3, answered_after_s
        deadline = time.monotonic() + NODE_TTL_S + 10
        while f"n{index}" in {n["node"] for n in cluster.status()["nodes"]}:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.5)  # a controller round: its writable shards are succeeded
    finally:
        node.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    cluster.wait_placed()  # back in the cluster, and nothing is unavailable
    assert f"n{index}" in {n["node"] for n in cluster.status()["nodes"]}  # type: ignore[attr-defined]
    with sdk(node) as client:
        put(client, "spread", "after-pause", 10)


def logstore_dirs(node: ServerProcess, logstore: str) -> list[Path]:
    return sorted(node.data_dir.glob(f"**/{PROJECT}/{logstore}-*"))


def test_a_deleted_logstore_leaves_no_data_on_any_node(cluster: LogHubCluster) -> None:
    """Each node holds the logs of the shards it owned; deleting the logstore through one
    node removes them from all, also from a node that was down when it happened."""
    with sdk(cluster.nodes[0]) as client:
        client.create_logstore(PROJECT, "doomed", shard_count=3)
    wait_owned(cluster, "doomed", {0, 1, 2})
    owners = cluster.owners(PROJECT, "doomed")
    with sdk(cluster.nodes[0]) as client:
        for key in ("00" * 16, "60" + "00" * 15, "c0" + "00" * 15):
            put(client, "doomed", "bye", 10, hash_key=key)
    holders = {int(owner[1:]) for owner in owners.values()}
    assert holders == {0, 1, 2}
    assert all(logstore_dirs(cluster.nodes[i], "doomed") for i in holders)
    controller = cluster.status()["controller"]
    away = next(i for i in (2, 1) if f"n{i}" != controller)
    cluster.nodes[away].stop()
    try:
        with sdk(cluster.nodes[0]) as client:
            client.delete_logstore(PROJECT, "doomed")
        deadline = time.monotonic() + 10
        while any(logstore_dirs(cluster.nodes[i], "doomed") for i in holders - {away}):
            assert time.monotonic() < deadline, "a live node kept a deleted logstore's data"
            time.sleep(0.1)
        assert logstore_dirs(cluster.nodes[away], "doomed")  # it was down
    finally:
        cluster.start_node(away)
    deadline = time.monotonic() + 10
    while logstore_dirs(cluster.nodes[away], "doomed"):
        assert time.monotonic() < deadline, "a returning node kept a deleted logstore's data"
        time.sleep(0.1)
    cluster.wait_placed()


def test_every_node_exports_the_cluster_status_as_metrics(cluster: LogHubCluster) -> None:
    """A scrape of any node says what `loghub cluster status` says: the live nodes, the
    controller and its epoch, the shards per node, and none unavailable."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    def scrape(node: ServerProcess) -> dict[str, list[tuple[dict[str, str], float]]]:
        reply = httpx.get(
            f"http://{node.endpoint}/metrics", auth=next(iter(KEYS.items())), trust_env=False
        )
        reply.raise_for_status()
        return {
            family.name: [(sample.labels, sample.value) for sample in family.samples]
            for family in text_string_to_metric_families(reply.text)
        }

    def expected() -> dict[str, list[tuple[dict[str, str], float]]]:
        status = cluster.status()
        assert sum(n["shards"] for n in status["nodes"]) > 0  # type: ignore[attr-defined]
        return {
            "loghub_cluster_nodes": [({}, 3.0)],
            "loghub_cluster_controller_epoch": [
                ({"node": status["controller"]}, float(status["controller_epoch"]))  # type: ignore[arg-type]
            ],
            "loghub_cluster_node_shards": [
                ({"node": n["node"], "rack": n["rack"], "draining": "0"}, float(n["shards"]))
                for n in status["nodes"]  # type: ignore[attr-defined]
            ],
            "loghub_cluster_unavailable_shards": [({}, 0.0)],
            "loghub_cluster_handovers": [({}, 0.0)],
            "loghub_cluster_under_replicated_shards": [({}, 0.0)],
        }

    cluster.wait_placed()
    for node in cluster.nodes:
        deadline = time.monotonic() + 10
        while True:
            # a node's view follows etcd's by its watch's delay, and the status read from
            # etcd is read again each time: the controller may still move a shard after the
            # cluster settled, and then both change
            want = expected()
            families = scrape(node)
            seen = {name: families.get(name) for name in want}
            if seen == want:
                break
            assert time.monotonic() < deadline, (node.endpoint, seen, want)
            time.sleep(0.1)


def accepted(node: ServerProcess, key_id: str, secret: str) -> bool:
    """Whether ``node`` takes a request signed with this key (the official SDK's)."""
    from aliyun.log import LogException

    with sdk(node):
        try:
            LogClient(node.endpoint, key_id, secret).get_project(PROJECT)
            return True
        except LogException as exc:
            assert exc.get_error_code() in ("InvalidAccessKeyId", "SignatureNotMatch"), exc
            return False


def until_every_node(cluster: LogHubCluster, key: tuple[str, str], wanted: bool) -> None:
    deadline = time.monotonic() + 10
    for node in cluster.nodes:
        while accepted(node, *key) != wanted:
            assert time.monotonic() < deadline, (node.endpoint, key, wanted)
            time.sleep(0.1)


def set_cluster_keys(cluster: LogHubCluster, keys: dict[str, str]) -> subprocess.CompletedProcess:
    path = cluster.base / "cluster-keys.json"
    path.write_text(json.dumps(keys))
    return subprocess.run(
        [sys.executable, "-m", "loghub", "cluster", "keys", "--cluster", cluster.etcd.url,
         "--keys-file", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_access_keys_live_in_etcd_and_every_node_follows_them(cluster: LogHubCluster) -> None:
    """The cluster's keys are the first node's, kept in etcd: a node started with other
    keys takes the cluster's, and `loghub cluster keys` adds and revokes keys on every node
    at once, without a restart. Keys that would open the cluster are refused."""
    rotated = ("rotated", "a-new-secret")
    assert not accepted(cluster.nodes[0], *rotated)
    done = set_cluster_keys(cluster, {"ak": "sk", rotated[0]: rotated[1]})
    assert done.returncode == 0, done.stderr
    until_every_node(cluster, rotated, True)
    assert all(accepted(node, "ak", "sk") for node in cluster.nodes)

    # a node whose own keys file says otherwise takes the cluster's
    controller = cluster.status()["controller"]
    index = next(i for i in (2, 1) if f"n{i}" != controller)
    cluster.nodes[index].stop()
    cluster.keys = {"stranger": "its-own-secret"}
    try:
        node = cluster.start_node(index)
    finally:
        cluster.keys = KEYS
    assert accepted(node, *rotated) and not accepted(node, "stranger", "its-own-secret")
    assert "differ from the cluster's" in node.log()

    refused = set_cluster_keys(cluster, {})
    assert refused.returncode != 0 and "empty" in refused.stderr + refused.stdout
    done = set_cluster_keys(cluster, KEYS)  # revokes the rotated key
    assert done.returncode == 0, done.stderr
    until_every_node(cluster, rotated, False)
    assert all(accepted(node, "ak", "sk") for node in cluster.nodes)
    cluster.wait_placed()
