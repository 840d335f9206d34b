"""What the console and the lag metrics read of a server-side group: each shard's owner and
lag, hand-offs counted once, and a silent consumer no longer shown as an owner. In-process,
on a real data directory and SQLite, with a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loghub.server.config import ServerConfig
from loghub.server.service import LogHubService
from loghub.testing import FakeClock
from loghub.wire.cursor import encode_cursor
from loghub.wire.logs import make_log_group

P, L, G = "shop", "orders", "billing"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def service(tmp_path: Path, clock: FakeClock) -> Iterator[LogHubService]:
    service = LogHubService(ServerConfig(data_dir=tmp_path, port=0, parse_processes=0), clock)
    service.metadata.create_project(P, "")
    service.create_logstore(P, {"logstoreName": L, "shardCount": 2, "ttl": 1})
    service.groups.create(P, L, {"consumerGroup": G, "timeout": 10})
    try:
        yield service
    finally:
        service.close()


def _beat(service: LogHubService, consumer: str, held: list[int]) -> list[int]:
    return service.groups.heartbeat(P, L, G, consumer, held)


def _owners(service: LogHubService) -> dict[int, tuple[str, str]]:
    return {s.shard_id: (s.state, s.owner) for s in service.groups.shard_status(P, L, G)}


def test_the_old_holder_owns_a_shard_in_hand_off_and_the_hand_off_counts_once(
    service: LogHubService, clock: FakeClock
) -> None:
    events: list[tuple[bool, int]] = []
    service.groups.heartbeat_observer = lambda _group, changed, moved: events.append(
        (changed, moved)
    )
    assert _beat(service, "a", []) == [0, 1]
    assert _beat(service, "b", []) == []  # a must let one go first
    owners = _owners(service)
    moving = next(s for s, (state, _) in owners.items() if state == "transfer")
    assert owners[moving] == ("transfer", "a")
    kept = [s for s in (0, 1) if s != moving]
    assert _beat(service, "a", [0, 1]) == kept
    assert _beat(service, "a", kept) == kept  # a lets it go
    assert _beat(service, "b", []) == [moving]
    assert _owners(service) == {kept[0]: ("already_alloc", "a"), moving: ("already_alloc", "b")}
    assert sum(moved for _, moved in events) == 1
    assert events == [(True, 0), (True, 0), (False, 0), (True, 1), (False, 0)]


def test_a_silent_consumer_is_not_shown_as_an_owner(
    service: LogHubService, clock: FakeClock
) -> None:
    _beat(service, "a", [])
    clock.advance(10_001)
    assert _owners(service) == {0: ("not_alloc", ""), 1: ("not_alloc", "")}


def test_lag_counts_log_groups_after_the_checkpoint_and_the_seconds_between_them(
    service: LogHubService, clock: FakeClock
) -> None:
    raw = make_log_group([(1_700_000_000, {"k": "v"})] * 3).SerializeToString()
    for _ in range(4):
        service.put_logs(P, L, "0", None, raw, None, len(raw))
        clock.advance(1_500)
    service.groups.update_checkpoint(
        P, L, G, "", True, {"shard": 0, "checkpoint": encode_cursor(1)}
    )
    status = {s.shard_id: s for s in service.groups.shard_status(P, L, G)}
    assert (status[0].checkpoint_seq, status[0].end_seq, status[0].lag_log_groups) == (1, 4, 3)
    assert status[0].lag_s == 4.5  # group 0 (consumed) and group 3 (newest): 3 x 1.5 s apart
    assert (status[1].lag_log_groups, status[1].lag_s) == (0, 0.0)
    lags = {(lag.shard_id, lag.lag_log_groups) for lag in service.group_lags()}
    assert lags == {(0, 3), (1, 0)}
