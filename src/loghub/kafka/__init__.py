"""The Kafka front end: the Kafka wire protocol over the same logstores, shards and
checkpoints as the REST API (docs/kafka.md)."""

from __future__ import annotations

import socket
import ssl
from typing import TYPE_CHECKING

from loghub._clock import SystemClock
from loghub.kafka.broker import Broker, BrokerConfig
from loghub.kafka.listener import KafkaListener, ListenerLimits
from loghub.server.config import ServerConfig
from loghub.server.service import LogHubService

if TYPE_CHECKING:  # the cluster's modules (and the etcd client) load only in cluster mode
    from loghub.kafka.cluster import KafkaCluster

__all__ = ["Broker", "BrokerConfig", "KafkaListener", "ListenerLimits", "start_listener"]


def start_listener(
    service: LogHubService, sock: socket.socket, config: ServerConfig
) -> KafkaListener:
    """Serves the Kafka protocol on ``sock`` from a thread of its own; ``stop()`` ends it.
    With access keys, clients authenticate with SASL/PLAIN (key id and secret); with the
    server's TLS certificate, the listener speaks TLS only (SASL_SSL). In a cluster the
    broker is one of the cluster's (``kafka/cluster.py``)."""
    host, port = config.kafka_advertised_host or config.host, sock.getsockname()[1]
    if config.kafka_advertise is not None:
        host, port = config.kafka_address() or (host, port)
    broker = Broker(
        service,
        BrokerConfig(
            advertised_host=host,
            advertised_port=port,
            topic_separator=config.kafka_topic_separator,
            initial_rebalance_delay_ms=config.kafka_initial_rebalance_delay_ms,
            fetch_bytes_max=config.limits.pull_bytes_max,  # the same bound as a pull's
            keys=config.keys,
            key_grants=config.key_grants,
        ),
        SystemClock(),
        _cluster(service, host, port, config),
    )
    tls = None
    if config.tls_cert_file is not None and config.tls_key_file is not None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    # the HTTP server's bounds on connections and on stalled bodies hold for Kafka too
    limits = ListenerLimits(
        connections_max=config.limits.connections_max,
        frame_timeout_s=config.limits.body_timeout_s,
    )
    listener = KafkaListener(broker, sock, limits, tls)
    listener.start()
    return listener


def _cluster(
    service: LogHubService, host: str, port: int, config: ServerConfig
) -> KafkaCluster | None:
    """The cluster's view for the broker in cluster mode: the node's routing is the service's
    way to the shard logs on other nodes."""
    if config.cluster is None:
        return None
    from loghub.cluster.membership import kafka_broker_id
    from loghub.kafka.cluster import BrokerAddress, KafkaCluster
    from loghub.server.cluster_routing import ClusterRouting

    routing = service.remote_logs
    assert isinstance(routing, ClusterRouting), "a cluster node routes through ClusterRouting"
    this = BrokerAddress(
        kafka_broker_id(config.cluster.node_id), host, port, config.cluster.rack or None
    )
    return KafkaCluster(routing, this)
