"""Every exception LogHub raises, in one tree.

Each class carries the LogHub error code (``code``) that the server sends in its JSON error
body, so an error means the same thing on both sides of the wire: the server turns it into
``{"errorCode": code, "errorMessage": message}`` (the HTTP status comes from the one table in
``loghub.server.errors``), and the client turns such a body back into the same class.

    LogHubError                         InternalServerError (never the client's fault)
    ├── StorageError
    │   ├── CorruptSegmentError         a record failed its CRC or framing check on read
    │   └── StorageClosedError          the shard log was closed
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
    │   ├── Unauthorized                no or malformed credentials
    │   ├── InvalidAccessKeyId
    │   ├── SignatureNotMatch
    │   ├── RequestTimeTooSkewed        the request date is too far from the server's clock
    │   └── SignatureReused             a v1 signature seen before for another project (503:
    │                                   a replay, or a coincidence that a re-signed retry ends)
    ├── CoordinationError
    │   ├── LeaseLostError
    │   └── IllegalTransition           a state machine was asked for a move it does not allow
    ├── QuotaError                      over a per-shard rate quota (403); wait and try again
    │   ├── ShardWriteQuotaExceed       write bytes or write requests per second
    │   └── ShardReadQuotaExceed        read bytes per second
    └── ClientError                     raised only by loghub.client
        ├── TransportError              the server could not be reached
        └── ServerError                 an error reply whose code this package does not know

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
    "CoordinationError",
    "CorruptSegmentError",
    "IllegalTransition",
    "IndexConfigNotExist",
    "InvalidAccessKeyId",
    "InvalidCompressType",
    "InvalidCursor",
    "InvalidShardCheckPoint",
    "LeaseLostError",
    "LogHubError",
    "LogStoreAlreadyExist",
    "LogStoreInfoInvalid",
    "LogStoreNotExist",
    "NotFoundError",
    "ParameterInvalid",
    "PostBodyInvalid",
    "PostBodyTooLarge",
    "ProjectAlreadyExist",
    "ProjectNotExist",
    "QuotaError",
    "RequestError",
    "RequestTimeTooSkewed",
    "ServerError",
    "ShardNotExist",
    "ShardReadOnly",
    "ShardReadQuotaExceed",
    "ShardWriteQuotaExceed",
    "SignatureNotMatch",
    "SignatureReused",
    "StorageClosedError",
    "StorageError",
    "TransportError",
    "Unauthorized",
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
