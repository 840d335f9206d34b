"""The ClusterStore seam and its single-node implementation: one node leads every shard in
epoch 0 until changed, and every change is a compare-and-swap on the record's version."""

from __future__ import annotations

import pytest

from loghub.errors import FencedError
from loghub.metadata import ClusterStore, ShardLeadership, SingleNodeClusterStore


def test_a_single_node_leads_every_shard_in_epoch_0_alone() -> None:
    store: ClusterStore = SingleNodeClusterStore("n0")
    assert store.leadership("p", "s", 3) == ShardLeadership("n0", 0, ("n0",), 0)
    assert store.high_watermark_checkpoint("p", "s", 3) == 0


def test_changes_name_the_version_they_were_decided_on() -> None:
    store = SingleNodeClusterStore("n0")
    grown = store.change_isr("p", "s", 0, ("n0", "n1"), version=0)
    assert grown == ShardLeadership("n0", 0, ("n0", "n1"), 1)
    elected = store.elect_leader("p", "s", 0, "n1", version=1)
    assert elected == ShardLeadership("n1", 1, ("n0", "n1"), 2)
    # a deposed leader acting on what it read before is refused, whatever it asks
    with pytest.raises(FencedError):
        store.change_isr("p", "s", 0, ("n0",), version=1)
    with pytest.raises(FencedError):
        store.elect_leader("p", "s", 0, "n0", version=1)
    assert store.leadership("p", "s", 0) == elected
    assert store.leadership("p", "s", 1).version == 0  # shards are separate records


def test_a_leader_comes_only_from_the_isr_and_the_isr_keeps_the_leader() -> None:
    store = SingleNodeClusterStore("n0")
    with pytest.raises(FencedError, match="not in the in-sync replicas"):
        store.elect_leader("p", "s", 0, "n9", version=0)
    with pytest.raises(FencedError, match="must keep the leader"):
        store.change_isr("p", "s", 0, ("n1",), version=0)
    assert store.leadership("p", "s", 0).version == 0


def test_the_high_watermark_checkpoint_never_goes_back() -> None:
    store = SingleNodeClusterStore()
    store.checkpoint_high_watermark("p", "s", 0, 50)
    store.checkpoint_high_watermark("p", "s", 0, 40)
    assert store.high_watermark_checkpoint("p", "s", 0) == 50
