"""Error bodies: what the server writes is what the SDK needs, and the client reads it back
into the same class."""

from __future__ import annotations

import json

import pytest

from loghub.errors import (
    InvalidCursor,
    LogHubError,
    LogStoreNotExist,
    ServerError,
    SignatureNotMatch,
)
from loghub.wire.errors import error_body, error_from_body


def test_error_body_has_the_two_keys_the_sdk_needs() -> None:
    assert json.loads(error_body("LogStoreNotExist", "logstore nope does not exist")) == {
        "errorCode": "LogStoreNotExist",
        "errorMessage": "logstore nope does not exist",
    }
    assert json.loads(error_body("InvalidCursor", "bad", "req-1"))["requestId"] == "req-1"


@pytest.mark.parametrize("error_class", [InvalidCursor, LogStoreNotExist, SignatureNotMatch])
def test_known_code_round_trips_to_its_class(error_class: type[LogHubError]) -> None:
    error = error_from_body(400, error_body(error_class.code, "why", "req-2"), None)
    assert type(error) is error_class
    assert (error.message, error.status, error.request_id) == ("why", 400, "req-2")


def test_header_request_id_wins_over_the_bodys() -> None:
    error = error_from_body(404, error_body("ShardNotExist", "m", "body-id"), "header-id")
    assert error.request_id == "header-id"


def test_internal_server_error_is_the_root_class() -> None:
    error = error_from_body(500, error_body("InternalServerError", "boom"), "r")
    assert type(error) is LogHubError
    assert error.status == 500


def test_unknown_code_is_a_server_error_with_that_code() -> None:
    error = error_from_body(403, error_body("Forbidden", "no", None), "r")
    assert isinstance(error, ServerError)
    assert (error.code, error.message, error.status, error.request_id) == (
        "Forbidden",
        "no",
        403,
        "r",
    )


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"<html>502</html>",
        b"[1]",
        b'{"errorCode": "X"}',
        b'{"errorCode": 1, "errorMessage": "m"}',
        b"\xff",
    ],
)
def test_unusable_body_is_bad_response(body: bytes) -> None:
    error = error_from_body(502, body, "r")
    assert isinstance(error, ServerError)
    assert (error.code, error.status, error.request_id) == ("BadResponse", 502, "r")
