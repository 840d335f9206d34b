"""ClusterRouting.coordinator: which node a consumer-group request goes to, from the node's
view of the cluster (no etcd needed: the view is what the node's watches filled in)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loghub.cluster.membership import NodeInfo
from loghub.errors import ServerBusy
from loghub.server.cluster_routing import ClusterRouting


def routing(me: str, nodes: list[NodeInfo], holders: dict[tuple[str, str, str], str],
            alive: bool = True) -> ClusterRouting:  # fmt: skip
    view = ClusterRouting("etcd://127.0.0.1:1", NodeInfo(me, "127.0.0.1:1"), None, None, 2)  # type: ignore[arg-type]
    view.agent = SimpleNamespace(alive=alive, nodes={n.node_id: n for n in nodes})  # type: ignore[assignment]
    view.coordinators = SimpleNamespace(holders=holders)  # type: ignore[assignment]
    return view


NODES = [NodeInfo(f"n{i}", f"127.0.0.1:{9000 + i}") for i in range(3)]
GROUP = ("p", "logs", "g")


def test_a_live_holder_keeps_its_group_and_a_gone_one_is_replaced_by_the_hashed_node() -> None:
    assert routing("n0", NODES, {GROUP: "n2"}).coordinator(*GROUP) == NODES[2]
    assert routing("n2", NODES, {GROUP: "n2"}).coordinator(*GROUP) is None  # served here
    hashed = {routing("n0", NODES, {}).coordinator(*GROUP)}
    gone = {routing("n0", NODES, {GROUP: "n9"}).coordinator(*GROUP)}
    assert hashed == gone


def test_no_node_to_coordinate_or_no_lease_is_a_503_that_says_why() -> None:
    draining = [NodeInfo(n.node_id, n.advertise, draining=True) for n in NODES]
    with pytest.raises(ServerBusy, match="no node can coordinate consumer group g"):
        routing("n0", draining, {}).coordinator(*GROUP)
    with pytest.raises(ServerBusy, match="lost contact with the cluster's control plane"):
        routing("n0", NODES, {GROUP: "n0"}, alive=False).coordinator(*GROUP)
