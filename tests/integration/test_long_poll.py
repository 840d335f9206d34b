"""Long-poll pulls (``loghub_wait_ms``) against a real `loghub serve` child.

The server runs with a short wait maximum (1.5 s) and room for two waiting pulls, so that
the deadline and the waiter bound can be seen in about a second each. A pull that waits runs
in a thread of the test; the test then writes, splits or stops the server and times the
answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess

from loghub.client import LogHubClient, PulledBody
from loghub.consumer import Checkpointer, ConsumerConfig, ConsumerProcessor, ConsumerWorker
from loghub.wire.logs import PULL_WAIT_MS_HEADER, make_log_group
from loghub.wire.proto import LogGroup

WAIT_MS_MAX = 1_500
WAITERS_MAX = 2
# Plenty for a loopback round trip on a busy two-core machine, well below WAIT_MS_MAX.
PROMPT_S = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path_factory.mktemp("long-poll") / "data",
        extra_args=(
            "--pull-wait-ms-max",
            str(WAIT_MS_MAX),
            "--pull-waiters-max",
            str(WAITERS_MAX),
        ),
    ).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def _logstore(server: ServerProcess, name: str, shards: int = 1) -> LogHubClient:
    client = LogHubClient(server.endpoint)
    client.create_project(name)
    client.create_logstore(name, "store", shard_count=shards)
    return client


def _put(client: LogHubClient, project: str, shard_id: int = 0) -> None:
    group = make_log_group([(1_700_000_000, {"n": "1"})])
    client.put_log_group(project, "store", group, shard_id=shard_id)


def _timed_pull(
    client: LogHubClient, project: str, cursor: str, wait_ms: int | None, shard_id: int = 0
) -> tuple[PulledBody, float]:
    started = time.monotonic()
    pulled = client.pull_logs_body(project, "store", shard_id, cursor, 100, wait_ms=wait_ms)
    return pulled, time.monotonic() - started


def _parked(future: Future[tuple[PulledBody, float]], seconds: float = 0.3) -> None:
    """Gives the pull time to reach the server and park; it must not have answered yet."""
    time.sleep(seconds)
    assert not future.done(), "the pull answered instead of waiting for data"


def test_a_waiting_pull_answers_as_soon_as_data_arrives(
    server: ServerProcess, pool: ThreadPoolExecutor
) -> None:
    with _logstore(server, "arrive") as client:
        end = client.get_cursor("arrive", "store", 0, "end")
        future = pool.submit(_timed_pull, client, "arrive", end, WAIT_MS_MAX)
        _parked(future)
        put_at = time.monotonic()
        _put(client, "arrive")
        pulled, _elapsed = future.result(timeout=10)
        answered_after_put_s = time.monotonic() - put_at
        assert pulled.count == 1
        assert pulled.wait_ms == WAIT_MS_MAX
        assert answered_after_put_s < PROMPT_S, "the pull slept on after the data came"


def test_a_waiting_pull_answers_empty_at_its_deadline_and_longer_waits_are_cut(
    server: ServerProcess,
) -> None:
    with _logstore(server, "deadline") as client:
        end = client.get_cursor("deadline", "store", 0, "end")
        pulled, elapsed = _timed_pull(client, "deadline", end, 10 * WAIT_MS_MAX)
        assert pulled.count == 0 and pulled.next_cursor == end
        assert pulled.wait_ms == WAIT_MS_MAX, "the reply tells the wait the server applied"
        assert WAIT_MS_MAX / 1000 * 0.9 <= elapsed < WAIT_MS_MAX / 1000 + PROMPT_S


def test_a_pull_with_data_waiting_answers_at_once(server: ServerProcess) -> None:
    with _logstore(server, "ready") as client:
        begin = client.get_cursor("ready", "store", 0, "begin")
        _put(client, "ready")
        pulled, elapsed = _timed_pull(client, "ready", begin, WAIT_MS_MAX)
        assert pulled.count == 1 and elapsed < PROMPT_S


def test_a_pull_without_the_parameter_answers_empty_at_once_as_before(
    server: ServerProcess,
) -> None:
    with _logstore(server, "plain") as client:
        end = client.get_cursor("plain", "store", 0, "end")
        reply = httpx.get(
            f"http://{server.endpoint}/logstores/store/shards/0",
            params={"type": "log", "cursor": end, "count": "100"},
            headers={"host": f"plain.{server.endpoint}", "x-log-apiversion": "0.6.0"},
            timeout=10,
        )
        assert reply.status_code == 200
        assert reply.headers["x-log-count"] == "0" and reply.headers["x-log-cursor"] == end
        assert PULL_WAIT_MS_HEADER not in reply.headers
        assert reply.elapsed.total_seconds() < PROMPT_S


def test_a_split_ends_the_wait_at_once_and_a_readonly_shard_is_not_waited_on(
    server: ServerProcess, pool: ThreadPoolExecutor
) -> None:
    with _logstore(server, "sealed") as client:
        end = client.get_cursor("sealed", "store", 0, "end")
        future = pool.submit(_timed_pull, client, "sealed", end, WAIT_MS_MAX)
        _parked(future)
        client.split_shard("sealed", "store", 0)
        pulled, elapsed = future.result(timeout=10)
        assert pulled.count == 0 and elapsed < WAIT_MS_MAX / 1000
        assert pulled.wait_ms == 0, "nothing more will come: the reply says it did not wait"
        again, elapsed = _timed_pull(client, "sealed", end, WAIT_MS_MAX)
        assert again.count == 0 and again.wait_ms == 0 and elapsed < PROMPT_S


def test_pulls_beyond_the_waiter_bound_answer_at_once_saying_they_did_not_wait(
    server: ServerProcess, pool: ThreadPoolExecutor
) -> None:
    with _logstore(server, "bound", shards=WAITERS_MAX + 1) as client:
        ends = [client.get_cursor("bound", "store", s, "end") for s in range(WAITERS_MAX + 1)]
        waiting = [
            pool.submit(_timed_pull, client, "bound", ends[s], WAIT_MS_MAX, s)
            for s in range(WAITERS_MAX)
        ]
        time.sleep(0.3)
        assert not any(f.done() for f in waiting)
        extra, elapsed = _timed_pull(client, "bound", ends[-1], WAIT_MS_MAX, WAITERS_MAX)
        assert extra.count == 0 and extra.wait_ms == 0 and elapsed < PROMPT_S
        for shard_id in range(WAITERS_MAX):
            _put(client, "bound", shard_id)
        assert [f.result(timeout=10)[0].count for f in waiting] == [1] * WAITERS_MAX


def test_a_negative_wait_is_refused(server: ServerProcess) -> None:
    with _logstore(server, "negative") as client:
        end = client.get_cursor("negative", "store", 0, "end")
        reply = httpx.get(
            f"http://{server.endpoint}/logstores/store/shards/0",
            params={"type": "log", "cursor": end, "count": "100", "loghub_wait_ms": "-1"},
            headers={"host": f"negative.{server.endpoint}", "x-log-apiversion": "0.6.0"},
            timeout=10,
        )
        assert reply.status_code == 400
        assert reply.json()["errorCode"] == "ParameterInvalid"


def test_shutdown_ends_waiting_pulls_at_once(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    server = ServerProcess(tmp_path / "data", extra_args=("--pull-wait-ms-max", "60000")).start()
    try:
        with _logstore(server, "shutdown") as client:
            end = client.get_cursor("shutdown", "store", 0, "end")
            future = pool.submit(_timed_pull, client, "shutdown", end, 60_000)
            _parked(future)
            stop_started = time.monotonic()
            server.stop()
            pulled, _elapsed = future.result(timeout=30)
            assert pulled.count == 0
            assert time.monotonic() - stop_started < 10, "shutdown waited for the long poll"
            assert server.proc is not None and server.proc.returncode is not None
    finally:
        server.kill()


def test_a_consumer_worker_at_the_tail_processes_new_logs_without_its_poll_pause(
    server: ServerProcess,
) -> None:
    """The consumer's latency path: its pulls wait on the server, so a log written while it
    idles at the end is processed at once, not after ``fetch_interval_ms`` (10 s here)."""
    processed: list[float] = []
    started = threading.Event()

    class Stamp(ConsumerProcessor):
        def initialize(self, shard_id: int) -> None:
            super().initialize(shard_id)
            started.set()

        def process(self, log_groups: Sequence[LogGroup], checkpointer: Checkpointer) -> None:
            processed.extend(time.monotonic() for _ in log_groups)
            checkpointer.save()

    with _logstore(server, "consumer") as client:
        config = ConsumerConfig(
            endpoint=server.endpoint,
            project="consumer",
            logstore="store",
            group="tail",
            worker_name="w1",
            start_position="end",
            fetch_interval_ms=10_000,
            heartbeat_interval_ms=500,
            timeout_ms=5_000,
        )
        worker = ConsumerWorker(Stamp, config)
        worker.start()
        try:
            assert started.wait(10), "the worker never got the shard"
            time.sleep(0.5)  # its first pull is parked at the end by now
            put_at = time.monotonic()
            _put(client, "consumer")
            deadline = time.monotonic() + 10
            while not processed and time.monotonic() < deadline:
                time.sleep(0.01)
            assert processed, "nothing processed within 10 s"
            assert processed[0] - put_at < PROMPT_S, "the worker slept through its poll pause"
        finally:
            worker.shutdown()
