"""The Kafka front end in a cluster: which broker leads a partition, which coordinates a group.

In cluster mode (``loghub serve --cluster ... --kafka-port P``) every node with a Kafka
listener is a Kafka broker, its id derived from its node id
(``loghub.cluster.membership.kafka_broker_id``), at the address it publishes in its
membership record. A partition is a shard, and its leader is the node that owns the shard's
log (the placement record); a shard whose owner is gone, or that is not placed yet, has no
leader. Kafka clients send Produce, Fetch and ListOffsets to the leader themselves: a node
answers them only for the shards it owns, and NOT_LEADER_OR_FOLLOWER otherwise, so a client
with a stale view refreshes its metadata instead of being served by a node that does not
hold the log.

Groups have one coordinator node, the one ``ClusterRouting.coordinator`` names for the REST
front end too; ``coordinator`` below is the only place the Kafka front end asks.

Reads the node agent's view (plain dictionaries the agent replaces as a whole when etcd
changes), so it may be called from the Kafka listener's thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from loghub.cluster.membership import NodeInfo, kafka_broker_id
from loghub.errors import ServerBusy
from loghub.server.cluster_routing import ClusterRouting

# the "project" of Kafka groups in the coordinator lookup; not a valid project name
_KAFKA_GROUPS = ".kafka"

__all__ = ["BrokerAddress", "KafkaCluster"]


@dataclass(frozen=True)
class BrokerAddress:
    broker_id: int
    host: str
    port: int
    rack: str | None


def broker_address(node: NodeInfo) -> BrokerAddress | None:
    """The node as a Kafka broker; None for a node without a Kafka listener."""
    host, _, port = node.kafka.rpartition(":")
    if not host or not port.isdigit():
        return None
    return BrokerAddress(node.broker_id, host, int(port), node.rack or None)


class KafkaCluster:
    """What the broker needs to know of the cluster, read from the node's routing."""

    def __init__(self, routing: ClusterRouting, this: BrokerAddress) -> None:
        self._routing = routing
        self.this = this

    def brokers(self) -> list[BrokerAddress]:
        """The live nodes with a Kafka listener, this one always among them."""
        agent = self._routing.agent
        found = {self.this.broker_id: self.this}
        for node in () if agent is None else list(agent.nodes.values()):
            address = broker_address(node)
            if address is not None:
                found.setdefault(address.broker_id, address)
        return [found[k] for k in sorted(found)]

    def leader(self, project: str, logstore: str, shard_id: int) -> tuple[int | None, int]:
        """(the leader's broker id or None when the shard has none now, the broker id of the
        node holding the shard's log or -1 when it is not placed)."""
        agent = self._routing.agent
        if agent is None:
            return None, -1
        owner = agent.owner_id(project, logstore, shard_id)
        if owner is None:
            return None, -1
        if owner == self._routing.node_id:
            return (self.this.broker_id if agent.alive else None), self.this.broker_id
        node = agent.nodes.get(owner)
        address = None if node is None else broker_address(node)
        return (None if address is None else address.broker_id), kafka_broker_id(owner)

    def serves(self, project: str, logstore: str, shard_id: int) -> bool:
        """Whether this node holds the shard's log and may act on it (its lease is alive)."""
        agent = self._routing.agent
        return (
            agent is not None
            and agent.alive
            and agent.owner_id(project, logstore, shard_id) == self._routing.node_id
        )

    def local_writable(self, project: str, logstore: str, writable: list[int]) -> list[int]:
        return self._routing.local_writable(project, logstore, writable)

    def owner_node(self, project: str, logstore: str, shard_id: int) -> NodeInfo | None:
        """The live node holding a shard other than this one; ServerBusy when there is none."""
        return self._routing.shard_node(project, logstore, shard_id)

    def controller_id(self) -> int:
        """The broker id of the cluster's controller; -1 while there is none, or when it has
        no Kafka listener."""
        agent = self._routing.agent
        node = None if agent is None else agent.controller_node()
        address = None if node is None else broker_address(node)
        return -1 if address is None else address.broker_id

    def coordinator(self, group_id: str) -> BrokerAddress | None:
        """The broker coordinating ``group_id``: this one, another, or None when there is
        none now (no live node, or it has no Kafka listener; or this node has not joined the
        cluster yet: the listener opens before the node's agent starts).

        A Kafka group may read several topics (logstores), so it is not one of the
        per-logstore groups whose coordinators hold keys in etcd: it is placed by the same
        rendezvous hash over the live nodes, under a name no logstore can have, and its
        members' state lives in that node's memory, as on a Kafka broker. When the nodes
        change, about one group in N moves; its clients get NOT_COORDINATOR, find the new
        coordinator and join again, resuming from their committed offsets (in etcd)."""
        if self._routing.agent is None:
            return None
        try:
            node = self._routing.coordinator(_KAFKA_GROUPS, "", group_id)
        except ServerBusy:
            return None
        if node is None:
            return self.this
        return broker_address(node)

    def append_remote(
        self, node: NodeInfo, project: str, logstore: str, shard_id: int, raw: bytes
    ) -> None:
        """Appends a LogGroup to a shard another node holds (a PutLogs to that node);
        returns once it is durable there. Blocking: call from a thread."""
        self._routing.put_log_group(node, project, logstore, shard_id, raw)
