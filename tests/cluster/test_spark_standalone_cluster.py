"""The Spark source on a LogHub cluster: partitions pull from the node that holds their shard.

Real parts: a 3-member etcd and 3 `loghub serve --cluster` nodes (cluster_nodes.py), and for
the pipeline a Spark standalone master and two workers started from PySpark's own
``spark-class``, all on loopback, all stopped by PID. The pipeline runs in child processes
(spark_pipeline_child.py): one JVM holds one SparkContext. That test takes minutes and
runs with ``make test-slow``; the others take seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loghub.client import LogHubClient
from loghub.demo import access_logs
from loghub.errors import ServerBusy
from loghub.spark._client import RawPullClient, ShardPulls
from loghub.spark.options import Connection, parse_read_options
from loghub.spark.source import LogHubBatchReader, LogHubStreamReader
from loghub.wire.logs import make_log_group

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from cluster_nodes import LogHubCluster, running_cluster  # noqa: E402
from server_process import free_port  # noqa: E402

KEYS = {"ak": "sk"}
PROJECT = "spark-cluster"
SHARDS = 6  # two per node
PULL_API = "GET /logstores/{logstore}/shards/{shard}?type=log"
CHILD = Path(__file__).with_name("spark_pipeline_child.py")
CHILD_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LogHubCluster]:
    with running_cluster(tmp_path_factory.mktemp("spark-cluster"), 3, KEYS) as running:
        running.wait_placed()
        with LogHubClient(running.nodes[0].endpoint, *next(iter(KEYS.items()))) as client:
            client.create_project(PROJECT)
        yield running


def _client(cluster: LogHubCluster, index: int = 0) -> LogHubClient:
    return LogHubClient(cluster.nodes[index].endpoint, *next(iter(KEYS.items())))


def _logstore(cluster: LogHubCluster, name: str) -> dict[int, str]:
    """Creates a logstore of SHARDS shards; returns each shard's node address, once every
    shard is placed and the three nodes each hold some."""
    with _client(cluster) as client:
        client.create_logstore(PROJECT, name, shard_count=SHARDS)
        deadline = time.monotonic() + 30
        while True:
            shards = client.list_shards(PROJECT, name)
            nodes = {s.shard_id: s.node_address for s in shards}
            if None not in nodes.values() and len(set(nodes.values())) == 3:
                return {shard: address for shard, address in nodes.items() if address}
            assert time.monotonic() < deadline, shards
            time.sleep(0.1)


def _metrics(cluster: LogHubCluster, index: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A node's /metrics: per family name, its samples' labels and values."""
    reply = httpx.get(
        f"http://{cluster.nodes[index].endpoint}/metrics",
        auth=next(iter(KEYS.items())),
        trust_env=False,
    )
    reply.raise_for_status()
    return {
        family.name: [
            (sample.labels, sample.value)
            for sample in family.samples
            if family.type != "counter" or sample.name.endswith("_total")
        ]
        for family in text_string_to_metric_families(reply.text)
    }


def _forwarded_pulls(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> float:
    assert "loghub_cluster_forwarded_requests" in metrics, "the node counts forwarded requests"
    return sum(
        value
        for labels, value in metrics["loghub_cluster_forwarded_requests"]
        if labels["api"] == PULL_API
    )


def _put(cluster: LogHubCluster, logstore: str, groups_per_shard: int) -> None:
    with _client(cluster) as client:
        for shard in range(SHARDS):
            for i in range(groups_per_shard):
                logs = [(1_700_000_000, {"n": f"{shard}-{i}-{j}"}) for j in range(10)]
                client.put_log_group(PROJECT, logstore, make_log_group(logs), shard_id=shard)


def test_list_shards_names_each_shards_node_and_a_non_owner_refuses_owner_only_pulls(
    cluster: LogHubCluster,
) -> None:
    nodes = _logstore(cluster, "where")
    _put(cluster, "where", 1)
    address_of = {f"n{i}": node.endpoint for i, node in enumerate(cluster.nodes)}
    with _client(cluster, 1) as client:
        listed = client.list_shards(PROJECT, "where")
    for shard in listed:
        assert shard.node is not None and shard.node_address == address_of[shard.node]
    # spread evenly; and the named node is the owner: it serves owner-only pulls (below)
    assert sorted(list(nodes.values()).count(a) for a in address_of.values()) == [2, 2, 2]
    forwarded_before = [_forwarded_pulls(_metrics(cluster, i)) for i in range(3)]
    endpoints = [node.endpoint for node in cluster.nodes]
    for shard, address in nodes.items():
        other = next(e for e in endpoints if e != address)
        for endpoint, served in ((address, True), (other, False)):
            with RawPullClient(endpoint, *next(iter(KEYS.items()))) as client:
                client.owner_only = True  # the x-loghub-owner-only header
                if served:
                    assert client.pull_raw(PROJECT, "where", shard, 0, 1).count == 1
                else:
                    with pytest.raises(ServerBusy, match="does not serve shard"):
                        client.pull_raw(PROJECT, "where", shard, 0, 1)
    # refused, not passed on
    assert [_forwarded_pulls(_metrics(cluster, i)) for i in range(3)] == forwarded_before


def test_shard_pulls_go_back_to_the_endpoint_when_the_named_node_fails(
    cluster: LogHubCluster,
) -> None:
    """A node that does not hold the shard (it moved after planning) or that does not
    answer: the range is read whole through the connection's endpoint."""
    nodes = _logstore(cluster, "moved")
    _put(cluster, "moved", 3)
    connection = Connection(cluster.nodes[0].endpoint, PROJECT, "moved", *next(iter(KEYS.items())))
    endpoints = [node.endpoint for node in cluster.nodes]
    for shard, address in nodes.items():
        wrong = next(e for e in endpoints if e != address)
        for named in (address, wrong, f"127.0.0.1:{free_port()}"):
            pulls = ShardPulls(connection, named)
            try:
                got = list(pulls.iter_range(shard, 0, 3))
            finally:
                pulls.close()
            assert sum(pull.count for pull in got) == 3 and got[-1].next_seq == 3
            assert pulls.from_node == (named == address), named


def test_batch_and_restarted_stream_plans_name_each_shards_node_and_read_from_it(
    cluster: LogHubCluster,
) -> None:
    """The planning methods and ``read()`` as Spark calls them, without a JVM: a batch read,
    and a stream restarted from its checkpoint, whose first call is ``partitions()`` for the
    batch it replays (no ``latestOffset`` has listed the shards yet)."""
    nodes = _logstore(cluster, "planned")
    _put(cluster, "planned", 2)
    key_id, key_secret = next(iter(KEYS.items()))
    options = {
        "endpoint": cluster.nodes[0].endpoint, "project": PROJECT, "logstore": "planned",
        "accesskeyid": key_id, "accesskeysecret": key_secret,
    }  # fmt: skip
    batch = LogHubBatchReader(parse_read_options(options, streaming=False)).partitions()
    replayed = pickle.loads(
        pickle.dumps(LogHubStreamReader(parse_read_options(options, streaming=True)))
    )
    try:
        stream = replayed.partitions({str(s): 0 for s in nodes}, {str(s): 2 for s in nodes})
    finally:
        replayed.stop()
    for planned in (batch, stream):
        assert [(p.shard_id, p.start, p.end, p.node_address) for p in planned] == [
            (shard, 0, 2, nodes[shard]) for shard in sorted(nodes)
        ]
    forwarded_before = [_forwarded_pulls(_metrics(cluster, i)) for i in range(3)]
    executor_copy = pickle.loads(
        pickle.dumps(LogHubStreamReader(parse_read_options(options, streaming=True)))
    )
    for partition in stream:
        rows = sum(b.num_rows for b in executor_copy.read(pickle.loads(pickle.dumps(partition))))
        assert rows == 2 * 10
    assert [_forwarded_pulls(_metrics(cluster, i)) for i in range(3)] == forwarded_before


# --- the reference pipeline on a Spark standalone cluster ---------------------------------


@dataclass
class Standalone:
    master_url: str
    master_ui: str
    worker_uis: list[str]


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _daemon_env() -> dict[str, str]:
    import loghub

    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(_spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        # executors' Python workers import this checkout's loghub
        PYTHONPATH=os.pathsep.join(
            p for p in (str(Path(loghub.__file__).parents[1]), env.get("PYTHONPATH")) if p
        ),
        SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1",
    )
    return env


def _start_daemon(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """A Spark daemon in the foreground (spark-class execs java, so the PID is the JVM's);
    setpriv makes the kernel kill it when the test's thread ends, as tests/etcd.py does."""
    spark_class = str(_spark_home() / "bin" / "spark-class")
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", spark_class, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_daemon_env(),
            start_new_session=True,
        )


def _json(url: str) -> dict[str, object]:
    reply = httpx.get(url, timeout=2, trust_env=False)
    reply.raise_for_status()
    answer: dict[str, object] = reply.json()
    return answer


@contextlib.contextmanager
def spark_standalone(base: Path) -> Iterator[Standalone]:
    """A master and two 1-core workers on loopback; stopped by PID at the end."""
    base.mkdir(parents=True, exist_ok=True)
    port, ui = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    worker_uis = [free_port(), free_port()]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_start_daemon(
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(ui)],
            base / "master.log",
        ))  # fmt: skip
        for index, worker_ui in enumerate(worker_uis):
            procs.append(_start_daemon(
                ["org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                 "--cores", "1", "--memory", "1g", "--webui-port", str(worker_ui),
                 "--work-dir", str(base / f"work{index}")],
                base / f"worker{index}.log",
            ))  # fmt: skip
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                workers = _json(f"http://127.0.0.1:{ui}/json/")["workers"]
                if len([w for w in workers if w["state"] == "ALIVE"]) == 2:  # type: ignore[attr-defined]
                    break
            dead = [p.args for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-2000:] for p in sorted(base.glob("*.log")))
                raise AssertionError(f"Spark standalone did not start ({dead}):\n{logs}")
            time.sleep(0.2)
        yield Standalone(
            master_url, f"http://127.0.0.1:{ui}", [f"http://127.0.0.1:{w}" for w in worker_uis]
        )
    finally:
        for proc in reversed(procs):  # workers first
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def _run_pipeline(
    master: str, cluster: LogHubCluster, logstore: str, out: Path, metrics_logstore: str
) -> dict[str, object]:
    with _client(cluster) as client:
        client.create_logstore(PROJECT, metrics_logstore, shard_count=1)
    request, result = out / "request.json", out / "result.json"
    out.mkdir(parents=True)
    key_id, key_secret = next(iter(KEYS.items()))
    request.write_text(json.dumps({
        "endpoint": cluster.nodes[0].endpoint, "project": PROJECT, "logstore": logstore,
        "output_dir": str(out / "pipeline"), "metrics_logstore": metrics_logstore,
        "access_key_id": key_id, "access_key_secret": key_secret,
        "max_offsets_per_trigger": 10,  # four micro-batches: state carries across them
    }))  # fmt: skip
    env = {**_daemon_env(), "PYSPARK_PYTHON": sys.executable}
    with open(out / "child.log", "wb") as log:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), master, str(request), str(result)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        try:
            code = child.wait(timeout=CHILD_TIMEOUT_S)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=20)
    assert code == 0, (out / "child.log").read_text()[-4000:]
    answer: dict[str, object] = json.loads(result.read_text())
    return answer


@pytest.mark.slow  # about 3.5 minutes here: two Spark applications of five micro-batches
def test_reference_pipeline_on_spark_standalone_pulls_each_shard_from_its_node(
    cluster: LogHubCluster, tmp_path: Path
) -> None:
    started = time.monotonic()
    nodes = _logstore(cluster, "access")
    # (the module's other tests pass some pulls on, on purpose)
    forwarded_before = [_forwarded_pulls(_metrics(cluster, i)) for i in range(3)]
    logs = list(access_logs(4000, seed=11, start_s=1_700_000_030))
    groups = {shard: 0 for shard in range(SHARDS)}
    with _client(cluster) as client:
        for i in range(0, len(logs), 100):
            shard = (i // 100) % SHARDS
            group = make_log_group(logs[i : i + 100], topic="access")
            client.put_log_group(PROJECT, "access", group, shard_id=shard)
            groups[shard] += 1
    with spark_standalone(tmp_path / "spark") as standalone:
        on_cluster = _run_pipeline(
            standalone.master_url, cluster, "access", tmp_path / "standalone", "metrics-standalone"
        )
        master = _json(f"{standalone.master_ui}/json/")
        workers = [_json(f"{ui}/json/") for ui in standalone.worker_uis]
    local = _run_pipeline("local[2]", cluster, "access", tmp_path / "local", "metrics-local")

    assert on_cluster["rows"] and on_cluster["rows"] == local["rows"]
    assert on_cluster["batches"] == local["batches"] == 4
    # the application had two executors, one on each worker, and nothing else ran tasks
    app_id = on_cluster["application_id"]
    apps = [a for a in master["completedapps"] if a["id"] == app_id]  # type: ignore[attr-defined]
    assert len(apps) == 1 and apps[0]["cores"] == 2, master
    for worker in workers:
        ran = [e for e in worker["finishedexecutors"] if e["appid"] == app_id]  # type: ignore[attr-defined]
        assert len(ran) == 1, worker
    assert len(on_cluster["executor_hosts"]) == 3  # type: ignore[arg-type]  # and the driver

    # every pull was served by the node holding its shard: none was passed on, and each
    # shard's groups were pulled from its node once per run
    address_index = {node.endpoint: index for index, node in enumerate(cluster.nodes)}
    for index in range(3):
        metrics = _metrics(cluster, index)
        assert _forwarded_pulls(metrics) == forwarded_before[index], index
        pulled = {
            int(labels["shard"]): value
            for labels, value in metrics["loghub_pull_log_groups"]
            if labels["logstore"] == "access" and labels["project"] == PROJECT
        }
        mine = {shard for shard, address in nodes.items() if address_index[address] == index}
        assert len(mine) == 2
        assert pulled == {shard: 2 * groups[shard] for shard in mine}, (index, pulled)
    print(f"pipeline on standalone and local: {time.monotonic() - started:.1f} s")
