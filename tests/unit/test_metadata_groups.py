"""Consumer groups and checkpoints in the metadata database: durable, cached, cascaded."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from metadata_backends import MetadataBackend

from loghub.errors import ConsumerGroupAlreadyExist, ConsumerGroupNotExist, ParameterInvalid
from loghub.metadata import Checkpoint, ConsumerGroupDef, LogstoreSpec, MetadataStore
from loghub.testing import FakeClock


@pytest.fixture()
def place(metadata_backend: MetadataBackend) -> str:
    return metadata_backend.new_place()


@pytest.fixture()
def reopen(metadata_backend: MetadataBackend, place: str) -> Callable[[], MetadataStore]:
    """Opens the store on the test's place (on SQLite or etcd) again."""
    return lambda: metadata_backend.open(place, FakeClock())  # type: ignore[no-any-return]


@pytest.fixture()
def store(reopen: Callable[[], MetadataStore]) -> MetadataStore:
    meta = reopen()
    meta.create_project("proj1")
    meta.create_logstore("proj1", LogstoreSpec(name="store1", shard_count=2))
    return meta


def test_groups_and_checkpoints_survive_a_reopen(
    store: MetadataStore, reopen: Callable[[], MetadataStore]
) -> None:
    groups = store.consumer_groups("proj1", "store1")
    groups.create("proj1", "store1", ConsumerGroupDef("cg1", 60, False))
    groups.create("proj1", "store1", ConsumerGroupDef("cg2", 10, True))
    groups.update("proj1", "store1", "cg1", ordered=True)
    groups.save_checkpoint("proj1", "store1", "cg1", Checkpoint(0, "MTA=", "c1", 123))
    groups.save_checkpoint("proj1", "store1", "cg1", Checkpoint(0, "MjA=", "c2", 456))
    store.close()
    reopened = reopen().consumer_groups("proj1", "store1")
    assert reopened.list_groups("proj1", "store1") == [
        ConsumerGroupDef("cg1", 60, True),
        ConsumerGroupDef("cg2", 10, True),
    ]
    assert reopened.checkpoints("proj1", "store1", "cg1") == {0: Checkpoint(0, "MjA=", "c2", 456)}
    assert reopened.checkpoints("proj1", "store1", "cg2") == {}


def test_duplicate_missing_and_invalid_groups_are_refused(store: MetadataStore) -> None:
    groups = store.consumer_groups("proj1", "store1")
    groups.create("proj1", "store1", ConsumerGroupDef("cg1", 60, False))
    with pytest.raises(ConsumerGroupAlreadyExist):
        groups.create("proj1", "store1", ConsumerGroupDef("cg1", 5, False))
    with pytest.raises(ConsumerGroupNotExist):
        groups.update("proj1", "store1", "nope", timeout_s=3)
    with pytest.raises(ConsumerGroupNotExist):
        groups.checkpoints("proj1", "store1", "nope")
    for bad in (ConsumerGroupDef("x", 60, False), ConsumerGroupDef("cg3", 0, False)):
        with pytest.raises(ParameterInvalid):
            groups.create("proj1", "store1", bad)


def test_deleting_a_group_or_its_logstore_deletes_its_checkpoints(
    store: MetadataStore, reopen: Callable[[], MetadataStore]
) -> None:
    groups = store.consumer_groups("proj1", "store1")
    groups.create("proj1", "store1", ConsumerGroupDef("cg1", 60, False))
    groups.save_checkpoint("proj1", "store1", "cg1", Checkpoint(1, "MQ==", "c1", 1))
    groups.delete("proj1", "store1", "cg1")
    groups.create("proj1", "store1", ConsumerGroupDef("cg1", 60, False))
    assert groups.checkpoints("proj1", "store1", "cg1") == {}
    groups.save_checkpoint("proj1", "store1", "cg1", Checkpoint(1, "MQ==", "c1", 1))
    store.delete_logstore("proj1", "store1")
    store.create_logstore("proj1", LogstoreSpec(name="store1", shard_count=2))
    assert store.consumer_groups("proj1", "store1").list_groups("proj1", "store1") == []
    store.close()
    assert reopen().consumer_groups("proj1", "store1").list_groups("proj1", "store1") == []
