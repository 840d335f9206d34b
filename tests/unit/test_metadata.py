"""The metadata layer: hash-key math, and the store on real SQLite files and real PostgreSQL."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from metadata_backends import MetadataBackend

from loghub.errors import (
    LogHubError,
    LogStoreAlreadyExist,
    LogStoreInfoInvalid,
    LogStoreNotExist,
    ParameterInvalid,
    ProjectAlreadyExist,
    ProjectNotExist,
    ShardNotExist,
)
from loghub.metadata import (
    KEY_SPACE_END,
    LogstoreSpec,
    MetadataStore,
    even_ranges,
    format_hash_key,
    max_split_shard_max,
    md5_hash_key,
    parse_hash_key,
    shards_per_logstore_max,
)

# -- hashing ---------------------------------------------------------------------------------


def test_short_hash_keys_are_right_padded_with_zeros() -> None:
    assert parse_hash_key("8") == 2**127
    assert parse_hash_key("C0") == 3 * 2**126
    assert parse_hash_key("00000000000000000000000000000001") == 1
    assert parse_hash_key("f" * 32) == KEY_SPACE_END - 1


@pytest.mark.parametrize("text", ["", "g", "0x1", " 1", "1 ", "-1", "f" * 33, "１"])
def test_malformed_hash_keys_are_parameter_invalid(text: str) -> None:
    with pytest.raises(ParameterInvalid):
        parse_hash_key(text)


def test_end_of_key_space_is_written_as_32_f() -> None:
    assert format_hash_key(KEY_SPACE_END) == "f" * 32
    assert format_hash_key(0) == "0" * 32
    assert format_hash_key(2**127) == "8" + "0" * 31


def test_md5_hash_key_is_the_md5_digest_as_a_number() -> None:
    assert md5_hash_key("abc") == int(hashlib.md5(b"abc").hexdigest(), 16)


@given(st.integers(min_value=1, max_value=4096))
def test_even_ranges_tile_the_key_space(shard_count: int) -> None:
    ranges = even_ranges(shard_count)
    assert len(ranges) == shard_count
    assert ranges[0][0] == 0
    assert ranges[-1][1] == KEY_SPACE_END
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    widths = {end - begin for begin, end in ranges}
    assert max(widths) - min(widths) <= 1 and min(widths) > 0


@given(st.integers(min_value=0, max_value=KEY_SPACE_END - 1))
def test_format_then_parse_round_trips(value: int) -> None:
    assert parse_hash_key(format_hash_key(value)) == value


@given(st.text(alphabet="0123456789abcdefABCDEF", min_size=32, max_size=32))
def test_parse_then_format_gives_the_lowercase_key(text: str) -> None:
    value = parse_hash_key(text)
    if value != KEY_SPACE_END - 1:  # ffff...ff is a key; as an end it would mean 2**128
        assert format_hash_key(value) == text.lower()


# -- the store: on SQLite, PostgreSQL and etcd --------------------------------------------


@dataclass
class StepClock:
    wall_ms_now: int = 1_700_000_000_000

    def monotonic_ms(self) -> int:
        return self.wall_ms_now

    def wall_ms(self) -> int:
        return self.wall_ms_now


@pytest.fixture
def clock() -> StepClock:
    return StepClock()


@pytest.fixture
def store_place(any_metadata_backend: MetadataBackend) -> str:
    return any_metadata_backend.new_place()


@pytest.fixture
def store(
    any_metadata_backend: MetadataBackend, store_place: str, clock: StepClock
) -> MetadataStore:
    """A MetadataStore, or an EtcdMetadataStore (the same interface), on a fresh place."""
    opened: MetadataStore = any_metadata_backend.open(store_place, clock)
    return opened


def test_project_create_get_and_json(store: MetadataStore, clock: StepClock) -> None:
    created = store.create_project("my-project", "logs of things")
    assert store.get_project("my-project") == created
    assert created.created_at_s == clock.wall_ms_now // 1000
    body = created.to_json()
    for key in ("projectName", "description", "status", "region", "owner", "createTime",
                "lastModifyTime"):  # fmt: skip
        assert key in body
    assert body["projectName"] == "my-project" and body["status"] == "Normal"


def test_duplicate_and_missing_projects(store: MetadataStore) -> None:
    store.create_project("proj")
    with pytest.raises(ProjectAlreadyExist):
        store.create_project("proj")
    with pytest.raises(ProjectNotExist):
        store.get_project("nope")
    with pytest.raises(ProjectNotExist):
        store.delete_project("nope")


@pytest.mark.parametrize("name", ["ab", "a" * 64, "-abc", "abc-", "ABC", "a_b", "a.bc", ""])
def test_bad_project_names_are_parameter_invalid(store: MetadataStore, name: str) -> None:
    with pytest.raises(ParameterInvalid):
        store.create_project(name)


def test_project_list_pages_and_filters(store: MetadataStore) -> None:
    for i in range(7):
        store.create_project(f"proj-{i}")
    store.create_project("other")
    page, total = store.list_projects(offset=2, size=3)
    assert [p.name for p in page] == ["proj-1", "proj-2", "proj-3"] and total == 8
    page, total = store.list_projects(name_contains="proj", offset=5, size=10)
    assert [p.name for p in page] == ["proj-5", "proj-6"] and total == 7
    with pytest.raises(ParameterInvalid):
        store.list_projects(offset=-1)


def test_logstore_has_even_readwrite_shards(store: MetadataStore) -> None:
    store.create_project("proj")
    logstore = store.create_logstore("proj", LogstoreSpec("events", ttl_days=7, shard_count=3))
    assert store.get_logstore("proj", "events") == logstore
    assert logstore.shard_count == 3
    shards = store.list_shards("proj", "events")
    assert [s.shard_id for s in shards] == [0, 1, 2]
    assert [(s.begin_key, s.end_key) for s in shards] == even_ranges(3)
    assert all(s.status == "readwrite" and s.parents == () for s in shards)
    assert shards[0].to_json()["inclusiveBeginKey"] == "0" * 32
    assert shards[-1].to_json()["exclusiveEndKey"] == "f" * 32
    assert store.get_shard("proj", "events", 1) == shards[1]
    with pytest.raises(ShardNotExist):
        store.get_shard("proj", "events", 3)


def test_logstore_json_has_what_the_sdk_reads_and_keeps_extra_keys(
    store: MetadataStore,
) -> None:
    store.create_project("proj")
    spec = LogstoreSpec("events", auto_split=True, extra={"hot_ttl": 3, "encrypt_conf": {}})
    body = store.create_logstore("proj", spec).to_json()
    assert body["logstoreName"] == "events" and body["ttl"] == 30 and body["shardCount"] == 2
    assert body["autoSplit"] is True and body["appendMeta"] is False
    for key in ("enable_tracking", "maxSplitShard", "telemetryType", "mode", "createTime"):
        assert key in body
    assert body["hot_ttl"] == 3 and body["encrypt_conf"] == {}


def test_duplicate_and_missing_logstores(store: MetadataStore) -> None:
    store.create_project("proj")
    store.create_logstore("proj", LogstoreSpec("events"))
    with pytest.raises(LogStoreAlreadyExist):
        store.create_logstore("proj", LogstoreSpec("events"))
    with pytest.raises(ProjectNotExist):
        store.create_logstore("nope", LogstoreSpec("events"))
    with pytest.raises(LogStoreNotExist):
        store.get_logstore("proj", "other")
    with pytest.raises(ProjectNotExist):
        store.list_shards("nope", "events")
    with pytest.raises(LogStoreNotExist):
        store.delete_logstore("proj", "other")


@pytest.mark.parametrize(
    "spec",
    [
        LogstoreSpec("ab"),
        LogstoreSpec("_events"),
        LogstoreSpec("Events"),
        LogstoreSpec("events", ttl_days=0),
        LogstoreSpec("events", ttl_days=3651),
        LogstoreSpec("events", ttl_days=True),
        LogstoreSpec("events", shard_count=0),
        LogstoreSpec("events", shard_count=shards_per_logstore_max + 1),
        LogstoreSpec("events", max_split_shard=0),
        LogstoreSpec("events", max_split_shard=max_split_shard_max + 1),
        LogstoreSpec("events", auto_split="yes"),  # type: ignore[arg-type]
        LogstoreSpec("events", extra=["hot_ttl"]),  # type: ignore[arg-type]
    ],
)
def test_bad_logstore_settings_are_logstore_info_invalid(
    store: MetadataStore, spec: LogstoreSpec
) -> None:
    store.create_project("proj")
    with pytest.raises(LogStoreInfoInvalid):
        store.create_logstore("proj", spec)
    assert store.list_logstores("proj") == ([], 0)


def test_logstore_names_allow_underscores_and_the_shard_limit(store: MetadataStore) -> None:
    store.create_project("proj")
    store.create_logstore("proj", LogstoreSpec("a_b-c", shard_count=shards_per_logstore_max))
    assert len(store.list_shards("proj", "a_b-c")) == shards_per_logstore_max


def test_logstore_list_pages_and_filters(store: MetadataStore) -> None:
    store.create_project("proj")
    store.create_project("other")
    for name in ("app-b", "app-a", "web", "app-c"):
        store.create_logstore("proj", LogstoreSpec(name, shard_count=1))
    store.create_logstore("other", LogstoreSpec("app-z", shard_count=1))
    assert store.list_logstores("proj") == (["app-a", "app-b", "app-c", "web"], 4)
    assert store.list_logstores("proj", offset=1, size=2) == (["app-b", "app-c"], 4)
    assert store.list_logstores("proj", name_contains="app", offset=2) == (["app-c"], 3)
    with pytest.raises(ProjectNotExist):
        store.list_logstores("nope")


def test_update_logstore_changes_settings_but_not_shards(
    store: MetadataStore, clock: StepClock
) -> None:
    store.create_project("proj")
    before = store.create_logstore("proj", LogstoreSpec("events"))
    clock.wall_ms_now += 5_000
    after = store.update_logstore("proj", "events", {"ttl_days": 90, "extra": {"hot_ttl": 7}})
    assert after.ttl_days == 90 and after.extra == {"hot_ttl": 7}
    assert after.modified_at_s == before.modified_at_s + 5
    assert after.created_at_s == before.created_at_s
    assert after.storage_key == before.storage_key and after.shard_count == 2
    assert store.get_logstore("proj", "events") == after
    with pytest.raises(LogStoreInfoInvalid):
        store.update_logstore("proj", "events", {"shard_count": 4})
    with pytest.raises(LogStoreInfoInvalid):
        store.update_logstore("proj", "events", {"ttl_days": 0})
    assert store.get_logstore("proj", "events") == after


def test_recreated_logstore_gets_a_new_storage_key(store: MetadataStore) -> None:
    store.create_project("proj")
    first = store.create_logstore("proj", LogstoreSpec("events"))
    assert first.storage_key.startswith("proj/events-")
    assert store.delete_logstore("proj", "events") == first
    with pytest.raises(LogStoreNotExist):
        store.list_shards("proj", "events")
    second = store.create_logstore("proj", LogstoreSpec("events", shard_count=1))
    assert second.storage_key != first.storage_key
    assert len(store.list_shards("proj", "events")) == 1


@pytest.mark.parametrize(
    ("key", "shard_id"),
    [
        ("0", 0),
        ("3fffffffffffffffffffffffffffffff", 0),
        ("4", 1),
        ("7fffffffffffffffffffffffffffffff", 1),
        ("8", 2),
        ("C", 3),
        ("ffffffffffffffffffffffffffffffff", 3),
    ],
)
def test_shard_for_key_routes_to_the_covering_shard(
    store: MetadataStore, key: str, shard_id: int
) -> None:
    store.create_project("proj")
    store.create_logstore("proj", LogstoreSpec("events", shard_count=4))
    assert store.shard_for_key("proj", "events", parse_hash_key(key)).shard_id == shard_id


def test_shard_for_key_rejects_keys_outside_the_space(store: MetadataStore) -> None:
    store.create_project("proj")
    store.create_logstore("proj", LogstoreSpec("events"))
    with pytest.raises(ParameterInvalid):
        store.shard_for_key("proj", "events", KEY_SPACE_END)


def test_everything_is_still_there_after_reopening(
    store: MetadataStore, any_metadata_backend: MetadataBackend, store_place: str, clock: StepClock
) -> None:
    store.create_project("proj", "described")
    logstore = store.create_logstore(
        "proj", LogstoreSpec("events", ttl_days=3, shard_count=5, extra={"hot_ttl": 1})
    )
    shards = store.list_shards("proj", "events")
    store.close()
    reopened = any_metadata_backend.open(store_place, clock)
    try:
        assert reopened.get_project("proj").description == "described"
        assert reopened.get_logstore("proj", "events") == logstore
        assert reopened.list_shards("proj", "events") == shards
        with pytest.raises(ProjectAlreadyExist):
            reopened.create_project("proj")
    finally:
        reopened.close()


def test_delete_project_deletes_its_logstores_and_shards(
    store: MetadataStore, any_metadata_backend: MetadataBackend, store_place: str, clock: StepClock
) -> None:
    store.create_project("proj")
    store.create_project("kept")
    made = [store.create_logstore("proj", LogstoreSpec(n)) for n in ("bbb", "aaa")]
    kept = store.create_logstore("kept", LogstoreSpec("aaa"))
    assert store.delete_project("proj") == sorted(made, key=lambda ls: ls.name)
    with pytest.raises(ProjectNotExist):
        store.get_logstore("proj", "aaa")
    store.close()
    reopened = any_metadata_backend.open(store_place, clock)
    try:
        assert reopened.list_projects() == ([reopened.get_project("kept")], 1)
        assert reopened.get_logstore("kept", "aaa") == kept
        reopened.create_project("proj")
        assert reopened.list_logstores("proj") == ([], 0)
        reopened.create_logstore("proj", LogstoreSpec("aaa"))  # no leftover shard rows
    finally:
        reopened.close()


def test_concurrent_creates_of_one_project_make_exactly_one(store: MetadataStore) -> None:
    outcomes: list[Any] = []

    def create() -> None:
        try:
            outcomes.append(store.create_project("racy"))
        except LogHubError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(not isinstance(o, Exception) for o in outcomes) == 1
    assert sum(isinstance(o, ProjectAlreadyExist) for o in outcomes) == 7


def test_sqlite_database_is_in_wal_mode(tmp_path: Path, clock: StepClock) -> None:
    path = tmp_path / "meta.db"
    MetadataStore.open(f"sqlite:///{path}", clock).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()
