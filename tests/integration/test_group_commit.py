"""Group commit on a real `loghub serve`: many clients with small PutLogs share fsyncs.

Sixteen clients each send small PutLogs one at a time over a keep-alive connection, to `lb`
of a logstore with four shards. Each write is acknowledged only once durable, so every
round of appends needs an fdatasync; the server must cover all the appends that arrive while
one sync runs with the next one (across shards), so the number of fsyncs stays well under
the number of requests (how far under depends on how the requests interleave, so the test
bounds it by the number of requests; the unit test of the commit queue shows the sharing
itself). Every acknowledged group is then read back. About 3 s.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import httpx
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.wire.cursor import decode_cursor
from loghub.wire.logs import make_log_group

CLIENTS = 16
REQUESTS_EACH = 25
SHARDS = 4


def _fsync_count(endpoint: str) -> float:
    with httpx.Client(trust_env=False) as http:
        text = http.get(f"http://{endpoint}/metrics").text
    match = re.search(r"^loghub_fsync_seconds_count (\S+)$", text, re.MULTILINE)
    assert match is not None
    return float(match.group(1))


def test_concurrent_small_puts_share_fsyncs_and_are_all_stored(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        with LogHubClient(server.endpoint) as client:
            client.create_project("commits")
            client.create_logstore("commits", "store", shard_count=SHARDS)
        body = make_log_group([(1_700_000_000, {"k": "v" * 150})] * 16).SerializeToString()
        fsyncs_before = _fsync_count(server.endpoint)
        failures: list[str] = []
        start = threading.Barrier(CLIENTS)

        def produce() -> None:
            headers = {
                "Host": f"commits.{server.endpoint}",
                "Content-Type": "application/x-protobuf",
                "x-log-apiversion": "0.6.0",
                "x-log-bodyrawsize": str(len(body)),
            }
            with httpx.Client(trust_env=False, timeout=30) as http:
                start.wait()
                for _ in range(REQUESTS_EACH):
                    reply = http.post(
                        f"http://{server.endpoint}/logstores/store/shards/lb",
                        content=body,
                        headers=headers,
                    )
                    if reply.status_code != 200:
                        failures.append(reply.text)

        threads = [threading.Thread(target=produce) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures
        requests = CLIENTS * REQUESTS_EACH
        fsyncs = _fsync_count(server.endpoint) - fsyncs_before
        # a round syncs each shard it touched once, and covers at least one request per
        # shard: never more syncs than requests, however the requests interleave (how many
        # they share depends on timing: test_commit_queue.py holds a round while appends
        # arrive and shows that they share the next one)
        assert 0 < fsyncs <= requests, (fsyncs, requests)
        print(f"{requests} PutLogs, {fsyncs:.0f} fsyncs")
        with LogHubClient(server.endpoint) as client:
            per_shard = [
                decode_cursor(client.get_cursor("commits", "store", shard, "end"))
                for shard in range(SHARDS)
            ]
        assert sum(per_shard) == requests
        # lb sends a whole round to one shard, and the next round to the emptiest one: the
        # shards stay within about one round of each other
        assert max(per_shard) - min(per_shard) <= 2 * CLIENTS, per_shard
    finally:
        server.stop()
