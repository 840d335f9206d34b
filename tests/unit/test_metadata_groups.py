"""Consumer groups and checkpoints in the metadata database: durable, cached, cascaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from loghub.errors import ConsumerGroupAlreadyExist, ConsumerGroupNotExist, ParameterInvalid
from loghub.metadata import Checkpoint, ConsumerGroupDef, LogstoreSpec, MetadataStore
from loghub.testing import FakeClock


def _open(path: Path) -> MetadataStore:
    return MetadataStore.open(f"sqlite:///{path / 'meta.db'}", FakeClock())


@pytest.fixture()
def store(tmp_path: Path) -> MetadataStore:
    meta = _open(tmp_path)
    meta.create_project("proj1")
    meta.create_logstore("proj1", LogstoreSpec(name="store1", shard_count=2))
    return meta


def test_groups_and_checkpoints_survive_a_reopen(store: MetadataStore, tmp_path: Path) -> None:
    groups = store.consumer_groups("proj1", "store1")
    groups.create("proj1", "store1", ConsumerGroupDef("cg1", 60, False))
    groups.create("proj1", "store1", ConsumerGroupDef("cg2", 10, True))
    groups.update("proj1", "store1", "cg1", ordered=True)
    groups.save_checkpoint("proj1", "store1", "cg1", Checkpoint(0, "MTA=", "c1", 123))
    groups.save_checkpoint("proj1", "store1", "cg1", Checkpoint(0, "MjA=", "c2", 456))
    store.close()
    reopened = _open(tmp_path).consumer_groups("proj1", "store1")
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
    store: MetadataStore, tmp_path: Path
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
    assert _open(tmp_path).consumer_groups("proj1", "store1").list_groups("proj1", "store1") == []
