"""Request signatures: the reference's test vectors, sign/verify round trips, every way a
request can fail verification, and agreement with the official SDKs' own signing code (the
classic Python SDK's v1 and v4, the OpenAPI-generation SDK's v1 with HMAC-SHA256)."""

from __future__ import annotations

import base64
import calendar
import hashlib
import hmac
import time
from collections.abc import Callable
from urllib.parse import quote, urlencode

import pytest
from alibabacloud_gateway_sls.client import Client as OpenApiSlsGateway
from aliyun.log.auth import AuthV1, AuthV4
from aliyun.log.credentials import StaticCredentialsProvider
from hypothesis import given, settings
from hypothesis import strategies as st

from loghub.errors import (
    AuthError,
    InvalidAccessKeyId,
    ParameterInvalid,
    RequestTimeTooSkewed,
    SignatureNotMatch,
    Unauthorized,
)
from loghub.wire.signing import (
    Credentials,
    VerifiedRequest,
    header_map,
    sign_v1,
    sign_v4,
    verify,
)

NOW_S = float(calendar.timegm((2024, 1, 1, 0, 0, 0)))
CREDENTIALS = Credentials("ak", "sk")
SECRETS = {"ak": "sk", "other": "other-secret"}
PATH = "/logstores/ls/shards/0"
UNUSUAL_QUERY = [
    ("type", "log"),
    ("space", "a b"),
    ("equals", "x=y&z"),
    ("slash", "a/b"),
    ("unicode", "héllo 世界"),
    ("empty", ""),
    ("plus", "1+1"),
    ("tilde", "~_-."),
]


def lookup(access_key_id: str) -> str | None:
    return SECRETS.get(access_key_id)


def base_headers() -> dict[str, str]:
    return {
        "host": "proj.127.0.0.1",
        "content-type": "application/json",
        "x-log-apiversion": "0.6.0",
        "x-log-bodyrawsize": "0",
    }


# ---------------------------------------------------------------- the reference's test vectors


V1_VECTORS = [
    (
        "GET",
        PATH,
        [("type", "cursor"), ("from", "begin")],
        b"",
        True,
        "tKLcxQIuIlsmIgUS97D5/8bLUHU=",
    ),
    (
        "POST",
        "/logstores/ls/consumergroups/cg",
        [("type", "heartbeat"), ("consumer", "c1")],
        b"[0, 1]",
        False,
        "2CVNWe8DaaxXy4Ir6QHJPg+BJTY=",
    ),
    (
        "POST",
        "/logstores/ls/consumergroups/cg",
        [("type", "checkpoint"), ("consumer", "c1"), ("forceSuccess", "True")],
        b'{"shard": 0, "checkpoint": "MA=="}',
        False,
        "ldZM9t4Xez8+u5m3XwXoZvBm0iA=",
    ),
]


@pytest.mark.parametrize(("method", "path", "query", "body", "rawsize", "signature"), V1_VECTORS)
def test_v1_reference_vectors(
    method: str,
    path: str,
    query: list[tuple[str, str]],
    body: bytes,
    rawsize: bool,
    signature: str,
) -> None:
    headers = base_headers()
    if not rawsize:
        del headers["x-log-bodyrawsize"]
    sign_v1(method, path, query, headers, body, CREDENTIALS, NOW_S)
    assert headers["authorization"] == f"LOG ak:{signature}"
    assert headers["date"] == headers["x-log-date"] == "Mon, 01 Jan 2024 00:00:00 GMT"
    assert headers["x-log-signaturemethod"] == "hmac-sha1"
    assert ("content-md5" in headers) == bool(body)
    if body == b"[0, 1]":
        assert headers["content-md5"] == "264884439B70AB09A86BC848421C6DE6"
    verified = verify(method, path, urlencode(query), headers, body, lookup, NOW_S)
    assert verified == VerifiedRequest("ak", "v1", NOW_S)


def test_v4_reference_vector() -> None:
    headers = base_headers()
    sign_v4(
        "GET",
        PATH,
        [("type", "cursor"), ("from", "begin")],
        headers,
        b"",
        CREDENTIALS,
        "cn-hangzhou",
        NOW_S,
    )
    assert headers["x-log-date"] == "20240101T000000Z"
    assert headers["x-log-content-sha256"] == hashlib.sha256(b"").hexdigest()
    assert headers["authorization"] == (
        "SLS4-HMAC-SHA256 Credential=ak/20240101/cn-hangzhou/sls/aliyun_v4_request,"
        "Signature=c85daa2c2213cdc220f711a1d8e4145ba529e396a69aedb008f84a188a8cb72d"
    )
    verified = verify("GET", PATH, "type=cursor&from=begin", headers, b"", lookup, NOW_S)
    assert verified == VerifiedRequest("ak", "v4", NOW_S)


# ---------------------------------------------------------------- round trips

Signer = Callable[[str, str, list[tuple[str, str]], dict[str, str], bytes, Credentials], None]


def signer_v1(
    method: str,
    path: str,
    query: list[tuple[str, str]],
    headers: dict[str, str],
    body: bytes,
    c: Credentials,
) -> None:
    sign_v1(method, path, query, headers, body, c, NOW_S)


def signer_v1_sha256(
    method: str,
    path: str,
    query: list[tuple[str, str]],
    headers: dict[str, str],
    body: bytes,
    c: Credentials,
) -> None:
    sign_v1(method, path, query, headers, body, c, NOW_S, signature_method="hmac-sha256")


def signer_v4(
    method: str,
    path: str,
    query: list[tuple[str, str]],
    headers: dict[str, str],
    body: bytes,
    c: Credentials,
) -> None:
    sign_v4(method, path, query, headers, body, c, "cn-local", NOW_S)


# Every check below holds for each way of signing: v1 with either hash function, and v4.
SIGNERS = pytest.mark.parametrize(
    "sign", [signer_v1, signer_v1_sha256, signer_v4], ids=["v1", "v1-sha256", "v4"]
)


@SIGNERS
@pytest.mark.parametrize("body", [b"", b"\x00binary\xff" * 100])
@pytest.mark.parametrize(
    "encode", [urlencode, lambda q: urlencode(q, quote_via=quote)], ids=["form", "rfc3986"]
)
def test_round_trip_with_unusual_query_values(
    sign: Signer, body: bytes, encode: Callable[[list[tuple[str, str]]], str]
) -> None:
    headers = base_headers()
    sign("POST", PATH, UNUSUAL_QUERY, headers, body, CREDENTIALS)
    raw_query = encode(UNUSUAL_QUERY)
    assert (
        verify("POST", PATH, raw_query.encode(), headers, body, lookup, NOW_S).access_key_id == "ak"
    )


@SIGNERS
def test_security_token_is_sent_and_signed(sign: Signer) -> None:
    headers = base_headers()
    sign("GET", PATH, [], headers, b"", Credentials("ak", "sk", "sts-token"))
    assert headers["x-acs-security-token"] == "sts-token"
    verify("GET", PATH, "", headers, b"", lookup, NOW_S)
    headers["x-acs-security-token"] = "other-token"
    with pytest.raises(SignatureNotMatch):
        verify("GET", PATH, "", headers, b"", lookup, NOW_S)


@SIGNERS
def test_header_names_are_case_insensitive(sign: Signer) -> None:
    headers = {
        "Host": "proj.127.0.0.1",
        "Content-Type": "application/json",
        "X-Log-ApiVersion": "0.6.0",
    }
    sign("GET", PATH, [("a", "b")], headers, b"", CREDENTIALS)
    shouted = {name.upper(): value for name, value in headers.items()}
    verify("GET", PATH, "a=b", shouted, b"", lookup, NOW_S)


@SIGNERS
def test_unsigned_headers_may_change(sign: Signer) -> None:
    headers = base_headers()
    sign("GET", PATH, [], headers, b"", CREDENTIALS)
    headers["user-agent"] = "proxy-rewritten"
    headers["x-log-meta-anything"] = "added by a proxy"
    verify("GET", PATH, "", headers, b"", lookup, NOW_S)


@settings(max_examples=50, deadline=None)
@given(
    version=st.sampled_from(["v1", "v1-sha256", "v4"]),
    query=st.lists(
        st.tuples(st.text("abcdefgxyz_", min_size=1, max_size=8), st.text(max_size=12)),
        max_size=4,
        unique_by=lambda kv: kv[0],
    ),
    body=st.binary(max_size=64),
)
def test_any_query_and_body_round_trip(
    version: str, query: list[tuple[str, str]], body: bytes
) -> None:
    headers = base_headers()
    sign = {"v1": signer_v1, "v1-sha256": signer_v1_sha256, "v4": signer_v4}[version]
    sign("PUT", PATH, query, headers, body, CREDENTIALS)
    verified = verify("PUT", PATH, urlencode(query), headers, body, lookup, NOW_S)
    assert verified.version == version[:2]


# ---------------------------------------------------------------- failures


def signed(sign: Signer, body: bytes = b"{}") -> dict[str, str]:
    headers = base_headers()
    sign("POST", PATH, [("type", "log")], headers, body, CREDENTIALS)
    return headers


@SIGNERS
@pytest.mark.parametrize(
    ("method", "path", "query", "body"),
    [
        ("GET", PATH, "type=log", b"{}"),
        ("POST", "/logstores/ls/shards/1", "type=log", b"{}"),
        ("POST", PATH, "type=cursor", b"{}"),
        ("POST", PATH, "type=log&extra=1", b"{}"),
        ("POST", PATH, "type=log", b"{ }"),
        ("POST", PATH, "type=log", b""),
    ],
    ids=["method", "path", "query-value", "query-extra", "body", "body-dropped"],
)
def test_tampered_request_does_not_match(
    sign: Signer, method: str, path: str, query: str, body: bytes
) -> None:
    with pytest.raises(SignatureNotMatch):
        verify(method, path, query, signed(sign), body, lookup, NOW_S)


@SIGNERS
@pytest.mark.parametrize("header", ["x-log-apiversion", "content-type", "x-log-bodyrawsize"])
def test_tampered_signed_header_does_not_match(sign: Signer, header: str) -> None:
    headers = signed(sign)
    headers[header] = headers[header] + "x"
    with pytest.raises(SignatureNotMatch):
        verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S)


@SIGNERS
def test_added_signed_header_does_not_match(sign: Signer) -> None:
    headers = signed(sign)
    headers["x-log-compresstype"] = "lz4"
    with pytest.raises(SignatureNotMatch):
        verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S)


def test_v4_signs_the_host() -> None:
    headers = signed(signer_v4)
    headers["host"] = "other.127.0.0.1"
    with pytest.raises(SignatureNotMatch):
        verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S)


@SIGNERS
def test_wrong_secret_does_not_match(sign: Signer) -> None:
    headers = base_headers()
    sign("GET", PATH, [], headers, b"", Credentials("ak", "not-sk"))
    with pytest.raises(SignatureNotMatch):
        verify("GET", PATH, "", headers, b"", lookup, NOW_S)


@SIGNERS
def test_unknown_access_key_id(sign: Signer) -> None:
    headers = base_headers()
    sign("GET", PATH, [], headers, b"", Credentials("nobody", "sk"))
    with pytest.raises(InvalidAccessKeyId):
        verify("GET", PATH, "", headers, b"", lookup, NOW_S)


@SIGNERS
@pytest.mark.parametrize("offset_s", [-901.0, 901.0, 86400.0])
def test_skewed_request_time(sign: Signer, offset_s: float) -> None:
    headers = signed(sign)
    with pytest.raises(RequestTimeTooSkewed):
        verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S + offset_s)
    verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S + offset_s, skew_s_max=1e6)


@SIGNERS
def test_skew_within_limit_is_accepted(sign: Signer) -> None:
    verified = verify("POST", PATH, "type=log", signed(sign), b"{}", lookup, NOW_S + 899)
    assert verified.request_time_s == NOW_S


def test_v1_missing_content_md5_on_a_body_does_not_match() -> None:
    headers = signed(signer_v1)
    del headers["content-md5"]
    with pytest.raises(SignatureNotMatch):
        verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S)


def test_v1_falls_back_to_x_log_date_when_date_was_stripped() -> None:
    headers = signed(signer_v1)
    del headers["date"]
    verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S)


def test_v1_without_any_date_is_unauthorized() -> None:
    headers = signed(signer_v1)
    del headers["date"], headers["x-log-date"]
    with pytest.raises(Unauthorized):
        verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S)


@pytest.mark.parametrize(
    "date",
    [
        "yesterday",
        "",
        "Mon, 99 Jan 2024 00:00:00 GMT",
        "Mon, 01 Jan 99999999999 00:00:00 GMT",  # parsed, then OverflowError in timegm
    ],
)
def test_v1_unparseable_date_is_unauthorized(date: str) -> None:
    headers = signed(signer_v1)
    headers["date"] = headers["x-log-date"] = date
    with pytest.raises(Unauthorized):
        verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S)


@pytest.mark.parametrize(
    "date",
    [
        "20240101",
        "2024-01-01T00:00:00Z",
        "20240102T000000Z",
        "99999999999T000000Z",
        "00000101T000000Z",
    ],
)
def test_v4_bad_or_mismatched_date_is_refused(date: str) -> None:
    headers = signed(signer_v4)
    headers["x-log-date"] = date
    with pytest.raises(AuthError):
        verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S)


def test_v4_missing_content_hash_is_unauthorized() -> None:
    headers = signed(signer_v4)
    del headers["x-log-content-sha256"]
    with pytest.raises(Unauthorized):
        verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S)


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer token",
        "LOG ",
        "LOG ak",
        "LOG :sig",
        "LOG ak:",
        "SLS4-HMAC-SHA256 ",
        "SLS4-HMAC-SHA256 Credential=ak/20240101/r/sls/aliyun_v4_request",
        "SLS4-HMAC-SHA256 Signature=abc",
        "SLS4-HMAC-SHA256 Credential=ak/20240101/sls/aliyun_v4_request,Signature=abc",
        "SLS4-HMAC-SHA256 Credential=ak/20240101/r/s3/aws4_request,Signature=abc",
        "SLS4-HMAC-SHA256 garbage",
    ],
)
def test_missing_or_malformed_authorization_is_unauthorized(authorization: str | None) -> None:
    headers = signed(signer_v1)
    headers.pop("authorization")
    if authorization is not None:
        headers["authorization"] = authorization
    with pytest.raises(Unauthorized):
        verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S)


def test_non_ascii_signature_is_a_mismatch_not_a_crash() -> None:
    headers = signed(signer_v1)
    headers["authorization"] = "LOG ak:sïgnature"
    with pytest.raises(SignatureNotMatch):
        verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S)


# ---------------------------------------------------------------- the official SDK signs, we verify

SDK_QUERIES = [
    {},
    {"type": "cursor", "from": "begin"},
    {"type": "cursor_time", "cursor": "MA==\n"},
    {"type": "log", "cursor": "MA==", "count": "1000", "end_cursor": "Mg=="},
    {"key": "a b/c=d", "unicode": "héllo", "empty": ""},
]


def sdk_headers(body: bytes) -> dict[str, str]:
    # As LogClient._send prepares them, in the SDK's own casing.
    headers = {
        "Host": "proj.127.0.0.1",
        "Content-Type": "application/x-protobuf",
        "Content-Length": str(len(body)),
        "x-log-apiversion": "0.6.0",
        "x-log-bodyrawsize": str(len(body)),
        "User-Agent": "log-python-sdk-v-0.9.52",
    }
    if body:
        headers["x-log-compresstype"] = "lz4"
    return headers


@pytest.mark.parametrize("params", SDK_QUERIES)
@pytest.mark.parametrize("body", [b"", b"\x0a\x04\x08\x01\x12\x00"])
@pytest.mark.parametrize("token", ["", "sts-token"])
@pytest.mark.parametrize("version", ["v1", "v4"])
def test_sdk_signed_request_verifies(
    params: dict[str, str], body: bytes, token: str, version: str
) -> None:
    provider = StaticCredentialsProvider("ak", "sk", token)
    auth = AuthV1(provider) if version == "v1" else AuthV4(provider, "cn-local")
    headers = sdk_headers(body)
    method = "POST" if body else "GET"
    auth.sign_request(method, PATH, dict(params), headers, body)
    raw_query = urlencode(params)  # what requests puts on the wire
    now_s = time.time()  # the SDK reads the clock itself
    verified = verify(method, PATH, raw_query, headers, body, lookup, now_s)
    assert (verified.access_key_id, verified.version) == ("ak", version)
    assert abs(verified.request_time_s - now_s) < 5
    with pytest.raises(SignatureNotMatch):
        verify(method, PATH + "x", raw_query, headers, body, lookup, now_s)


@pytest.mark.parametrize("version", ["v1", "v4"])
def test_we_sign_as_the_sdk_does(version: str) -> None:
    # Same inputs and time: our headers equal the SDK's (compared case-insensitively).
    body = b"\x0a\x04\x08\x01\x12\x00"
    params = {"key": "a b/c=d", "unicode": "héllo", "empty": ""}
    sdk = sdk_headers(body)
    provider = StaticCredentialsProvider("ak", "sk", "")
    if version == "v1":
        AuthV1(provider).sign_request("POST", PATH, dict(params), sdk, body)
        date = sdk["Date"]
        now_s = float(calendar.timegm(time.strptime(date, "%a, %d %b %Y %H:%M:%S GMT")))
    else:
        AuthV4(provider, "cn-local").sign_request("POST", PATH, dict(params), sdk, body)
        now_s = float(calendar.timegm(time.strptime(sdk["x-log-date"], "%Y%m%dT%H%M%SZ")))
    ours = sdk_headers(body)
    if version == "v1":
        sign_v1("POST", PATH, list(params.items()), ours, body, CREDENTIALS, now_s)
    else:
        sign_v4("POST", PATH, list(params.items()), ours, body, CREDENTIALS, "cn-local", now_s)
    assert {k.lower(): v for k, v in ours.items()} == {k.lower(): v for k, v in sdk.items()}


# ---------------------------------------------------------------- one value per signed header


@pytest.mark.parametrize(
    "name",
    [
        "Host",
        "host",
        "Authorization",
        "Date",
        "Content-MD5",
        "Content-Type",
        "x-log-date",
        "x-log-bodyrawsize",
        "x-acs-security-token",
        "Content-Length",
    ],
)
def test_a_second_copy_of_a_routed_or_signed_header_is_refused(name: str) -> None:
    with pytest.raises(ParameterInvalid, match="more than once"):
        header_map([(name, "a"), ("accept", "*/*"), (name.upper(), "a")])


def test_other_repeated_headers_keep_their_last_copy() -> None:
    mapping = header_map([("Accept-Encoding", "lz4"), ("accept-encoding", "gzip"), ("HOST", "h")])
    assert mapping == {"accept-encoding": "gzip", "host": "h"}


@SIGNERS
def test_verify_refuses_names_that_differ_in_case_only(sign: Signer) -> None:
    headers = signed(sign)
    headers["Host"] = "other.127.0.0.1"
    with pytest.raises(ParameterInvalid):
        verify("POST", PATH, "type=log", headers, b"{}", lookup, NOW_S)


# ---------------------------------------------------------------- v1's two hash functions


def openapi_signed_headers(
    method: str, query: dict[str, str], body: bytes, secret: str = "sk"
) -> dict[str, str]:
    """A request signed by the OpenAPI-generation SDK's own gateway code, with the headers
    it sets (lowercase names, an empty Content-MD5 when there is no body)."""
    headers = {
        "accept": "application/json",
        "host": "proj.127.0.0.1",
        "user-agent": "AlibabaCloud (Linux) Python/3.11 Core/0.4.6 TeaDSL/1",
        "x-log-apiversion": "0.6.0",
        "content-type": "application/json",
        "x-log-bodyrawsize": str(len(body)),
        "x-log-signaturemethod": "hmac-sha256",
        "date": "Mon, 01 Jan 2024 00:00:00 GMT",
        "content-md5": hashlib.md5(body).hexdigest().upper() if body else "",
    }
    headers["authorization"] = OpenApiSlsGateway().get_authorization(
        PATH, method, dict(query), headers, "ak", secret
    )
    return headers


@pytest.mark.parametrize(
    ("method", "query", "body"),
    [
        ("GET", {"type": "cursor", "from": "begin"}, b""),
        ("POST", {"type": "heartbeat", "consumer": "c 1"}, b"[0, 1]"),
        ("POST", {"action": "split", "key": "8" + "0" * 31, "shardCount": "2"}, b""),
    ],
)
def test_openapi_sdk_hmac_sha256_v1_signature_verifies(
    method: str, query: dict[str, str], body: bytes
) -> None:
    headers = openapi_signed_headers(method, query, body)
    verified = verify(method, PATH, urlencode(query), headers, body, lookup, NOW_S)
    assert verified == VerifiedRequest("ak", "v1", NOW_S, "hmac-sha256")
    ours = {name: headers[name] for name in headers if name not in ("authorization", "date")}
    sign_v1(method, PATH, list(query.items()), ours, body, CREDENTIALS, NOW_S, "hmac-sha256")
    assert ours["authorization"] == headers["authorization"]


def test_openapi_sdk_signature_with_a_wrong_secret_does_not_match() -> None:
    headers = openapi_signed_headers("GET", {}, b"", secret="not-sk")
    with pytest.raises(SignatureNotMatch, match="hmac-sha256"):
        verify("GET", PATH, "", headers, b"", lookup, NOW_S)


@pytest.mark.parametrize(
    ("signed_as", "claimed"),
    [("hmac-sha1", "hmac-sha256"), ("hmac-sha256", "hmac-sha1"), ("hmac-sha256", None)],
)
def test_a_signature_claimed_for_the_other_hash_function_does_not_match(
    signed_as: str, claimed: str | None
) -> None:
    # A forger who relabels the method changes a signed header (or drops it): whichever hash
    # the server then uses, the signature it recomputes is not the one sent.
    headers = base_headers()
    sign_v1("GET", PATH, [], headers, b"", CREDENTIALS, NOW_S, signed_as)
    if claimed is None:
        del headers["x-log-signaturemethod"]
    else:
        headers["x-log-signaturemethod"] = claimed
    with pytest.raises(SignatureNotMatch):
        verify("GET", PATH, "", headers, b"", lookup, NOW_S)


def test_a_signature_forged_over_the_method_header_does_not_match() -> None:
    # The string to sign names hmac-sha256 but the digest is SHA-1's: refused, not accepted
    # as the SHA-1 signature it is.
    headers = base_headers()
    headers["x-log-signaturemethod"] = "hmac-sha256"
    sign_v1("GET", PATH, [], headers, b"", CREDENTIALS, NOW_S)  # sets hmac-sha1, signs SHA-1
    sha1_signature = headers["authorization"]
    headers = base_headers()
    sign_v1("GET", PATH, [], headers, b"", CREDENTIALS, NOW_S, "hmac-sha256")
    headers["authorization"] = sha1_signature
    with pytest.raises(SignatureNotMatch):
        verify("GET", PATH, "", headers, b"", lookup, NOW_S)


def test_a_v1_request_without_a_method_header_is_hmac_sha1() -> None:
    headers = base_headers()
    sign_v1("GET", PATH, [], headers, b"", CREDENTIALS, NOW_S)
    del headers["x-log-signaturemethod"]
    headers.pop("x-log-date")
    # re-sign without the header, as a client older than the header did
    del headers["authorization"]
    string_to_sign = (
        "GET\n\napplication/json\nMon, 01 Jan 2024 00:00:00 GMT\n"
        "x-log-apiversion:0.6.0\nx-log-bodyrawsize:0\n" + PATH
    )
    digest = hmac.new(b"sk", string_to_sign.encode(), hashlib.sha1).digest()
    headers["authorization"] = "LOG ak:" + base64.b64encode(digest).decode()
    verified = verify("GET", PATH, "", headers, b"", lookup, NOW_S)
    assert verified.signature_method == "hmac-sha1"


@pytest.mark.parametrize("method", ["hmac-md5", "hmac-sha512", "", "sha256", "none"])
def test_an_unknown_signature_method_is_refused(method: str) -> None:
    # Signed correctly (with SHA-1) over the unknown name: still refused, with a clear reason.
    headers = base_headers()
    sign_v1("GET", PATH, [], headers, b"", CREDENTIALS, NOW_S)
    headers["x-log-signaturemethod"] = method
    del headers["authorization"]
    string_to_sign = (
        "GET\n\napplication/json\nMon, 01 Jan 2024 00:00:00 GMT\n"
        f"x-log-apiversion:0.6.0\nx-log-bodyrawsize:0\nx-log-signaturemethod:{method}\n{PATH}"
    )
    digest = hmac.new(b"sk", string_to_sign.encode(), hashlib.sha1).digest()
    headers["authorization"] = "LOG ak:" + base64.b64encode(digest).decode()
    with pytest.raises(Unauthorized, match="x-log-signaturemethod"):
        verify("GET", PATH, "", headers, b"", lookup, NOW_S)
