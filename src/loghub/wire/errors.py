"""Error bodies: ``{"errorCode": ..., "errorMessage": ...[, "requestId": ...]}``.

The server sends one with every non-200 reply; the SDK needs both keys, or it reports its
own ``LogRequestError``/``BadResponse`` instead of the real cause. The client turns such a
body back into the ``loghub.errors`` class that owns the code, so an error is the same class
on both sides of the wire. The HTTP status for each class is chosen in ``loghub.server``,
not here. Pure functions; thread-safe.
"""

from __future__ import annotations

import json

from loghub.errors import LogHubError, ServerError, error_class_for_code

__all__ = ["error_body", "error_from_body"]


def error_body(code: str, message: str, request_id: str | None = None) -> bytes:
    """The JSON body of an error reply."""
    body: dict[str, str] = {"errorCode": code, "errorMessage": message}
    if request_id is not None:
        body["requestId"] = request_id
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def error_from_body(status: int, body: bytes, request_id: str | None) -> LogHubError:
    """The error an error reply stands for, with ``status`` and ``request_id`` set.

    ``request_id`` is the ``x-log-requestid`` header; when it is None the body's
    ``requestId`` is used. A body that is not such a JSON object gives
    ``ServerError("BadResponse", ...)``, as the SDK reports it; an unknown code gives a
    ``ServerError`` carrying that code.
    """
    try:
        parsed: object = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        parsed = None
    if not isinstance(parsed, dict):
        return ServerError(
            "BadResponse",
            f"status {status} with a body that is not a JSON object: {body[:200]!r}",
            request_id=request_id,
            status=status,
        )
    code = parsed.get("errorCode")
    message = parsed.get("errorMessage")
    if request_id is None and isinstance(parsed.get("requestId"), str):
        request_id = parsed["requestId"]
    if not isinstance(code, str) or not isinstance(message, str):
        return ServerError(
            "BadResponse",
            f"status {status} with an error body lacking errorCode/errorMessage: {body[:200]!r}",
            request_id=request_id,
            status=status,
        )
    cls = error_class_for_code(code)
    if cls is None:
        return ServerError(code, message, request_id=request_id, status=status)
    return cls(message, request_id=request_id, status=status)
