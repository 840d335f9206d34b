"""The Kafka front end: the Kafka wire protocol over the same logstores, shards and
checkpoints as the REST API (docs/kafka.md)."""

from __future__ import annotations

import socket
import ssl

from loghub._clock import SystemClock
from loghub.kafka.broker import Broker, BrokerConfig
from loghub.kafka.listener import KafkaListener, ListenerLimits
from loghub.server.config import ServerConfig
from loghub.server.service import LogHubService

__all__ = ["Broker", "BrokerConfig", "KafkaListener", "ListenerLimits", "start_listener"]


def start_listener(
    service: LogHubService, sock: socket.socket, config: ServerConfig
) -> KafkaListener:
    """Serves the Kafka protocol on ``sock`` from a thread of its own; ``stop()`` ends it.
    With access keys, clients authenticate with SASL/PLAIN (key id and secret); with the
    server's TLS certificate, the listener speaks TLS only (SASL_SSL)."""
    port = sock.getsockname()[1]
    broker = Broker(
        service,
        BrokerConfig(
            advertised_host=config.kafka_advertised_host or config.host,
            advertised_port=port,
            topic_separator=config.kafka_topic_separator,
            initial_rebalance_delay_ms=config.kafka_initial_rebalance_delay_ms,
            keys=config.keys,
            key_grants=config.key_grants,
        ),
        SystemClock(),
    )
    tls = None
    if config.tls_cert_file is not None and config.tls_key_file is not None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    listener = KafkaListener(broker, sock, ListenerLimits(), tls)
    listener.start()
    return listener
