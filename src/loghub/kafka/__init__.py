"""The Kafka front end: the Kafka wire protocol over the same logstores, shards and
checkpoints as the REST API (docs/kafka.md)."""

from __future__ import annotations

import socket

from loghub._clock import SystemClock
from loghub.kafka.broker import Broker, BrokerConfig
from loghub.kafka.listener import KafkaListener, ListenerLimits
from loghub.server.config import ServerConfig
from loghub.server.service import LogHubService

__all__ = ["Broker", "BrokerConfig", "KafkaListener", "ListenerLimits", "start_listener"]


def start_listener(
    service: LogHubService, sock: socket.socket, config: ServerConfig
) -> KafkaListener:
    """Serves the Kafka protocol on ``sock`` from a thread of its own; ``stop()`` ends it."""
    port = sock.getsockname()[1]
    broker = Broker(
        service,
        BrokerConfig(
            advertised_host=config.kafka_advertised_host or config.host,
            advertised_port=port,
            topic_separator=config.kafka_topic_separator,
            initial_rebalance_delay_ms=config.kafka_initial_rebalance_delay_ms,
        ),
        SystemClock(),
    )
    listener = KafkaListener(broker, sock, ListenerLimits())
    listener.start()
    return listener
