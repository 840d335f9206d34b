"""The one table from error class to what the protocol says: HTTP status, error code, and
whether the message may be shown to the client.

The SDK retries any status >= 500 (and the codes InternalServerError and RequestTimeout) ten
times, a second apart, so only faults of the server itself, or shortages that may pass, map to
5xx: everything the client got wrong is a 4xx and fails at once.

Lower layers raise their own classes (``storage/`` knows sealed logs and positions, not
``ShardReadOnly`` or cursors); this table is where they meet the protocol's codes. A class
whose message is not public is answered with a generic message; the server logs the real one
(it may name paths, positions or SQL).
"""

from __future__ import annotations

from dataclasses import dataclass

from loghub import errors

__all__ = ["ProtocolError", "protocol_error"]


@dataclass(frozen=True)
class ProtocolError:
    """What the client is told: ``{"errorCode": code, "errorMessage": message}`` with
    ``status``. ``internal`` when the real message went to the server's log instead."""

    status: int
    code: str
    message: str
    internal: bool


_INTERNAL = "InternalServerError"

# (class, status, code on the wire (None: the class's own), message shown to the client).
# Most specific first: the first class the error is an instance of wins.
_TABLE: tuple[tuple[type[errors.LogHubError], int, str | None, bool], ...] = (
    # storage/: its own classes, told in the protocol's words
    (errors.RecordTooLargeError, 413, "PostBodyTooLarge", True),
    (errors.LogSealedError, 400, "ShardReadOnly", True),
    (errors.SequenceOutOfRangeError, 400, "InvalidCursor", True),
    # Out of space: 507 Insufficient Storage says exactly that, and being >= 500 the SDK
    # retries it (10 times, a second apart), which is right: space may come back.
    (errors.DiskFullError, 507, "StorageFull", True),
    (errors.RecordsLostError, 410, "DataCorrupted", True),
    (errors.StorageError, 500, _INTERNAL, False),  # corrupt, closed, write failed
    (errors.DatabaseError, 500, _INTERNAL, False),
    # In a cluster: etcd out of reach, or a role another node has taken since. Either is
    # over when the client asks again (a majority is back, the request reaches the new
    # holder), so a 503 ServerBusy that every client retries.
    (errors.ControlPlaneError, 503, "ServerBusy", True),
    (errors.FencedError, 503, "ServerBusy", True),
    # A shard leader short of in-sync replicas: over when one catches up, so retried too.
    (errors.NotEnoughReplicasError, 503, "ServerBusy", True),
    (errors.CoordinationError, 500, _INTERNAL, False),  # a broken state machine
    # the protocol's own classes
    (errors.PostBodyTooLarge, 413, None, True),
    (errors.RequestError, 400, None, True),
    (errors.NotFoundError, 404, None, True),
    (errors.AlreadyExistsError, 400, None, True),
    (errors.SignatureReused, 503, None, True),
    (errors.AuthError, 401, None, True),
    (errors.QuotaError, 403, None, True),
    (errors.ServerBusy, 503, None, True),
    (errors.StorageFull, 507, None, True),
    # Records lost to damage on disk: 410 Gone, because retrying cannot bring them back (so
    # not a 5xx the SDK would retry) and it is not the client's mistake either.
    (errors.DataCorrupted, 410, None, True),
    (errors.ClientError, 500, _INTERNAL, False),  # never raised by a server; a bug if so
    (errors.LogHubError, 500, _INTERNAL, False),
)


def protocol_error(error: errors.LogHubError) -> ProtocolError:
    for cls, status, code, public in _TABLE:
        if isinstance(error, cls):
            if public:
                return ProtocolError(status, code or error.code, error.message, False)
            return ProtocolError(status, _INTERNAL, _internal_message(error), True)
    raise AssertionError("LogHubError is the last row")  # pragma: no cover


def _internal_message(error: errors.LogHubError) -> str:
    if isinstance(error, errors.StorageError):
        return "internal storage error"
    if isinstance(error, errors.DatabaseError):
        return "internal database error"
    return "internal server error"
