"""Idempotent writes on a real server: a write sent again with its write id is stored once,
also when the attempts race, and also after the server was killed and started again (the
ids are rebuilt from the log); a malformed id is a 400, and a write without one is stored
as often as it is sent."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.wire.logs import make_log_group
from loghub.wire.producer_ids import PRODUCER_HEADER, ProducerIds, WriteId, marked, marker_of
from loghub.wire.proto import LogGroup

KEYS = {"ak": "sk"}
PROJECT = "idem"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("idem") / "data", keys=KEYS).start()
    try:
        with LogHubClient(server.endpoint, "ak", "sk") as client:
            client.create_project(PROJECT, "idempotent writes")
        yield server
    finally:
        server.stop()


def values(client: LogHubClient, logstore: str, shard_id: int = 0) -> list[str]:
    cursor = client.get_cursor(PROJECT, logstore, shard_id, "begin")
    found = []
    for result in client.iter_pull(PROJECT, logstore, shard_id, cursor):
        for group in result.log_group_list.LogGroups:
            found += [c.Value for log in group.Logs for c in log.Contents if c.Key == "v"]
    return found


def group(value: str) -> LogGroup:
    return make_log_group([(1_700_000_000, {"v": value})])


def test_the_write_id_rides_in_the_groups_reserved_field() -> None:
    raw = group("x").SerializeToString()
    write = WriteId("a1b2", 7)
    parsed = LogGroup.FromString(marked(raw, write))
    assert parsed.Reserved == "loghub-producer:a1b2:7" and parsed.Logs[0].Contents[0].Value == "x"
    assert marker_of(marked(raw, write)) == write
    assert marker_of(raw) is None
    # a Reserved set by the writer is replaced (protobuf keeps the last value of a field)
    own = LogGroup(Reserved="mine", Logs=group("y").Logs)
    assert LogGroup.FromString(marked(own.SerializeToString(), write)).Reserved.endswith(":7")
    ids = ProducerIds()
    assert [ids.next().sequence for _ in range(3)] == [0, 1, 2]


def test_a_write_sent_again_with_its_id_is_stored_once(server: ServerProcess) -> None:
    with LogHubClient(server.endpoint, "ak", "sk") as client:
        client.create_logstore(PROJECT, "again", shard_count=1)
        first, second = WriteId("p1", 0), WriteId("p1", 1)
        for _ in range(3):
            client.put_log_group(PROJECT, "again", group("a"), shard_id=0, write_id=first)
        client.put_log_group(PROJECT, "again", group("b"), shard_id=0, write_id=second)
        # another producer's sequence 0 is another write
        client.put_log_group(PROJECT, "again", group("c"), shard_id=0, write_id=WriteId("p2", 0))
        # without an id a write is stored each time it is sent
        client.put_log_group(PROJECT, "again", group("d"), shard_id=0)
        client.put_log_group(PROJECT, "again", group("d"), shard_id=0)
        assert values(client, "again") == ["a", "b", "c", "d", "d"]


def test_racing_attempts_of_one_write_are_stored_once(server: ServerProcess) -> None:
    with LogHubClient(server.endpoint, "ak", "sk") as client:
        client.create_logstore(PROJECT, "race", shard_count=1)
    errors: list[BaseException] = []

    def send(n: int) -> None:
        try:
            with LogHubClient(server.endpoint, "ak", "sk") as own:
                for i in range(40):
                    write = WriteId("racer", i)
                    own.put_log_group(PROJECT, "race", group(f"r{i}"), shard_id=0, write_id=write)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with LogHubClient(server.endpoint, "ak", "sk") as client:
        stored = values(client, "race")
    assert sorted(stored) == sorted(f"r{i}" for i in range(40))


def test_ids_survive_a_crash_of_the_server(server: ServerProcess) -> None:
    with LogHubClient(server.endpoint, "ak", "sk") as client:
        client.create_logstore(PROJECT, "crash", shard_count=1)
        for i in range(5):
            client.put_log_group(PROJECT, "crash", group(f"k{i}"), shard_id=0,
                                 write_id=WriteId("survivor", i))  # fmt: skip
    os.kill(server.pid, signal.SIGKILL)
    assert server.proc is not None
    server.proc.wait()
    server.start()
    with LogHubClient(server.endpoint, "ak", "sk") as client:
        for i in range(3, 7):  # 3 and 4 are retries of writes made before the crash
            client.put_log_group(PROJECT, "crash", group(f"k{i}"), shard_id=0,
                                 write_id=WriteId("survivor", i))  # fmt: skip
        assert values(client, "crash") == [f"k{i}" for i in range(7)]


def test_an_idempotent_client_retries_and_names_each_write(server: ServerProcess) -> None:
    with LogHubClient(server.endpoint, "ak", "sk", idempotent=True) as client:
        client.create_logstore(PROJECT, "auto", shard_count=1)
        for i in range(3):
            client.put_log_group(PROJECT, "auto", group(f"i{i}"), shard_id=0)
        assert client.producer_ids is not None
        assert client.producer_ids.next().sequence == 3
        assert values(client, "auto") == ["i0", "i1", "i2"]


@pytest.mark.parametrize(
    "value", ["", "noseq", "p:", ":5", "p:-1", "p:1.5", "bad id:1", "p:99999999999999999999",
              "x" * 33 + ":1"],
)  # fmt: skip
def test_a_malformed_write_id_is_refused(server: ServerProcess, value: str) -> None:
    import httpx

    from loghub.wire.compression import compress
    from loghub.wire.signing import Credentials, sign_v1

    raw = group("z").SerializeToString()
    body = compress("lz4", raw)
    path = "/logstores/auto/shards/0"
    headers = {
        "host": f"{PROJECT}.{server.endpoint}",
        "content-type": "application/x-protobuf",
        "x-log-apiversion": "0.6.0",
        "x-log-compresstype": "lz4",
        "x-log-bodyrawsize": str(len(raw)),
        PRODUCER_HEADER: value,
    }
    sign_v1("POST", path, [], headers, body, Credentials("ak", "sk"), time.time())
    with httpx.Client() as http:
        reply = http.post(f"http://{server.endpoint}{path}", headers=headers, content=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["errorCode"] == "ParameterInvalid"
    with LogHubClient(server.endpoint, "ak", "sk") as client:
        assert "z" not in values(client, "auto")
