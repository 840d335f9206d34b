"""Heartbeats answered on the event loop (``GroupService.heartbeat_in_memory``): the same
replies as the full heartbeat, and a refusal (None, so the server hands the heartbeat to a
storage thread) whenever the answer would need I/O or a wait. In-process, on a real data
directory and SQLite, with a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loghub.errors import ConsumerGroupNotExist, ParameterInvalid
from loghub.server.config import ServerConfig
from loghub.server.service import LogHubService
from loghub.testing import FakeClock

P, L, G = "shop", "orders", "billing"


def _service(data_dir: Path, clock: FakeClock) -> LogHubService:
    service = LogHubService(ServerConfig(data_dir=data_dir, port=0, parse_processes=0), clock)
    service.metadata.create_project(P, "")
    service.create_logstore(P, {"logstoreName": L, "shardCount": 6, "ttl": 1})
    service.groups.create(P, L, {"consumerGroup": G, "timeout": 10})
    return service


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def service(tmp_path: Path, clock: FakeClock) -> Iterator[LogHubService]:
    service = _service(tmp_path, clock)
    try:
        yield service
    finally:
        service.close()


def _in_memory(service: LogHubService, consumer: str, held: object) -> list[int] | None:
    return service.groups.heartbeat_in_memory(P, L, G, consumer, held)


def test_the_replies_are_those_of_the_full_heartbeat(tmp_path: Path) -> None:
    """The same heartbeats, with the same clock, to a service answering each the full way
    and to one answering from memory whenever it may: the same replies, every one."""
    script = [("a", []), ("b", []), ("a", "held"), ("a", "held"), ("b", "held"), ("c", [])]
    script += [(consumer, "held") for _ in range(6) for consumer in "abc"]
    script += [("wait", 10_001)] + [(consumer, "held") for _ in range(4) for consumer in "ab"]
    replies: list[list[list[int]]] = []
    answered_in_memory = 0
    for way in ("full", "in memory"):
        clock = FakeClock()
        service = _service(tmp_path / way.replace(" ", "-"), clock)
        held: dict[str, list[int]] = {}
        got: list[list[int]] = []
        try:
            for consumer, body in script:
                if consumer == "wait":  # c falls silent and is expired
                    assert isinstance(body, int)
                    clock.advance(body)
                    continue
                sent = held.get(consumer, []) if body == "held" else list(body)
                reply = None
                if way == "in memory":
                    reply = service.groups.heartbeat_in_memory(P, L, G, consumer, sent)
                    answered_in_memory += reply is not None
                if reply is None:
                    reply = service.groups.heartbeat(P, L, G, consumer, sent)
                held[consumer] = reply
                got.append(reply)
                clock.advance(100)
        finally:
            service.close()
        replies.append(got)
    assert replies[0] == replies[1]
    assert any(replies[1][i] for i, (c, _) in enumerate(script[:16]) if c == "c")  # c held some
    assert sorted(replies[1][-1] + replies[1][-2]) == [0, 1, 2, 3, 4, 5]  # and lost them
    assert answered_in_memory == len(replies[1]) - 1  # all but the group's first heartbeat


def test_a_group_not_live_yet_is_left_to_the_full_heartbeat(service: LogHubService) -> None:
    assert _in_memory(service, "a", []) is None
    assert service.groups.heartbeat(P, L, G, "a", []) == [0, 1, 2, 3, 4, 5]
    assert _in_memory(service, "a", [0, 1, 2, 3, 4, 5]) == [0, 1, 2, 3, 4, 5]


def test_a_group_whose_lock_is_held_is_left_to_the_full_heartbeat(
    service: LogHubService,
) -> None:
    service.groups.heartbeat(P, L, G, "a", [])
    live = service.groups._live[(P, L, G)]
    with live.lock:  # another thread in the middle of a round (or of a restore)
        assert _in_memory(service, "a", [0, 1, 2, 3, 4, 5]) is None
    assert _in_memory(service, "a", [0, 1, 2, 3, 4, 5]) == [0, 1, 2, 3, 4, 5]


def test_a_changed_shard_list_or_a_read_only_shard_is_left_to_the_full_heartbeat(
    service: LogHubService,
) -> None:
    """Whether a read-only shard is finished reads its log and the group's checkpoint: not
    on the event loop."""
    everything = [0, 1, 2, 3, 4, 5]
    assert service.groups.heartbeat(P, L, G, "a", []) == everything
    service.split_shard(P, L, 0, None)  # shard 0 turns read-only; two children appear
    assert _in_memory(service, "a", everything) is None  # the list changed
    granted = service.groups.heartbeat(P, L, G, "a", everything)
    assert _in_memory(service, "a", granted) is None  # a read-only shard is in it


def test_bad_heartbeats_get_the_same_errors(service: LogHubService) -> None:
    service.groups.heartbeat(P, L, G, "a", [])
    for body in ({"shards": [0]}, ["x"], [True], [-1], [2**31], [0] * 5000):
        with pytest.raises(ParameterInvalid):
            _in_memory(service, "a", body)
        with pytest.raises(ParameterInvalid):
            service.groups.heartbeat(P, L, G, "a", body)
    with pytest.raises(ParameterInvalid):
        _in_memory(service, "", [])
    service.groups.delete(P, L, G)
    with pytest.raises(ConsumerGroupNotExist):
        _in_memory(service, "a", [])
