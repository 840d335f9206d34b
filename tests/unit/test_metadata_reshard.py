"""Split and merge in the metadata store: ranges, lineage and sealing, for any sequence."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from metadata_backends import MetadataBackend

from loghub.errors import ParameterInvalid, ShardNotExist, ShardReadOnly
from loghub.metadata import KEY_SPACE_END, LogstoreSpec, MetadataStore, Shard
from loghub.testing import FakeClock


class RecordingSealer:
    """Seals by handing out a made-up end; remembers what was sealed, and can fail."""

    def __init__(self) -> None:
        self.sealed: dict[int, int] = {}
        self.fail_on: int | None = None

    def seal(self, shard_id: int) -> int:
        if shard_id == self.fail_on:
            raise OSError("disk gone")
        self.sealed[shard_id] = 100 + shard_id
        return self.sealed[shard_id]

    def unseal(self, shard_id: int) -> None:
        del self.sealed[shard_id]


def _store(backend: MetadataBackend, place: str, shards: int = 2) -> MetadataStore:
    """The store on ``place`` (SQLite or etcd), with proj1/store1 made on the first open."""
    store: MetadataStore = backend.open(place, FakeClock())
    if "proj1" not in {p.name for p in store.list_projects()[0]}:
        store.create_project("proj1")
        store.create_logstore("proj1", LogstoreSpec(name="store1", shard_count=shards))
    return store


def _check_invariants(shards: list[Shard], roots: set[int]) -> None:
    by_id = {s.shard_id: s for s in shards}
    writable = sorted((s for s in shards if s.status == "readwrite"), key=lambda s: s.begin_key)
    assert writable[0].begin_key == 0
    assert writable[-1].end_key == KEY_SPACE_END
    for left, right in zip(writable, writable[1:], strict=False):
        assert left.end_key == right.begin_key, "gap or overlap between readwrite shards"
    for shard in shards:
        if shard.status == "readonly":
            assert shard.children and shard.end_seq is not None and shard.closed_at_s
        else:
            assert not shard.children and shard.end_seq is None
        for parent in shard.parents:
            assert shard.shard_id in by_id[parent].children
            assert parent < shard.shard_id, "lineage edges go from older to newer shards"
        for child in shard.children:
            assert shard.shard_id in by_id[child].parents
        # a child's range is exactly covered by its parents' ranges
        if shard.parents:
            parents = sorted((by_id[p] for p in shard.parents), key=lambda s: s.begin_key)
            assert parents[0].begin_key <= shard.begin_key
            assert parents[-1].end_key >= shard.end_key
    # every shard descends from an original shard (edges only go to higher ids: a DAG)
    for shard in shards:
        pending, seen = [shard.shard_id], set()
        while pending:
            current = pending.pop()
            seen.add(current)
            pending.extend(by_id[current].parents)
        assert seen & roots


operations = st.lists(
    st.tuples(st.sampled_from(["split", "merge"]), st.integers(0, 10_000), st.floats(0.01, 0.99)),
    max_size=40,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=operations, initial=st.integers(1, 4))
def test_any_sequence_of_splits_and_merges_keeps_ranges_tiled_and_lineage_a_dag(
    metadata_backend: MetadataBackend, ops: list[tuple[str, int, float]], initial: int
) -> None:
    place = metadata_backend.new_place()
    store = _store(metadata_backend, place, initial)
    sealer = RecordingSealer()
    roots = set(range(initial))
    for kind, pick, fraction in ops:
        writable = [s for s in store.list_shards("proj1", "store1") if s.status == "readwrite"]
        shard = writable[pick % len(writable)]
        if kind == "split" and shard.end_key - shard.begin_key >= 2:
            key = shard.begin_key + max(1, int((shard.end_key - shard.begin_key) * fraction))
            key = min(key, shard.end_key - 1)
            parent, left, right = store.split_shard("proj1", "store1", shard.shard_id, key, sealer)
            assert (left.begin_key, left.end_key, right.end_key) == (
                shard.begin_key,
                key,
                shard.end_key,
            )
            assert parent.end_seq == sealer.sealed[shard.shard_id]
        elif kind == "merge" and shard.end_key != KEY_SPACE_END:
            merged, left, right = store.merge_shard("proj1", "store1", shard.shard_id, sealer)
            assert (merged.begin_key, merged.end_key) == (left.begin_key, right.end_key)
            assert merged.parents == (left.shard_id, right.shard_id)
        _check_invariants(store.list_shards("proj1", "store1"), roots)
    shards = store.list_shards("proj1", "store1")
    store.close()
    reopened = _store(metadata_backend, place)
    assert reopened.list_shards("proj1", "store1") == shards, "lineage survives a reopen"
    reopened.close()


def test_split_and_merge_refuse_bad_requests(metadata_backend: MetadataBackend) -> None:
    store = _store(metadata_backend, metadata_backend.new_place())
    sealer = RecordingSealer()
    with pytest.raises(ParameterInvalid):
        store.split_shard("proj1", "store1", 0, 0, sealer)  # not strictly inside
    with pytest.raises(ShardNotExist):
        store.split_shard("proj1", "store1", 9, 5, sealer)
    with pytest.raises(ParameterInvalid):
        store.merge_shard("proj1", "store1", 1, sealer)  # no right-hand neighbour
    store.split_shard("proj1", "store1", 0, 2**126, sealer)
    with pytest.raises(ShardReadOnly):
        store.split_shard("proj1", "store1", 0, 2**125, sealer)
    with pytest.raises(ShardReadOnly):
        store.merge_shard("proj1", "store1", 0, sealer)


def test_a_failed_seal_changes_nothing_and_unseals_what_it_sealed(
    metadata_backend: MetadataBackend,
) -> None:
    store = _store(metadata_backend, metadata_backend.new_place())
    sealer = RecordingSealer()
    before = store.list_shards("proj1", "store1")
    sealer.fail_on = 1
    with pytest.raises(OSError):
        store.merge_shard("proj1", "store1", 0, sealer)
    assert sealer.sealed == {}
    assert store.list_shards("proj1", "store1") == before


def test_merged_ids_are_new_and_never_reused(metadata_backend: MetadataBackend) -> None:
    store = _store(metadata_backend, metadata_backend.new_place(), 2)
    sealer = RecordingSealer()
    merged, _, _ = store.merge_shard("proj1", "store1", 0, sealer)
    assert merged.shard_id == 2
    _, left, right = store.split_shard("proj1", "store1", 2, 2**127, sealer)
    assert (left.shard_id, right.shard_id) == (3, 4)
