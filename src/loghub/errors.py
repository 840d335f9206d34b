"""Every exception LogHub raises, in one tree.

A protocol class carries the LogHub error code (``code``) that the server sends in its JSON
error body, so an error means the same thing on both sides of the wire: the server turns it
into ``{"errorCode": code, "errorMessage": message}``, and the client turns such a body back
into the same class.

    LogHubError                         InternalServerError: the server's own fault
    ├── StorageError                    the shard logs on local disk (storage/ raises these)
    │   ├── CorruptSegmentError         a record failed its CRC or framing check on read
    │   ├── StorageClosedError          the shard log was closed
    │   ├── RecordTooLargeError         a record over the log's payload bound
    │   ├── LogSealedError              an append to a sealed (read-only) log
    │   ├── SequenceOutOfRangeError     a position outside [begin, end] of the log
    │   ├── DiskFullError               no space left on the disk for a write
    │   ├── RecordsLostError            a read reached records lost to damage on disk
    │   └── UnsupportedFormatError      a file in an on-disk format newer than this code
    ├── DatabaseError                   the metadata or lease database failed or is unreachable
    ├── CoordinationError               coordination's own state (a 500 if one reaches a server)
    │   ├── LeaseLostError              this worker no longer holds a lease it used
    │   ├── IllegalTransition           a state machine was asked for a move it does not allow
    │   ├── ControlPlaneError           the cluster's control plane (etcd) failed or is unreachable
    │   ├── FencedError                 a write by a node that lost the role it was made in
    │   └── NotEnoughReplicasError      a shard leader with fewer in-sync replicas than it needs
    ├── KafkaWireError                  Kafka protocol input (wire/kafka raises these; the Kafka
    │   │                               listener answers with a Kafka error code or closes)
    │   ├── KafkaDecodeError            not a valid request of the API and version it claims
    │   ├── CorruptBatch                a record batch whose CRC, lengths or records are bad
    │   ├── UnsupportedMagic            a legacy (magic 0 or 1) message set
    │   └── UnsupportedCompression      a batch compressed with a codec LogHub cannot read
    │
    │   The protocol's codes (server/ and client/ speak these):
    ├── RequestError                    the client's mistake (4xx); never retried by the SDK
    │   ├── ParameterInvalid
    │   ├── PostBodyInvalid             undecodable body, bad protobuf, wrong raw size
    │   ├── PostBodyTooLarge            over a size or count limit
    │   ├── InvalidCompressType
    │   ├── InvalidCursor
    │   ├── InvalidShardCheckPoint
    │   ├── LogStoreInfoInvalid
    │   ├── ShardReadOnly               a write addressed to a read-only shard
    │   ├── IndexConfigNotExist         a query (GetLogs, histograms): LogHub keeps no index
    │   └── ConsumerNotMatch            a fenced checkpoint from a consumer not holding it
    ├── NotFoundError
    │   ├── ProjectNotExist
    │   ├── LogStoreNotExist
    │   ├── ShardNotExist
    │   └── ConsumerGroupNotExist
    ├── AlreadyExistsError
    │   ├── ProjectAlreadyExist
    │   ├── LogStoreAlreadyExist
    │   └── ConsumerGroupAlreadyExist
    ├── AuthError
    │   ├── Unauthorized                no or malformed credentials, or outside the key's grant
    │   ├── InvalidAccessKeyId
    │   ├── SignatureNotMatch
    │   ├── RequestTimeTooSkewed        the request date is too far from the server's clock
    │   └── SignatureReused             a v1 signature seen before for another project (503:
    │                                   a replay, or a coincidence that a re-signed retry ends)
    ├── QuotaError                      over a per-shard rate quota (403); wait and try again
    │   ├── ShardWriteQuotaExceed       write bytes or write requests per second
    │   └── ShardReadQuotaExceed        read bytes per second
    ├── UnavailableError                a sound request the server cannot serve as things are
    │   ├── ServerBusy                  at a capacity bound (503 with Retry-After)
    │   ├── StorageFull                 the disk is full (507): writes resume when space returns
    │   └── DataCorrupted               the records asked for were lost to damage on disk (410)
    └── ClientError                     raised only by loghub.client
        ├── TransportError              the server could not be reached
        └── ServerError                 an error reply whose code this package does not know

Each layer raises its own: storage/ and metadata/ never raise a protocol code, the service
translates where it adds meaning (``raise DataCorrupted(...) from RecordsLostError``), and the
one table in ``loghub.server.errors`` gives every class its HTTP status, its code on the wire,
and whether its message may be shown to the client (internal ones are logged instead).

Assertions, not these classes, guard programmer errors.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AlreadyExistsError",
    "AuthError",
    "ClientError",
    "ConsumerGroupAlreadyExist",
    "ConsumerGroupNotExist",
    "ConsumerNotMatch",
    "ControlPlaneError",
    "CoordinationError",
    "CorruptBatch",
    "CorruptSegmentError",
    "DataCorrupted",
    "DatabaseError",
    "DiskFullError",
    "FencedError",
    "IllegalTransition",
    "IndexConfigNotExist",
    "InvalidAccessKeyId",
    "InvalidCompressType",
    "InvalidCursor",
    "InvalidShardCheckPoint",
    "KafkaDecodeError",
    "KafkaWireError",
    "LeaseLostError",
    "LogHubError",
    "LogSealedError",
    "LogStoreAlreadyExist",
    "LogStoreInfoInvalid",
    "LogStoreNotExist",
    "NotEnoughReplicasError",
    "NotFoundError",
    "ParameterInvalid",
    "PostBodyInvalid",
    "PostBodyTooLarge",
    "ProjectAlreadyExist",
    "ProjectNotExist",
    "QuotaError",
    "RecordTooLargeError",
    "RecordsLostError",
    "RequestError",
    "RequestTimeTooSkewed",
    "SequenceOutOfRangeError",
    "ServerBusy",
    "ServerError",
    "ShardNotExist",
    "ShardReadOnly",
    "ShardReadQuotaExceed",
    "ShardWriteQuotaExceed",
    "SignatureNotMatch",
    "SignatureReused",
    "StorageClosedError",
    "StorageError",
    "StorageFull",
    "TransportError",
    "Unauthorized",
    "UnavailableError",
    "UnsupportedCompression",
    "UnsupportedFormatError",
    "UnsupportedMagic",
    "error_class_for_code",
]


class LogHubError(Exception):
    """The root: every error LogHub raises on purpose.

    ``request_id`` and ``status`` are filled in when the error came over the wire.
    """

    code: ClassVar[str] = "InternalServerError"

    def __init__(
        self, message: str, *, request_id: str | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.status = status

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class StorageError(LogHubError):
    pass


class CorruptSegmentError(StorageError):
    pass


class StorageClosedError(StorageError):
    pass


class RecordTooLargeError(StorageError):
    """A record over the log's payload bound (the server answers PostBodyTooLarge)."""


class LogSealedError(StorageError):
    """An append to a sealed log: the shard turned read-only (ShardReadOnly on the wire)."""


class SequenceOutOfRangeError(StorageError):
    """A position outside [begin, end] of the log (InvalidCursor on the wire)."""


class DiskFullError(StorageError):
    """No space left for a write; nothing of it was kept (StorageFull on the wire)."""


class UnsupportedFormatError(StorageError):
    """A data file whose format version this code does not know (a newer LogHub wrote it):
    refused rather than read as damage, so that nothing in it is cut or skipped."""


class RecordsLostError(StorageError):
    """A read starts in records lost to damage on disk: sequences [first_seq, end_seq) of the
    log; reading can resume at ``end_seq`` (the service tells it as DataCorrupted)."""

    def __init__(self, message: str, *, first_seq: int, end_seq: int) -> None:
        super().__init__(message)
        self.first_seq = first_seq
        self.end_seq = end_seq


class DatabaseError(LogHubError):
    """The SQL database behind metadata or leases failed; its text stays in the server log."""


class UnavailableError(LogHubError):
    """A sound request that the server cannot serve as things stand (capacity, disk)."""


class ServerBusy(UnavailableError):
    """The server holds as many request bodies as it may; the same request later succeeds.

    A 5xx on purpose: the SDK retries it, which is what a client should do."""

    code = "ServerBusy"


class StorageFull(UnavailableError):
    """No space left for a write; nothing of it was kept, reads go on, writes resume by
    themselves when space returns."""

    code = "StorageFull"


class DataCorrupted(UnavailableError):
    """The records a read starts at were lost to damage on disk (they failed their checks).
    ``first_seq``/``end_seq`` are the lost sequences [first, end) of the shard; reading can
    resume at ``end_seq``."""

    code = "DataCorrupted"

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None = None,
        status: int | None = None,
        first_seq: int | None = None,
        end_seq: int | None = None,
    ) -> None:
        super().__init__(message, request_id=request_id, status=status)
        self.first_seq = first_seq
        self.end_seq = end_seq


class RequestError(LogHubError):
    code = "ParameterInvalid"


class ParameterInvalid(RequestError):
    code = "ParameterInvalid"


class PostBodyInvalid(RequestError):
    code = "PostBodyInvalid"


class PostBodyTooLarge(RequestError):
    code = "PostBodyTooLarge"


class InvalidCompressType(RequestError):
    code = "InvalidCompressType"


class InvalidCursor(RequestError):
    code = "InvalidCursor"


class InvalidShardCheckPoint(RequestError):
    code = "InvalidShardCheckPoint"


class LogStoreInfoInvalid(RequestError):
    code = "LogStoreInfoInvalid"


class ShardReadOnly(RequestError):
    code = "ShardReadOnly"


class IndexConfigNotExist(RequestError):
    """The hosted service's answer to a query on a logstore without an index. LogHub has no
    index or query engine, so every logstore is such a logstore: a query is refused with
    this code rather than answered by another API."""

    code = "IndexConfigNotExist"


class ConsumerNotMatch(RequestError):
    code = "ConsumerNotMatch"


class NotFoundError(LogHubError):
    code = "NotExist"


class ProjectNotExist(NotFoundError):
    code = "ProjectNotExist"


class LogStoreNotExist(NotFoundError):
    code = "LogStoreNotExist"


class ShardNotExist(NotFoundError):
    code = "ShardNotExist"


class ConsumerGroupNotExist(NotFoundError):
    code = "ConsumerGroupNotExist"


class AlreadyExistsError(LogHubError):
    code = "AlreadyExist"


class ProjectAlreadyExist(AlreadyExistsError):
    code = "ProjectAlreadyExist"


class LogStoreAlreadyExist(AlreadyExistsError):
    code = "LogStoreAlreadyExist"


class ConsumerGroupAlreadyExist(AlreadyExistsError):
    code = "ConsumerGroupAlreadyExist"


class AuthError(LogHubError):
    code = "Unauthorized"


class Unauthorized(AuthError):
    code = "Unauthorized"


class InvalidAccessKeyId(AuthError):
    code = "InvalidAccessKeyId"


class SignatureNotMatch(AuthError):
    code = "SignatureNotMatch"


class RequestTimeTooSkewed(AuthError):
    code = "RequestTimeTooSkewed"


class SignatureReused(AuthError):
    """The server cannot tell a replay from two identical v1 requests to two projects in
    one second, so it answers with a status the SDK retries, and the retry is signed anew."""

    code = "SignatureReused"


class CoordinationError(LogHubError):
    pass


class LeaseLostError(CoordinationError):
    pass


class IllegalTransition(CoordinationError):
    pass


class ControlPlaneError(CoordinationError):
    pass


class FencedError(CoordinationError):
    pass


class NotEnoughReplicasError(CoordinationError):
    """A write refused by a shard leader whose in-sync replicas are fewer than
    ``min_insync_replicas`` (Kafka's NOT_ENOUGH_REPLICAS): an acknowledgement then would
    rest on too few copies. Over once a replica catches up and rejoins, so retryable."""


class KafkaWireError(LogHubError):
    pass


class KafkaDecodeError(KafkaWireError):
    """Bytes that are not a valid message of the API and version they claim."""


class CorruptBatch(KafkaWireError):
    """A record batch whose CRC, lengths or records do not hold together."""


class UnsupportedMagic(KafkaWireError):
    """A legacy (magic 0 or 1) message set."""


class UnsupportedCompression(KafkaWireError):
    """A record batch compressed with a codec this server cannot read (snappy)."""


class QuotaError(LogHubError):
    """Not the caller's mistake and not the server's fault: the shard is busy. The hosted
    service answers these with 403, which the official consumer meets by sleeping 5 s."""

    code = "QuotaExceed"


class ShardWriteQuotaExceed(QuotaError):
    code = "ShardWriteQuotaExceed"


class ShardReadQuotaExceed(QuotaError):
    code = "ShardReadQuotaExceed"


class ClientError(LogHubError):
    pass


class TransportError(ClientError):
    code = "RequestError"


class ServerError(ClientError):
    """An error reply whose code has no class here; ``code`` is the code the server sent."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        request_id: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message, request_id=request_id, status=status)
        self.code = code  # type: ignore[misc]  # per instance: whatever the server said


def _wire_classes() -> dict[str, type[LogHubError]]:
    """Classes by the code they declare; where a class and its subclass declare the same code,
    the subclass (the more precise one) wins."""
    table: dict[str, type[LogHubError]] = {}
    pending: list[type[LogHubError]] = [LogHubError]
    while pending:  # breadth first, so deeper classes overwrite their parents
        cls = pending.pop(0)
        pending.extend(cls.__subclasses__())
        if "code" in cls.__dict__ and not issubclass(cls, ClientError):
            table[cls.code] = cls
    return table


_BY_CODE = _wire_classes()


def error_class_for_code(code: str) -> type[LogHubError] | None:
    """The class for an error code received over the wire, or None when unknown."""
    return _BY_CODE.get(code)
