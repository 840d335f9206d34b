"""The Kafka API handlers: each decodes a request, calls ``LogHubService`` and encodes the answer.

The handlers translate; the rules are the service's (validation, quotas, durability,
resharding) and the coordinator's (group membership). ``SUPPORTED`` is what ApiVersions
advertises; a request outside it closes the connection.

Produce: each record batch becomes one LogGroup appended to the partition's shard (see
``mapping.py``); ``acks=0`` gets no answer, ``acks=1`` and ``acks=-1`` are both answered once
the group is durable under the server's fsync policy (as a REST PutLogs). A batch of an
idempotent producer (producer id >= 0) is checked against the last five batches of that
producer and partition: a retried batch gets its first answer again and is not stored twice;
a gap in sequence numbers is OUT_OF_ORDER_SEQUENCE_NUMBER. That state is kept in memory, so
a retry that crosses a server restart may be stored twice. Produce requests of one
connection are handled one after the other, so that a producer's pipelined batches keep their
order.

A Produce to a read-only (split or merged) partition is accepted and written to a writable
shard of the logstore; the answer's base offset is then -1.

Fetch long-polls: without ``MinBytes`` of data it looks again every ``fetch_poll_ms`` until
``MaxWaitMs`` has passed.

Committed offsets are LogHub checkpoints of the consumer group of the same name on the
topic's logstore (created when first committed), so ``loghub group`` commands and LogHub
consumers see them. The cursor names the next log group to read (the one after, when a commit
is at the end of a group); an offset inside a log group is kept exactly in the checkpoint's
consumer field (``kafka:<offset>``).

In a cluster (``cluster`` given; see ``kafka/cluster.py``) every node is a broker: Metadata
lists the live ones and names each partition's leader, the node holding the shard;
Produce, Fetch and ListOffsets for a shard this node does not hold answer
NOT_LEADER_OR_FOLLOWER, and group requests reaching a node that does not coordinate the
group answer NOT_COORDINATOR, so that the clients go where they should. A Produce to a
read-only partition this node holds goes to a writable shard of the logstore this node
holds, or else, as a PutLogs, to the node holding one.

Not thread-safe: used from the listener's event loop; blocking calls go to a thread pool.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import itertools
import logging
import uuid
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from loghub._clock import Clock
from loghub.errors import (
    AlreadyExistsError,
    LogHubError,
    NotFoundError,
    ParameterInvalid,
    PostBodyInvalid,
    PostBodyTooLarge,
    ProjectNotExist,
    QuotaError,
    RequestError,
    ShardReadOnly,
    UnavailableError,
)
from loghub.kafka.coordinator import Coordinator, GroupState, subscribed_topics
from loghub.kafka.mapping import (
    group_to_records,
    offset_of,
    position_of,
    records_to_group,
    split_topic,
    topic_name,
)
from loghub.server.config import KeyGrant
from loghub.server.service import LogHubService
from loghub.wire.cursor import decode_cursor, encode_cursor
from loghub.wire.kafka.codec import (
    KafkaDecodeError,
    Message,
    RequestHeader,
    decode_request,
    encode_response,
    read_request_header,
)
from loghub.wire.kafka.records import (
    CorruptBatch,
    RecordBatch,
    UnsupportedCompression,
    UnsupportedMagic,
    build_batch,
    parse_batches,
)

if TYPE_CHECKING:  # the cluster's modules (and the etcd client) load only in cluster mode
    from loghub.kafka.cluster import KafkaCluster

__all__ = ["SUPPORTED", "Broker", "BrokerConfig", "Session"]

log = logging.getLogger("loghub.kafka")
T = TypeVar("T")

# api key -> (lowest implemented, lowest advertised, highest); see docs/kafka.md
SUPPORTED: dict[int, tuple[int, int, int]] = {
    0: (3, 0, 10),  # Produce: advertise 0 so that old librdkafka keeps compressing
    1: (4, 4, 12),  # Fetch: 13+ name topics by id
    2: (1, 1, 7),  # ListOffsets
    3: (0, 0, 12),  # Metadata
    8: (2, 2, 9),  # OffsetCommit
    9: (1, 1, 9),  # OffsetFetch
    10: (0, 0, 4),  # FindCoordinator
    11: (0, 0, 7),  # JoinGroup
    12: (0, 0, 4),  # Heartbeat
    13: (0, 0, 5),  # LeaveGroup
    14: (0, 0, 5),  # SyncGroup
    15: (0, 0, 5),  # DescribeGroups
    16: (0, 0, 4),  # ListGroups
    17: (1, 1, 1),  # SaslHandshake: v1 only (v0 sends raw SASL tokens)
    18: (0, 0, 4),  # ApiVersions
    19: (2, 2, 7),  # CreateTopics
    22: (0, 0, 4),  # InitProducerId
    36: (0, 0, 2),  # SaslAuthenticate
}
_BEFORE_AUTHENTICATION = frozenset({17, 18, 36})  # what a connection may send before SASL

# Kafka error codes used here
NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
INVALID_TOPIC_EXCEPTION = 17
INVALID_GROUP_ID = 24
UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REQUEST = 42
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
KAFKA_STORAGE_ERROR = 56
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87
THROTTLING_QUOTA_EXCEEDED = 89
TOPIC_AUTHORIZATION_FAILED = 29
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58
UNKNOWN_SERVER_ERROR = -1

_NODE_ID = 1
_CLUSTER_ID = "loghub"
_PRODUCER_BATCHES_KEPT = 5
# (producer, partition) pairs whose last batches are kept; the oldest is forgotten first
producer_partitions_max = 100_000
_AUTHORIZED_OPERATIONS_UNKNOWN = -(2**31)
_COMMIT_CONSUMER_PREFIX = "kafka:"


@dataclass(frozen=True)
class BrokerConfig:
    advertised_host: str
    advertised_port: int
    topic_separator: str = "."
    initial_rebalance_delay_ms: int = 500
    fetch_poll_ms: int = 50
    fetch_groups_max: int = 1000
    # raw bytes of log groups in one Fetch answer, whatever its MaxBytes asks (Kafka's
    # fetch.max.bytes): a client asking for 2 GiB must not make the server build 2 GiB
    fetch_bytes_max: int = 16 * 1024 * 1024
    batch_bytes_max: int = 32 * 1024 * 1024  # a batch's records after decompression
    threads: int = 16
    new_topic_partitions: int = 2
    # access key id -> secret; with keys, a connection must authenticate (SASL/PLAIN) first
    keys: Mapping[str, str] = field(default_factory=dict)
    key_grants: Mapping[str, KeyGrant] = field(default_factory=dict)


@dataclass
class Session:
    """What the broker keeps per connection."""

    client_host: str
    produce_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    key_id: str | None = None  # set by a successful SASL/PLAIN exchange
    mechanism: str | None = None  # set by SaslHandshake


@dataclass
class _ProducerPartition:
    epoch: int
    batches: collections.deque[tuple[int, int, int]]  # (first seq, last seq, base offset)


class Broker:
    def __init__(
        self,
        service: LogHubService,
        config: BrokerConfig,
        clock: Clock,
        cluster: KafkaCluster | None = None,
    ) -> None:
        self.service = service
        self.config = config
        self.clock = clock
        self.cluster = cluster
        self._redirect_turn = itertools.count()
        self.coordinator = Coordinator(clock, config.initial_rebalance_delay_ms)
        self._executor = ThreadPoolExecutor(config.threads, thread_name_prefix="loghub-kafka")
        self._producers: dict[tuple[int, str, int], _ProducerPartition] = {}
        self._producer_ids = itertools.count(1)
        # group -> (generation, partitions per subscribed topic when it was first seen)
        self._seen_partitions: dict[str, tuple[int, dict[str, int]]] = {}
        self._producer_id_base = (clock.wall_ms() << 16) & (2**62 - 1)
        self._handlers: dict[
            int, Callable[[Message, RequestHeader, Session], Coroutine[Any, Any, Message | None]]
        ] = {
            0: self._produce,
            1: self._fetch,
            2: self._list_offsets,
            3: self._metadata,
            8: self._offset_commit,
            9: self._offset_fetch,
            10: self._find_coordinator,
            11: self._join_group,
            12: self._heartbeat,
            13: self._leave_group,
            14: self._sync_group,
            15: self._describe_groups,
            16: self._list_groups,
            17: self._sasl_handshake,
            18: self._api_versions,
            36: self._sasl_authenticate,
            19: self._create_topics,
            22: self._init_producer_id,
        }

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def run_timers(self) -> None:
        ticks = itertools.count()
        while True:
            await asyncio.sleep(0.2)
            self.coordinator.tick()
            if next(ticks) % 5 == 0:
                try:
                    await self._nudge_groups()
                except LogHubError as exc:
                    log.warning("checking Kafka groups for new partitions: %r", exc)

    async def _nudge_groups(self) -> None:
        """Rebalances every settled group whose subscribed topics gained partitions (a split
        or merge) since its generation began: clients would otherwise see them only at their
        next metadata refresh (5 minutes by default)."""
        for group_id in self._seen_partitions.keys() - self.coordinator.groups.keys():
            del self._seen_partitions[group_id]  # a group the coordinator forgot
        for group in list(self.coordinator.groups.values()):
            if group.state is not GroupState.STABLE:
                continue
            topics = sorted(subscribed_topics(group))
            counts = await self._blocking(self._partition_counts, topics)
            seen = self._seen_partitions.get(group.group_id)
            if seen is None or seen[0] != group.generation:
                self._seen_partitions[group.group_id] = (group.generation, counts)
            elif seen[1] != counts:
                log.info("Kafka group %s: partitions changed, rebalancing", group.group_id)
                self.coordinator.force_rebalance(group.group_id)

    def _partition_counts(self, topics: list[str]) -> dict[str, int]:
        counts = {}
        for topic in topics:
            located = split_topic(topic, self.config.topic_separator)
            if located is None:
                continue
            try:
                counts[topic] = len(self.service.list_shards(*located))
            except NotFoundError:
                counts[topic] = 0
        return counts

    def _allowed(self, session: Session, project: str, *, write: bool) -> bool:
        """Whether the connection's access key may touch the project (always, without keys)."""
        if not self.config.keys:
            return True
        grant = self.config.key_grants.get(session.key_id or "")
        return grant is None or grant.allows(project, write)

    def _locate(self, topic: str, session: Session) -> tuple[str, str] | None:
        """(project, logstore) of a topic the connection may read; None for a topic that
        is not one, or that it may not see (answered as unknown, which tells nothing)."""
        located = split_topic(topic, self.config.topic_separator)
        if located is None or not self._allowed(session, located[0], write=False):
            return None
        return located

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    # -- dispatch -------------------------------------------------------------------------

    def handle(self, frame: bytes, session: Session) -> Coroutine[Any, Any, bytes | None]:
        """Decodes the request now (raising ``KafkaDecodeError`` for one this broker does not
        support, which closes the connection) and returns the coroutine that answers it."""
        header, body_start = read_request_header(frame)
        supported = SUPPORTED.get(header.api_key)
        if header.api_key == 18 and (supported is None or header.api_version > supported[2]):
            return self._answer(header, _unsupported_api_versions())
        if supported is None or not supported[0] <= header.api_version <= supported[2]:
            raise KafkaDecodeError(
                f"unsupported request: api {header.api_key} version {header.api_version}"
            )
        if (
            self.config.keys
            and session.key_id is None
            and header.api_key not in _BEFORE_AUTHENTICATION
        ):
            raise KafkaDecodeError(f"api {header.api_key} before SASL authentication")
        request = decode_request(header.api_key, header.api_version, memoryview(frame)[body_start:])
        return self._run(header, request, session)

    async def _run(self, header: RequestHeader, request: Message, session: Session) -> bytes | None:
        message = await self._handlers[header.api_key](request, header, session)
        if message is None:
            return None
        return encode_response(header.api_key, header.api_version, header.correlation_id, message)

    async def _answer(self, header: RequestHeader, message: Message) -> bytes:
        return encode_response(18, 0, header.correlation_id, message)

    # -- ApiVersions, Metadata, FindCoordinator, CreateTopics -----------------------------

    async def _api_versions(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        return {
            "ErrorCode": NONE,
            "ApiKeys": [
                {"ApiKey": key, "MinVersion": low, "MaxVersion": high}
                for key, (_impl, low, high) in sorted(SUPPORTED.items())
            ],
        }

    async def _sasl_handshake(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        if request["Mechanism"] != "PLAIN":
            return {"ErrorCode": UNSUPPORTED_SASL_MECHANISM, "Mechanisms": ["PLAIN"]}
        session.mechanism = "PLAIN"
        return {"ErrorCode": NONE, "Mechanisms": ["PLAIN"]}

    async def _sasl_authenticate(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        """SASL/PLAIN (RFC 4616): ``authzid NUL user NUL password``, the user an access key
        id and the password its secret."""
        if session.mechanism != "PLAIN":
            return {"ErrorCode": ILLEGAL_SASL_STATE, "ErrorMessage": "SaslHandshake first"}
        parts = bytes(request["AuthBytes"]).split(b"\x00")
        secret = (
            self.config.keys.get(parts[1].decode(errors="replace")) if len(parts) == 3 else None
        )
        if secret is None or not hmac.compare_digest(secret.encode(), parts[2]):
            return {
                "ErrorCode": SASL_AUTHENTICATION_FAILED,
                "ErrorMessage": "unknown access key id or wrong secret",
                "AuthBytes": b"",
            }
        session.key_id = parts[1].decode()
        return {"ErrorCode": NONE, "ErrorMessage": None, "AuthBytes": b""}

    def _broker_entries(self) -> list[Message]:
        if self.cluster is None:
            return [
                {
                    "NodeId": _NODE_ID,
                    "Host": self.config.advertised_host,
                    "Port": self.config.advertised_port,
                    "Rack": None,
                }
            ]
        return [
            {"NodeId": b.broker_id, "Host": b.host, "Port": b.port, "Rack": b.rack}
            for b in self.cluster.brokers()
        ]

    async def _metadata(self, request: Message, header: RequestHeader, session: Session) -> Message:
        wanted = request.get("Topics")
        if wanted is None or (header.api_version == 0 and not wanted):
            names = None
        else:
            names = [t["Name"] for t in wanted if t.get("Name") is not None]
        topics = await self._blocking(self._describe_topics, names, session)
        return {
            "Brokers": self._broker_entries(),
            "ClusterId": _CLUSTER_ID,
            "ControllerId": _NODE_ID if self.cluster is None else self.cluster.controller_id(),
            "Topics": topics,
        }

    def _describe_topics(self, names: list[str] | None, session: Session) -> list[Message]:
        separator = self.config.topic_separator
        if names is None:
            names = [
                topic_name(p, s.name, separator)
                for p, s in self.service.logstores()
                if self._allowed(session, p, write=False)
            ]
        topics = []
        for name in names:
            located = split_topic(name, separator)
            if located is not None and not self._allowed(session, located[0], write=False):
                topics.append({"Name": name, "ErrorCode": TOPIC_AUTHORIZATION_FAILED})
                continue
            entry: Message = {
                "Name": name,
                "IsInternal": False,
                "Partitions": [],
                "TopicAuthorizedOperations": _AUTHORIZED_OPERATIONS_UNKNOWN,
            }
            if located is None:
                entry["ErrorCode"] = UNKNOWN_TOPIC_OR_PARTITION
                topics.append(entry)
                continue
            try:
                store = self.service.get_logstore(*located)
                shards = self.service.list_shards(*located)
            except NotFoundError:
                entry["ErrorCode"] = UNKNOWN_TOPIC_OR_PARTITION
                topics.append(entry)
                continue
            entry["TopicId"] = uuid.uuid5(uuid.NAMESPACE_URL, f"loghub:{store.storage_key}").bytes
            entry["Partitions"] = [self._partition(located, shard.shard_id) for shard in shards]
            topics.append(entry)
        return topics

    def _partition(self, located: tuple[str, str], shard_id: int) -> Message:
        """A partition's Metadata: its leader is the node holding the shard's log; without a
        live one (the node is gone, or the shard is not placed yet) LEADER_NOT_AVAILABLE."""
        leader, holder = (
            (_NODE_ID, _NODE_ID)
            if self.cluster is None
            else self.cluster.leader(*located, shard_id)
        )
        replicas = [] if holder < 0 else [holder]
        return {
            "ErrorCode": NONE if leader is not None else LEADER_NOT_AVAILABLE,
            "PartitionIndex": shard_id,
            "LeaderId": -1 if leader is None else leader,
            "LeaderEpoch": 0,
            "ReplicaNodes": replicas,
            "IsrNodes": replicas if leader is not None else [],
            "OfflineReplicas": replicas if leader is None else [],
        }

    async def _find_coordinator(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        if header.api_version >= 4:
            return {
                "Coordinators": [
                    {"Key": key, **self._coordinator_entry(key)}
                    for key in request["CoordinatorKeys"]
                ]
            }
        return self._coordinator_entry(request["Key"])

    def _coordinator_entry(self, group_id: str) -> Message:
        """FindCoordinator's answer for one group: this node alone, or in a cluster the node
        coordinating the group (COORDINATOR_NOT_AVAILABLE while there is none)."""
        if self.cluster is None:
            host, port, node_id = self.config.advertised_host, self.config.advertised_port, _NODE_ID
        else:
            found = self.cluster.coordinator(group_id)
            if found is None:
                return {
                    "NodeId": -1, "Host": "", "Port": -1,
                    "ErrorCode": COORDINATOR_NOT_AVAILABLE,
                    "ErrorMessage": "no node coordinates groups right now",
                }  # fmt: skip
            host, port, node_id = found.host, found.port, found.broker_id
        return {"NodeId": node_id, "Host": host, "Port": port, "ErrorCode": NONE,
                "ErrorMessage": None}  # fmt: skip

    def _not_coordinator(self, group_id: str) -> bool:
        """Whether a request for ``group_id`` reached a node that does not coordinate it (in
        a cluster): the client must ask FindCoordinator again."""
        if self.cluster is None:
            return False
        found = self.cluster.coordinator(group_id)
        return found is None or found.broker_id != self.cluster.this.broker_id

    async def _create_topics(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        results = []
        for topic in request["Topics"]:
            error, text = await self._blocking(
                self._create_topic,
                session,
                topic["Name"],
                topic["NumPartitions"],
                request.get("validateOnly", False),
            )
            results.append(
                {
                    "Name": topic["Name"],
                    "ErrorCode": error,
                    "ErrorMessage": text,
                    "NumPartitions": topic["NumPartitions"],
                    "ReplicationFactor": 1,
                    "Configs": [],
                }
            )
        return {"Topics": results}

    def _create_topic(
        self, session: Session, name: str, partitions: int, validate_only: bool
    ) -> tuple[int, str | None]:
        located = split_topic(name, self.config.topic_separator)
        if located is not None and not self._allowed(session, located[0], write=True):
            return TOPIC_AUTHORIZATION_FAILED, "this access key may not create it"
        if located is None:
            return (
                INVALID_TOPIC_EXCEPTION,
                f"a topic is project{self.config.topic_separator}logstore",
            )
        count = self.config.new_topic_partitions if partitions < 0 else partitions
        if count < 1:
            return INVALID_PARTITIONS, "a topic needs at least one partition"
        if validate_only:
            return NONE, None
        try:
            self.service.create_logstore(
                located[0], {"logstoreName": located[1], "shardCount": count}
            )
        except AlreadyExistsError:
            return TOPIC_ALREADY_EXISTS, f"topic {name} already exists"
        except ProjectNotExist as exc:
            return INVALID_TOPIC_EXCEPTION, exc.message
        except RequestError as exc:
            return INVALID_REQUEST, exc.message
        return NONE, None

    # -- Produce --------------------------------------------------------------------------

    async def _produce(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message | None:
        if request.get("TransactionalId") is not None:
            error = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            return self._produce_answer(request, lambda _t, _p: (error, -1, -1))
        async with session.produce_lock:
            keys, jobs = [], []
            for topic in request["TopicData"]:
                for partition in topic["PartitionData"]:
                    keys.append((topic["Name"], partition["Index"]))
                    jobs.append(
                        self._blocking(
                            self._append,
                            session,
                            topic["Name"],
                            partition["Index"],
                            partition["Records"],
                            header.client_id or "",
                        )
                    )
            results = dict(zip(keys, await asyncio.gather(*jobs), strict=True))
        if request["Acks"] == 0:
            return None
        return self._produce_answer(request, lambda t, p: results[(t, p)])

    def _produce_answer(
        self, request: Message, result: Callable[[str, int], tuple[int, int, int]]
    ) -> Message:
        responses = []
        for topic in request["TopicData"]:
            partitions = []
            for partition in topic["PartitionData"]:
                error, base_offset, start_offset = result(topic["Name"], partition["Index"])
                partitions.append(
                    {
                        "Index": partition["Index"],
                        "ErrorCode": error,
                        "BaseOffset": base_offset,
                        "LogAppendTimeMs": -1,
                        "LogStartOffset": start_offset,
                        "RecordErrors": [],
                        "ErrorMessage": None,
                    }
                )
            responses.append({"Name": topic["Name"], "PartitionResponses": partitions})
        return {"Responses": responses}

    def _append(
        self, session: Session, topic: str, partition: int, records: bytes | None, client_id: str
    ) -> tuple[int, int, int]:
        """(error, base offset, log start offset) of one partition's batches. Blocking."""
        located = split_topic(topic, self.config.topic_separator)
        if located is None:
            return UNKNOWN_TOPIC_OR_PARTITION, -1, -1
        if not self._allowed(session, located[0], write=True):
            return TOPIC_AUTHORIZATION_FAILED, -1, -1
        if error := self._leader_error(located, partition):
            return error, -1, -1
        try:
            batches = parse_batches(records or b"", self.config.batch_bytes_max)
            first_offset: int | None = None
            for batch in batches:
                offset = self._append_batch(located, topic, partition, batch, client_id)
                first_offset = offset if first_offset is None else first_offset
            begin, _end = self.service.shard_range(*located, partition)
        except KafkaBatchRefused as refused:
            return refused.error, -1, -1
        except (CorruptBatch, UnsupportedMagic, UnsupportedCompression, LogHubError) as exc:
            return _produce_error(exc), -1, -1
        return NONE, -1 if first_offset is None else first_offset, offset_of(begin)

    def _append_batch(
        self,
        located: tuple[str, str],
        topic: str,
        partition: int,
        batch: RecordBatch,
        client_id: str,
    ) -> int:
        info = batch.info
        if info.is_transactional or info.is_control:
            raise KafkaBatchRefused(INVALID_RECORD)
        state_key = (info.producer_id, topic, partition)
        state = self._producers.get(state_key) if info.producer_id >= 0 else None
        last_seq = info.base_sequence + info.last_offset_delta
        if state is not None:
            if info.producer_epoch < state.epoch:
                raise KafkaBatchRefused(INVALID_PRODUCER_EPOCH)
            if info.producer_epoch == state.epoch:
                for first, last, base in state.batches:
                    if (first, last) == (info.base_sequence, last_seq):
                        return base  # a retry of a batch already stored
                if state.batches and info.base_sequence != state.batches[-1][1] + 1:
                    raise KafkaBatchRefused(OUT_OF_ORDER_SEQUENCE_NUMBER)
        if not batch.records:
            raise KafkaBatchRefused(INVALID_RECORD)
        raw = records_to_group(batch.records, client_id)
        sequence = self._store_group(located, partition, raw)
        base = -1 if sequence is None else offset_of(sequence)
        if info.producer_id >= 0 and info.base_sequence >= 0:
            if state is None or state.epoch != info.producer_epoch:
                state = _ProducerPartition(
                    info.producer_epoch, collections.deque(maxlen=_PRODUCER_BATCHES_KEPT)
                )
                self._producers[state_key] = state
                if len(self._producers) > producer_partitions_max:
                    del self._producers[next(iter(self._producers))]
            state.batches.append((info.base_sequence, last_seq, base))
        return base

    def _leader_error(self, located: tuple[str, str], partition: int) -> int:
        """In a cluster, NOT_LEADER_OR_FOLLOWER for a partition this node does not hold (or
        may not act on: its lease is not known to be alive), UNKNOWN_TOPIC_OR_PARTITION for
        one that does not exist; NONE otherwise, and always on a single node."""
        if self.cluster is None or self.cluster.serves(*located, partition):
            return NONE
        try:
            shards = self.service.list_shards(*located)
        except NotFoundError:
            return UNKNOWN_TOPIC_OR_PARTITION
        if all(s.shard_id != partition for s in shards):
            return UNKNOWN_TOPIC_OR_PARTITION
        return NOT_LEADER_OR_FOLLOWER

    def _store_group(self, located: tuple[str, str], partition: int, raw: bytes) -> int | None:
        """Appends a log group to the partition's shard; to another, writable, shard when it
        has turned read-only (its sequence is then unknown here: None)."""
        if self.cluster is None:
            return self.service.append_log_group(*located, partition, raw)
        try:
            return self.service.put_logs(*located, str(partition), None, raw, None, len(raw))
        except ShardReadOnly:
            pass
        writable = [
            s.shard_id for s in self.service.list_shards(*located) if s.status == "readwrite"
        ]
        if not writable:
            raise ShardReadOnly(f"no shard of {located[1]} takes writes")
        turn = next(self._redirect_turn)
        local = self.cluster.local_writable(*located, writable)
        chosen = local[turn % len(local)] if local else writable[turn % len(writable)]
        node = None if local else self.cluster.owner_node(*located, chosen)
        if node is None:
            self.service.put_logs(*located, str(chosen), None, raw, None, len(raw))
        else:
            self.cluster.append_remote(node, *located, chosen, raw)
        return None

    async def _init_producer_id(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        if request.get("TransactionalId") is not None:
            return {
                "ErrorCode": TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "ProducerId": -1,
                "ProducerEpoch": -1,
            }
        producer_id = request.get("ProducerId", -1)
        if producer_id is not None and producer_id >= 0:
            return {
                "ErrorCode": NONE,
                "ProducerId": producer_id,
                "ProducerEpoch": request["ProducerEpoch"] + 1,
            }
        return {
            "ErrorCode": NONE,
            "ProducerId": self._producer_id_base + next(self._producer_ids),
            "ProducerEpoch": 0,
        }

    # -- Fetch and ListOffsets ------------------------------------------------------------

    async def _fetch(self, request: Message, header: RequestHeader, session: Session) -> Message:
        waited_ms = 0
        wait_ms = max(0, request["MaxWaitMs"])
        while True:
            topics, size = await self._blocking(self._read_partitions, request, session)
            if size >= max(1, request["MinBytes"]) or waited_ms >= wait_ms:
                return {"ErrorCode": NONE, "SessionId": 0, "Responses": topics}
            step_ms = min(self.config.fetch_poll_ms, wait_ms - waited_ms)
            await asyncio.sleep(step_ms / 1000)
            waited_ms += step_ms

    def _read_partitions(self, request: Message, session: Session) -> tuple[list[Message], int]:
        budget = min(request.get("MaxBytes", 2**31 - 1), self.config.fetch_bytes_max)
        total = 0
        topics = []
        for topic in request["Topics"]:
            partitions = []
            for partition in topic["Partitions"]:
                entry = self._read_partition(
                    session, topic["Topic"], partition, max(0, budget - total), total == 0
                )
                total += len(entry["Records"])
                partitions.append(entry)
            topics.append({"Topic": topic["Topic"], "Partitions": partitions})
        return topics, total

    def _read_partition(
        self, session: Session, topic: str, partition: Message, bytes_max: int, first: bool
    ) -> Message:
        index = partition["Partition"]
        entry: Message = {
            "PartitionIndex": index,
            "ErrorCode": NONE,
            "HighWatermark": -1,
            "LastStableOffset": -1,
            "LogStartOffset": -1,
            "AbortedTransactions": None,
            "PreferredReadReplica": -1,
            "Records": b"",
        }
        located = split_topic(topic, self.config.topic_separator)
        if located is None:
            entry["ErrorCode"] = UNKNOWN_TOPIC_OR_PARTITION
            return entry
        if not self._allowed(session, located[0], write=False):
            entry["ErrorCode"] = TOPIC_AUTHORIZATION_FAILED
            return entry
        if error := self._leader_error(located, index):
            entry["ErrorCode"] = error
            return entry
        try:
            begin, end = self.service.shard_range(*located, index)
            entry["HighWatermark"] = entry["LastStableOffset"] = offset_of(end)
            entry["LogStartOffset"] = offset_of(begin)
            sequence, position = position_of(partition["FetchOffset"])
            if sequence < begin or sequence > end or (sequence == end and position):
                entry["ErrorCode"] = OFFSET_OUT_OF_RANGE
                return entry
            bytes_max = min(bytes_max, partition["PartitionMaxBytes"])
            if sequence == end or (bytes_max <= 0 and not first):
                return entry
            chunks = self._read_batches(located, index, sequence, position, end, bytes_max)
        except NotFoundError:
            entry["ErrorCode"] = UNKNOWN_TOPIC_OR_PARTITION
            return entry
        except (QuotaError, UnavailableError, RequestError) as exc:
            entry["ErrorCode"] = _read_error(exc)
            return entry
        entry["Records"] = b"".join(chunks)
        return entry

    def _read_batches(
        self,
        located: tuple[str, str],
        index: int,
        sequence: int,
        position: int,
        end: int,
        bytes_max: int,
    ) -> list[bytes]:
        """Record batches from the log group at ``sequence`` on, without the records below
        ``position`` in it. An offset at the end of a group (a consumer that read all of it)
        names no record of that group: the batches then start at the next one."""
        chunks: list[bytes] = []
        while not chunks and sequence < end:
            groups = self.service.read_log_groups(
                *located, index, sequence, self.config.fetch_groups_max, max(bytes_max, 1)
            )
            if not groups:
                break
            for seq, raw in enumerate(groups, start=sequence):
                records = group_to_records(raw)
                if seq == sequence and position:
                    records = [r for r in records if r.offset_delta >= position]
                if records:
                    chunks.append(build_batch(offset_of(seq), records))
            sequence, position = sequence + len(groups), 0
        return chunks

    async def _list_offsets(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        return {"Topics": await self._blocking(self._offsets, request["Topics"], session)}

    def _offsets(self, topics: list[Message], session: Session) -> list[Message]:
        answers = []
        for topic in topics:
            located = self._locate(topic["Name"], session)
            partitions = []
            for partition in topic["Partitions"]:
                entry: Message = {
                    "PartitionIndex": partition["PartitionIndex"],
                    "ErrorCode": NONE,
                    "Timestamp": -1,
                    "Offset": -1,
                    "LeaderEpoch": 0,
                }
                try:
                    if located is None:
                        raise NotFoundError(topic["Name"])
                    if error := self._leader_error(located, partition["PartitionIndex"]):
                        entry["ErrorCode"] = error
                        partitions.append(entry)
                        continue
                    entry["Timestamp"], entry["Offset"] = self._offset_for(located, partition)
                except NotFoundError:
                    entry["ErrorCode"] = UNKNOWN_TOPIC_OR_PARTITION
                partitions.append(entry)
            answers.append({"Name": topic["Name"], "Partitions": partitions})
        return answers

    def _offset_for(self, located: tuple[str, str], partition: Message) -> tuple[int, int]:
        index, timestamp = partition["PartitionIndex"], partition["Timestamp"]
        begin, end = self.service.shard_range(*located, index)
        if timestamp == -2:
            return -1, offset_of(begin)
        if timestamp in (-1, -3):
            return -1, offset_of(end)
        sequence = self.service.seq_for_time(*located, index, timestamp)
        if sequence >= end:
            return -1, -1
        return timestamp, offset_of(max(sequence, begin))

    # -- groups ---------------------------------------------------------------------------

    async def _join_group(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        if self._not_coordinator(request["GroupId"]):
            answer: Message = {
                "ErrorCode": NOT_COORDINATOR, "GenerationId": -1, "ProtocolName": None,
                "Leader": "", "MemberId": request["MemberId"], "Members": [],
            }  # fmt: skip
        else:
            answer = await self.coordinator.join(
                request["GroupId"],
                request["MemberId"],
                header.client_id or "",
                session.client_host,
                request.get("GroupInstanceId"),
                request["SessionTimeoutMs"],
                int(request.get("RebalanceTimeoutMs") or request["SessionTimeoutMs"]),
                request["ProtocolType"],
                [(p["Name"], p["Metadata"]) for p in request["Protocols"]],
                header.api_version >= 4,
            )
        if answer.get("ProtocolName") is None and header.api_version < 7:
            answer["ProtocolName"] = ""
        return answer

    async def _sync_group(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        if self._not_coordinator(request["GroupId"]):
            return {"ErrorCode": NOT_COORDINATOR, "ProtocolType": None, "ProtocolName": None,
                    "Assignment": b""}  # fmt: skip
        assignments = {a["MemberId"]: a["Assignment"] for a in request["Assignments"]}
        error, assignment, protocol_type, protocol = await self.coordinator.sync(
            request["GroupId"], request["GenerationId"], request["MemberId"], assignments
        )
        return {
            "ErrorCode": error,
            "ProtocolType": protocol_type,
            "ProtocolName": protocol,
            "Assignment": assignment,
        }

    async def _heartbeat(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        if self._not_coordinator(request["GroupId"]):
            return {"ErrorCode": NOT_COORDINATOR}
        error = self.coordinator.heartbeat(
            request["GroupId"], request["GenerationId"], request["MemberId"]
        )
        return {"ErrorCode": error}

    async def _leave_group(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        if self._not_coordinator(request["GroupId"]):
            return {"ErrorCode": NOT_COORDINATOR, "Members": []}
        if header.api_version < 3:
            errors = self.coordinator.leave(request["GroupId"], [request["MemberId"]])
            return {"ErrorCode": errors[0]}
        members = request["Members"]
        errors = self.coordinator.leave(request["GroupId"], [m["MemberId"] for m in members])
        return {
            "ErrorCode": NONE,
            "Members": [
                {
                    "MemberId": m["MemberId"],
                    "GroupInstanceId": m.get("GroupInstanceId"),
                    "ErrorCode": e,
                }
                for m, e in zip(members, errors, strict=True)
            ],
        }

    async def _describe_groups(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        described = []
        for group_id in request["Groups"]:
            if self._not_coordinator(group_id):
                described.append({"ErrorCode": NOT_COORDINATOR, "GroupId": group_id,
                                  "GroupState": "", "ProtocolType": "", "ProtocolData": "",
                                  "Members": []})  # fmt: skip
                continue
            group = self.coordinator.describe(group_id)
            if group is None:
                described.append(
                    {
                        "ErrorCode": NONE,
                        "GroupId": group_id,
                        "GroupState": "Dead",
                        "ProtocolType": "",
                        "ProtocolData": "",
                        "Members": [],
                    }
                )
                continue
            described.append(
                {
                    "ErrorCode": NONE,
                    "GroupId": group_id,
                    "GroupState": group.state.value,
                    "ProtocolType": group.protocol_type or "",
                    "ProtocolData": group.protocol or "",
                    "Members": [
                        {
                            "MemberId": m.member_id,
                            "GroupInstanceId": m.instance_id,
                            "ClientId": m.client_id,
                            "ClientHost": m.client_host,
                            "MemberMetadata": dict(m.protocols).get(group.protocol or "", b""),
                            "MemberAssignment": m.assignment,
                        }
                        for m in group.members.values()
                    ],
                    "AuthorizedOperations": _AUTHORIZED_OPERATIONS_UNKNOWN,
                }
            )
        return {"Groups": described}

    async def _list_groups(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        states = set(request.get("StatesFilter") or [])
        return {
            "ErrorCode": NONE,
            "Groups": [
                {
                    "GroupId": g.group_id,
                    "ProtocolType": g.protocol_type or "",
                    "GroupState": g.state.value,
                }
                for g in self.coordinator.groups.values()
                if not states or g.state.value in states
            ],
        }

    # -- committed offsets ----------------------------------------------------------------

    async def _offset_commit(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        group_id = request["GroupId"]
        error = (
            NOT_COORDINATOR
            if self._not_coordinator(group_id)
            else self.coordinator.check_commit(
                group_id, request.get("GenerationIdOrMemberEpoch", -1), request.get("MemberId", "")
            )
        )
        topics = []
        for topic in request["Topics"]:
            partitions = []
            for partition in topic["Partitions"]:
                partition_error = error
                if not error:
                    partition_error = await self._blocking(
                        self._commit,
                        session,
                        group_id,
                        topic["Name"],
                        partition["PartitionIndex"],
                        partition["CommittedOffset"],
                    )
                partitions.append(
                    {"PartitionIndex": partition["PartitionIndex"], "ErrorCode": partition_error}
                )
            topics.append({"Name": topic["Name"], "Partitions": partitions})
        return {"Topics": topics}

    def _commit(
        self, session: Session, group_id: str, topic: str, partition: int, offset: int
    ) -> int:
        located = self._locate(topic, session)
        if located is None:
            return UNKNOWN_TOPIC_OR_PARTITION
        sequence, index = position_of(max(offset, 0))
        try:
            if (
                index
                and self._holds(located, partition)
                and self._group_ends_before(located, partition, sequence, index)
            ):
                sequence += 1  # the group is read to its end: LogHub resumes after it
            self.service.save_checkpoint(
                *located,
                group_id,
                partition,
                encode_cursor(sequence),
                f"{_COMMIT_CONSUMER_PREFIX}{offset}",
            )
        except NotFoundError:
            return UNKNOWN_TOPIC_OR_PARTITION
        except ParameterInvalid:
            return INVALID_GROUP_ID
        except LogHubError:
            return KAFKA_STORAGE_ERROR
        return NONE

    def _children_from_start(
        self, located: tuple[str, str], found: Mapping[int, Any], group_id: str
    ) -> dict[int, Any]:
        """A shard born of a split or merge, without a commit of its own, reads as committed
        at its start when the group was there before it: it has committed on the logstore, or
        this coordinator saw it form no later than the shard's creation second. With the
        clients' default ``auto.offset.reset=latest`` the group would otherwise skip what was
        written to the child before a member got it; and a group whose first commit had not
        landed yet when the split came (a commit times out on a loaded machine) is such a
        group too. A group formed after the split starts by its reset policy, as on any
        partition that existed before it."""
        group = self.coordinator.describe(group_id)
        formed_s = None if group is None else group.formed_wall_ms // 1000
        if not found and formed_s is None:
            return {}
        starts: dict[int, Any] = {}
        for shard in self.service.list_shards(*located):
            if not shard.parents or shard.shard_id in found:
                continue
            if not found and (formed_s is None or shard.created_at_s < formed_s):
                continue
            begin = 0  # a shard held elsewhere: its start, where retention has not been
            if self._holds(located, shard.shard_id):
                begin, _end = self.service.shard_range(*located, shard.shard_id)
            starts[shard.shard_id] = _StartOfShard(begin)
        return starts

    def _holds(self, located: tuple[str, str], shard_id: int) -> bool:
        """Whether the shard's log is on this node (always on a single node)."""
        return self.cluster is None or self.cluster.serves(*located, shard_id)

    def _group_ends_before(
        self, located: tuple[str, str], partition: int, sequence: int, index: int
    ) -> bool:
        """Whether the log group at ``sequence`` has ``index`` logs or fewer."""
        try:
            groups = self.service.read_log_groups(*located, partition, sequence, 1, 1)
        except LogHubError:
            return False
        return bool(groups) and len(group_to_records(groups[0])) <= index

    async def _offset_fetch(
        self, request: Message, header: RequestHeader, session: Session
    ) -> Message:
        if header.api_version >= 8:
            groups = []
            for group in request["Groups"]:
                if self._not_coordinator(group["GroupId"]):
                    groups.append(
                        {"GroupId": group["GroupId"], "Topics": [], "ErrorCode": NOT_COORDINATOR}
                    )
                    continue
                topics = await self._blocking(
                    self._committed, session, group["GroupId"], group["Topics"]
                )
                groups.append({"GroupId": group["GroupId"], "Topics": topics, "ErrorCode": NONE})
            return {"Groups": groups}
        if self._not_coordinator(request["GroupId"]):
            return {
                "Topics": _offset_fetch_refused(request["Topics"]),
                "ErrorCode": NOT_COORDINATOR,
            }
        topics = await self._blocking(
            self._committed, session, request["GroupId"], request["Topics"]
        )
        return {"Topics": topics, "ErrorCode": NONE}

    def _committed(
        self, session: Session, group_id: str, topics: list[Message] | None
    ) -> list[Message]:
        separator = self.config.topic_separator
        if topics is None:
            topics = []
            for project, store in self.service.logstores():
                if not self._allowed(session, project, write=False):
                    continue
                found = self.service.checkpoints(project, store.name, group_id)
                if found:
                    topics.append(
                        {
                            "Name": topic_name(project, store.name, separator),
                            "PartitionIndexes": sorted(found),
                        }
                    )
        answers = []
        for topic in topics:
            located = self._locate(topic["Name"], session)
            try:
                if located is None:
                    found = {}
                else:
                    found = self.service.checkpoints(*located, group_id)
                    found = {**self._children_from_start(located, found, group_id), **found}
            except NotFoundError:
                found = {}
            answers.append(
                {
                    "Name": topic["Name"],
                    "Partitions": [
                        {
                            "PartitionIndex": index,
                            "CommittedOffset": _committed_offset(found.get(index)),
                            "CommittedLeaderEpoch": -1,
                            "Metadata": "",
                            "ErrorCode": NONE,
                        }
                        for index in topic["PartitionIndexes"]
                    ],
                }
            )
        return answers


class _StartOfShard:
    """A checkpoint at the start of a shard, for ``_committed_offset``."""

    def __init__(self, sequence: int) -> None:
        self.cursor = encode_cursor(sequence)
        self.consumer = ""


class KafkaBatchRefused(Exception):
    """A batch refused with a Kafka error code (idempotence, transactions)."""

    def __init__(self, error: int) -> None:
        super().__init__(error)
        self.error = error


def _committed_offset(checkpoint: Any) -> int:
    """The Kafka offset of a LogHub checkpoint: exact when the Kafka listener wrote it for the
    same group, the start of the checkpoint's group otherwise; -1 for none."""
    if checkpoint is None or not checkpoint.cursor:
        return -1
    try:
        sequence = decode_cursor(checkpoint.cursor)
    except LogHubError:
        return -1
    consumer: str = checkpoint.consumer
    if consumer.startswith(_COMMIT_CONSUMER_PREFIX):
        try:
            offset = int(consumer[len(_COMMIT_CONSUMER_PREFIX) :])
        except ValueError:
            offset = -1
        if offset >= 0 and position_of(offset)[0] == sequence:
            return offset  # written here, inside a log group: exact
    return offset_of(sequence)


def _offset_fetch_refused(topics: list[Message] | None) -> list[Message]:
    """OffsetFetch's topics answered NOT_COORDINATOR partition by partition: versions before
    2 have no top-level error code."""
    return [
        {
            "Name": topic["Name"],
            "Partitions": [
                {
                    "PartitionIndex": index,
                    "CommittedOffset": -1,
                    "CommittedLeaderEpoch": -1,
                    "Metadata": "",
                    "ErrorCode": NOT_COORDINATOR,
                }
                for index in topic["PartitionIndexes"]
            ],
        }
        for topic in topics or []
    ]


def _produce_error(exc: Exception) -> int:
    if isinstance(exc, UnsupportedMagic):
        return UNSUPPORTED_FOR_MESSAGE_FORMAT
    if isinstance(exc, UnsupportedCompression):
        return UNSUPPORTED_COMPRESSION_TYPE
    if isinstance(exc, CorruptBatch):
        return CORRUPT_MESSAGE
    if isinstance(exc, PostBodyTooLarge):
        return MESSAGE_TOO_LARGE
    if isinstance(exc, PostBodyInvalid):
        return INVALID_RECORD
    if isinstance(exc, NotFoundError):
        return UNKNOWN_TOPIC_OR_PARTITION
    if isinstance(exc, QuotaError):
        return THROTTLING_QUOTA_EXCEEDED
    if isinstance(exc, UnavailableError):
        return KAFKA_STORAGE_ERROR
    if isinstance(exc, RequestError):
        return INVALID_RECORD
    log.error("Kafka produce failed: %r", exc)
    return UNKNOWN_SERVER_ERROR


def _read_error(exc: LogHubError) -> int:
    if isinstance(exc, QuotaError):
        return THROTTLING_QUOTA_EXCEEDED
    if isinstance(exc, RequestError):
        return OFFSET_OUT_OF_RANGE
    return KAFKA_STORAGE_ERROR


def _unsupported_api_versions() -> Message:
    """The ApiVersions error answer, in the v0 layout every client can read."""
    return {
        "ErrorCode": UNSUPPORTED_VERSION,
        "ApiKeys": [
            {"ApiKey": key, "MinVersion": low, "MaxVersion": high}
            for key, (_impl, low, high) in sorted(SUPPORTED.items())
        ],
    }
