"""The one table from error class to HTTP status.

The SDK retries any status >= 500 (and the codes InternalServerError and RequestTimeout) ten
times, a second apart, so only faults of the server itself may map to 5xx: everything the
client got wrong is a 4xx and fails at once.
"""

from __future__ import annotations

from loghub import errors

__all__ = ["http_status"]

_STATUS: tuple[tuple[type[errors.LogHubError], int], ...] = (
    # most specific first: the first class the error is an instance of wins
    (errors.PostBodyTooLarge, 413),
    (errors.RequestError, 400),
    (errors.NotFoundError, 404),
    (errors.AlreadyExistsError, 400),
    (errors.SignatureReused, 503),
    (errors.AuthError, 401),
    (errors.CoordinationError, 500),  # a broken state machine is the server's fault
    (errors.QuotaError, 403),
    (errors.ServerBusy, 503),
    # Out of space: 507 Insufficient Storage says exactly that, and being >= 500 the SDK
    # retries it (10 times, a second apart), which is right: space may come back.
    (errors.StorageFull, 507),
    # Records lost to damage on disk: 410 Gone, because retrying cannot bring them back (so
    # not a 5xx the SDK would retry) and it is not the client's mistake either.
    (errors.DataCorrupted, 410),
    (errors.LogHubError, 500),
)


def http_status(error: errors.LogHubError) -> int:
    for cls, status in _STATUS:
        if isinstance(error, cls):
            return status
    raise AssertionError("LogHubError is the last row")  # pragma: no cover
