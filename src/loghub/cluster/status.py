"""What `loghub cluster status` and `loghub node drain` read and write in etcd.

The status is read from etcd alone (no node is asked), so it answers while nodes are down:
the live nodes with their racks and drain marks, the controller, the shards each node holds,
and the shards whose node is gone (unavailable: with one replica their logs wait for it).
With replicated shards (``--replication-factor`` above 1) a node's ``shards`` counts the
shards it leads and ``replicas`` those it holds a copy of; a shard is unavailable while its
leader is gone and not yet replaced, and **under-replicated** while fewer of its replicas
are in sync than it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loghub.cluster.controller import PlacementRecord, read_placements
from loghub.cluster.etcd_store import EtcdStore
from loghub.cluster.membership import CONTROLLER_KEY, DRAIN_PREFIX, NodeInfo, read_nodes
from loghub.cluster.replicas import ReplicaRecord, ShardKey, read_replica_records_at

__all__ = ["cluster_status", "set_drain", "summarize"]


async def cluster_status(url: str) -> dict[str, Any]:
    async with EtcdStore(url) as store:
        nodes = await read_nodes(store)
        controller = await store.get(CONTROLLER_KEY)
        placements = await read_placements(store)
        drains = sorted(
            e.key.removeprefix(DRAIN_PREFIX) for e in await store.get_prefix(DRAIN_PREFIX)
        )
        replicas, _revision = await read_replica_records_at(store)
    return summarize(
        nodes,
        controller.value.decode() if controller else None,
        controller.create_revision if controller else None,
        placements,
        drains,
        replicas,
    )


def summarize(
    nodes: Mapping[str, NodeInfo],
    controller: str | None,
    controller_epoch: int | None,
    placements: Mapping[tuple[str, str], PlacementRecord],
    drains: list[str],
    replicas: Mapping[ShardKey, ReplicaRecord] | None = None,
) -> dict[str, Any]:
    """The status from a view of the cluster: etcd's (``cluster_status``) or a node's own
    (its ``/metrics``), so that both say the same thing the same way."""
    held: dict[str, int] = {node_id: 0 for node_id in nodes}
    copies: dict[str, int] = {node_id: 0 for node_id in nodes}
    unavailable = []
    moving = []
    under_replicated = []
    for (project, logstore, shard_id), replica in sorted((replicas or {}).items()):
        where = {"project": project, "logstore": logstore, "shard": shard_id}
        if replica.leader in nodes:
            held[replica.leader] += 1
        else:
            unavailable.append({**where, "node": replica.leader})
        for node_id in replica.replicas:
            if node_id in copies:
                copies[node_id] += 1
        if len(replica.isr) < len(replica.replicas):
            under_replicated.append(
                {**where, "leader": replica.leader, "epoch": replica.epoch,
                 "isr": list(replica.isr), "replicas": list(replica.replicas)}
            )  # fmt: skip
    for (project, logstore), record in sorted(placements.items()):
        for shard_id, owner in sorted(record.owners.items()):
            if owner in nodes:
                held[owner] += 1
            else:
                unavailable.append(
                    {"project": project, "logstore": logstore, "shard": shard_id, "node": owner}
                )
        for shard_id, target in sorted(record.handover.items()):
            moving.append(
                {"project": project, "logstore": logstore, "shard": shard_id, "to": target}
            )
    return {
        "controller": controller,
        "controller_epoch": controller_epoch,
        "nodes": [
            {
                "node": node.node_id,
                "advertise": node.advertise,
                "rack": node.rack,
                "draining": node.draining,
                "shards": held[node.node_id],
                "replicas": copies[node.node_id],
                # its Kafka listener and broker id (docs/kafka.md); None without one
                "kafka": node.kafka or None,
                "kafka_broker_id": node.broker_id if node.kafka else None,
            }
            for node in sorted(nodes.values(), key=lambda n: n.node_id)
        ],
        "drains": drains,
        "unavailable_shards": unavailable,
        "handovers": moving,
        "under_replicated_shards": under_replicated,
    }


async def set_drain(url: str, node_id: str, draining: bool) -> None:
    async with EtcdStore(url) as store:
        if draining:
            await store.put(DRAIN_PREFIX + node_id, b"")
        else:
            await store.delete(DRAIN_PREFIX + node_id)
