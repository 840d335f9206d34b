"""Request signatures of the LogHub protocol, v1 (HMAC-SHA1 or HMAC-SHA256) and v4
(HMAC-SHA256): sign and verify.

The rules are those of reference/sls-protocol.md section 4, which the official SDK follows;
the pitfalls that break compatibility are called out where they are handled:

- v1 signs ``x-log-*``/``x-acs-*`` headers but never ``x-log-date``, which the SDK adds after
  signing (a copy of ``Date`` for proxies that drop ``Date``); it signs the *decoded* query
  values, sorted by key, after the path.
- v1 has two hash functions, named by the signed ``x-log-signaturemethod`` header:
  ``hmac-sha1`` (the classic SDKs; also assumed when the header is absent) and
  ``hmac-sha256`` (the OpenAPI-generation SDKs, ``alibabacloud-sls20201230`` and its twins).
  The string to sign is the same for both; any other method is refused, never guessed.
- v4 signs ``host``, ``content-type`` and ``x-log-*``/``x-acs-*`` (``x-log-date`` included);
  the list of signed headers is not sent, so the verifier rebuilds it by the same rule. Query
  values are re-encoded by RFC 3986 (``/`` encoded, empty value written as the key alone).

Header names: the ``sign_*`` functions add lowercase names (``date``, ``content-md5``,
``authorization``, ...) and read the caller's headers case-insensitively. ``verify`` takes
the headers as received, as a mapping with lowercase names (what ASGI gives) or any
mapping whose names differ in case only (they are lowercased here).

One value per signed header: a request with two ``Host`` headers (or two of any header the
signature covers) could be checked against one copy and acted on by the other, so
``signed_headers`` refuses such a request before anything reads it, and the caller routes by
the very mapping that ``verify`` checks.

``path`` is the decoded URL path (as the SDK builds it, e.g. ``/logstores/ls/shards/0``).
Time is an argument (``now_s``, unix seconds). Pure functions; thread-safe.
"""

from __future__ import annotations

import base64
import calendar
import hashlib
import hmac
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from email.utils import formatdate, parsedate_to_datetime
from typing import Any, Literal
from urllib.parse import parse_qsl, quote

from loghub.errors import (
    InvalidAccessKeyId,
    ParameterInvalid,
    RequestTimeTooSkewed,
    SignatureNotMatch,
    Unauthorized,
)

__all__ = [
    "Credentials",
    "VerifiedRequest",
    "header_map",
    "sign_v1",
    "sign_v4",
    "verify",
]

_V1_PREFIX = "LOG "
_V4_PREFIX = "SLS4-HMAC-SHA256 "
_V4_SCOPE_SUFFIX = "sls/aliyun_v4_request"
_V4_DATE_FORMAT = "%Y%m%dT%H%M%SZ"


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    access_key_secret: str
    security_token: str | None = None  # STS token, sent (and signed) as x-acs-security-token


@dataclass(frozen=True)
class VerifiedRequest:
    """Who signed a request that passed ``verify``, how, and the time it claims."""

    access_key_id: str
    version: Literal["v1", "v4"]
    request_time_s: float
    signature_method: str = "hmac-sha1"  # v1's hash function; v4 is always HMAC-SHA256


# ---------------------------------------------------------------------------- v1

_SIGNATURE_METHOD_HEADER = "x-log-signaturemethod"
# v1's hash functions by the name the client signs in x-log-signaturemethod.
_V1_DIGESTS: dict[str, Callable[[], Any]] = {
    "hmac-sha1": hashlib.sha1,
    "hmac-sha256": hashlib.sha256,
}


def sign_v1(
    method: str,
    path: str,
    query: Sequence[tuple[str, str]],
    headers: MutableMapping[str, str],
    body: bytes,
    credentials: Credentials,
    now_s: float,
    signature_method: str = "hmac-sha1",
) -> None:
    """Sign a request with v1, adding its headers to ``headers`` as the SDK does.

    ``signature_method``: ``hmac-sha1`` as the classic SDKs sign, or ``hmac-sha256`` as the
    OpenAPI-generation SDKs do."""
    assert signature_method in _V1_DIGESTS, signature_method
    if credentials.security_token:
        headers["x-acs-security-token"] = credentials.security_token
    headers[_SIGNATURE_METHOD_HEADER] = signature_method
    date = formatdate(now_s, usegmt=True)
    headers["date"] = date
    content_md5 = ""
    if body:
        content_md5 = hashlib.md5(body).hexdigest().upper()
        headers["content-md5"] = content_md5
    lowered = _lowercase_names(headers)
    string_to_sign = _v1_string_to_sign(method, path, query, lowered, content_md5, date)
    signature = _v1_signature(credentials.access_key_secret, string_to_sign, signature_method)
    headers["authorization"] = f"{_V1_PREFIX}{credentials.access_key_id}:{signature}"
    headers["x-log-date"] = date  # after signing, so it is not signed: the SDK's order


def _v1_string_to_sign(
    method: str,
    path: str,
    query: Sequence[tuple[str, str]],
    headers: Mapping[str, str],
    content_md5: str,
    date: str,
) -> str:
    signed_headers = "".join(
        f"{name}:{headers[name]}\n"
        for name in sorted(headers)
        if _is_signed_log_header(name) and name != "x-log-date"
    )
    resource = path
    if query:
        resource += "?" + "&".join(f"{key}={value}" for key, value in sorted(query))
    content_type = headers.get("content-type", "")
    return f"{method}\n{content_md5}\n{content_type}\n{date}\n{signed_headers}{resource}"


def _v1_signature(secret: str, string_to_sign: str, signature_method: str) -> str:
    digest = hmac.new(
        secret.encode(), string_to_sign.encode(), _V1_DIGESTS[signature_method]
    ).digest()
    return base64.b64encode(digest).decode("ascii")


def _v1_signature_method(headers: Mapping[str, str]) -> str:
    """The hash function a v1 request names; absent means hmac-sha1 (what clients older than
    the header sent). The header is signed, so it cannot be switched without the secret."""
    named = headers.get(_SIGNATURE_METHOD_HEADER)
    if named is None:
        return "hmac-sha1"
    method = named.strip().lower()
    if method not in _V1_DIGESTS:
        raise Unauthorized(
            f"unsupported {_SIGNATURE_METHOD_HEADER} {named[:32]!r}:"
            f" v1 signatures use {' or '.join(_V1_DIGESTS)}"
        )
    return method


def _verify_v1(
    method: str,
    path: str,
    raw_query: str,
    headers: Mapping[str, str],
    body: bytes,
    credential: str,
    lookup_secret: Callable[[str], str | None],
    now_s: float,
    skew_s_max: float,
) -> VerifiedRequest:
    access_key_id, _, signature = credential.rpartition(":")
    if not access_key_id or not signature:
        raise Unauthorized("malformed v1 Authorization header")
    signature_method = _v1_signature_method(headers)
    secret = _secret(lookup_secret, access_key_id)
    date = headers.get("date") or headers.get("x-log-date")
    if not date:
        raise Unauthorized("v1 request without Date or x-log-date")
    request_time_s = _parse_http_date(date)
    _check_skew(request_time_s, now_s, skew_s_max)
    content_md5 = headers.get("content-md5", "")
    # A body must come with its Content-MD5: without it the signature would not cover the body.
    body_md5 = hashlib.md5(body).hexdigest().upper()
    if (content_md5 or body) and not hmac.compare_digest(
        content_md5.upper().encode(), body_md5.encode()
    ):
        raise SignatureNotMatch("Content-MD5 is missing or does not match the body")
    string_to_sign = _v1_string_to_sign(
        method, path, _query_pairs(raw_query), headers, content_md5, date
    )
    expected = _v1_signature(secret, string_to_sign, signature_method)
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise SignatureNotMatch(f"v1 signature ({signature_method}) does not match")
    return VerifiedRequest(access_key_id, "v1", request_time_s, signature_method)


def _parse_http_date(date: str) -> float:
    # OverflowError: a year such as 99999999999 parses, then overflows the C time functions.
    try:
        parsed = parsedate_to_datetime(date)
        # A date without a zone ("-0000") is naive; HTTP dates are GMT.
        return float(calendar.timegm(parsed.utctimetuple()))
    except (TypeError, ValueError, OverflowError, IndexError) as exc:
        raise Unauthorized(f"unparseable request date {date[:64]!r}") from exc


# ---------------------------------------------------------------------------- v4


def sign_v4(
    method: str,
    path: str,
    query: Sequence[tuple[str, str]],
    headers: MutableMapping[str, str],
    body: bytes,
    credentials: Credentials,
    region: str,
    now_s: float,
) -> None:
    """Sign a request with v4, adding its headers to ``headers`` as the SDK does.

    ``headers`` should already hold ``host`` (and ``content-type`` if any): both are signed.
    """
    if credentials.security_token:
        headers["x-acs-security-token"] = credentials.security_token
    content_sha256 = hashlib.sha256(body).hexdigest()
    request_time = time.strftime(_V4_DATE_FORMAT, time.gmtime(now_s))
    headers["x-log-content-sha256"] = content_sha256
    headers["x-log-date"] = request_time
    scope = f"{request_time[:8]}/{region}/{_V4_SCOPE_SUFFIX}"
    canonical_query = _v4_canonical_query(query)
    signature = _v4_signature(
        credentials.access_key_secret,
        method,
        path,
        canonical_query,
        _lowercase_names(headers),
        content_sha256,
        request_time,
        scope,
    )
    headers["authorization"] = (
        f"{_V4_PREFIX}Credential={credentials.access_key_id}/{scope},Signature={signature}"
    )


def _v4_canonical_query(query: Sequence[tuple[str, str]]) -> str:
    encoded = sorted((key, quote(value, safe="~")) for key, value in query)
    return "&".join(f"{key}={value}" if value else key for key, value in encoded)


def _v4_signature(
    secret: str,
    method: str,
    path: str,
    canonical_query: str,
    headers: Mapping[str, str],
    content_sha256: str,
    request_time: str,
    scope: str,
) -> str:
    names = sorted(name for name in headers if _is_v4_signed_header(name))
    header_lines = "".join(f"{name}:{headers[name].strip()}\n" for name in names)
    canonical_request = "\n".join(
        [method, path, canonical_query, header_lines, ";".join(names), content_sha256]
    )
    string_to_sign = "\n".join(
        [
            _V4_PREFIX.strip(),
            request_time,
            scope,
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        ]
    )
    date, region = scope.split("/")[:2]
    key = ("aliyun_v4" + secret).encode()
    for part in (date, region, "sls", "aliyun_v4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def _verify_v4(
    method: str,
    path: str,
    raw_query: str,
    headers: Mapping[str, str],
    body: bytes,
    credential: str,
    lookup_secret: Callable[[str], str | None],
    now_s: float,
    skew_s_max: float,
) -> VerifiedRequest:
    fields = dict(part.strip().partition("=")[::2] for part in credential.split(","))
    credential_scope = fields.get("Credential", "")
    signature = fields.get("Signature", "")
    access_key_id, _, scope = credential_scope.partition("/")
    scope_parts = scope.split("/")
    if (
        not access_key_id
        or not signature
        or len(scope_parts) != 4
        or "/".join(scope_parts[2:]) != _V4_SCOPE_SUFFIX
    ):
        raise Unauthorized("malformed v4 Authorization header")
    secret = _secret(lookup_secret, access_key_id)
    request_time = headers.get("x-log-date", "")
    try:
        request_time_s = float(calendar.timegm(time.strptime(request_time, _V4_DATE_FORMAT)))
    except (ValueError, OverflowError) as exc:
        raise Unauthorized(
            f"v4 request without a valid x-log-date ({request_time[:64]!r})"
        ) from exc
    if scope_parts[0] != request_time[:8]:
        raise Unauthorized("v4 credential scope date differs from x-log-date")
    _check_skew(request_time_s, now_s, skew_s_max)
    content_sha256 = headers.get("x-log-content-sha256")
    if content_sha256 is None:
        raise Unauthorized("v4 request without x-log-content-sha256")
    if not hmac.compare_digest(
        content_sha256.lower().encode(), hashlib.sha256(body).hexdigest().encode()
    ):
        raise SignatureNotMatch("x-log-content-sha256 does not match the body")
    canonical_query = _v4_canonical_query(_query_pairs(raw_query))
    expected = _v4_signature(
        secret, method, path, canonical_query, headers, content_sha256, request_time, scope
    )
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise SignatureNotMatch("v4 signature does not match")
    return VerifiedRequest(access_key_id, "v4", request_time_s)


# ---------------------------------------------------------------------------- both


def verify(
    method: str,
    path: str,
    raw_query: bytes | str,
    headers: Mapping[str, str],
    body: bytes,
    lookup_secret: Callable[[str], str | None],
    now_s: float,
    skew_s_max: float = 900.0,
) -> VerifiedRequest:
    """Check a received request's signature (v1 or v4, by its Authorization scheme).

    ``raw_query`` is the query string exactly as received (still percent-encoded);
    ``lookup_secret`` returns the secret of an access key id, or None when it is unknown.
    Raises ``Unauthorized`` (no or malformed credentials or date), ``InvalidAccessKeyId``,
    ``RequestTimeTooSkewed`` (more than ``skew_s_max`` from ``now_s``) or
    ``SignatureNotMatch`` (a signature, Content-MD5 or content hash that does not match).
    """
    if isinstance(raw_query, bytes):
        raw_query = raw_query.decode("utf-8", errors="replace")
    lowered = _lowercase_names(headers)
    authorization = lowered.get("authorization")
    if not authorization:
        raise Unauthorized("request without an Authorization header")
    if authorization.startswith(_V1_PREFIX):
        verify_version = _verify_v1
        credential = authorization[len(_V1_PREFIX) :].strip()
    elif authorization.startswith(_V4_PREFIX):
        verify_version = _verify_v4
        credential = authorization[len(_V4_PREFIX) :].strip()
    else:
        raise Unauthorized("unknown Authorization scheme")
    return verify_version(
        method, path, raw_query, lowered, body, credential, lookup_secret, now_s, skew_s_max
    )


def _query_pairs(raw_query: str) -> list[tuple[str, str]]:
    """The decoded query, as both versions sign it (v4 then re-encodes the values): a
    parameter sent as ``key=`` or ``key`` is kept, with an empty value."""
    return parse_qsl(raw_query, keep_blank_values=True)


def _secret(lookup_secret: Callable[[str], str | None], access_key_id: str) -> str:
    secret = lookup_secret(access_key_id)
    if secret is None:
        raise InvalidAccessKeyId(f"unknown access key id {access_key_id!r}")
    return secret


def _check_skew(request_time_s: float, now_s: float, skew_s_max: float) -> None:
    if abs(now_s - request_time_s) > skew_s_max:
        raise RequestTimeTooSkewed(
            f"request time is {now_s - request_time_s:+.0f} s from the server's clock"
            f" (at most {skew_s_max:.0f} s allowed)"
        )


def header_map(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The received headers as one mapping with lowercase names, for routing and ``verify``
    alike; ``ParameterInvalid`` when a header that routing or a signature reads (``host``,
    ``authorization``, ``date``, ``content-md5``, ``content-type``, ``content-length``,
    ``x-log-*``, ``x-acs-*``) comes more than once. Other headers keep their last copy."""
    mapping: dict[str, str] = {}
    for raw_name, value in headers:
        name = raw_name.lower()
        if name in mapping and _is_single_valued(name):
            raise ParameterInvalid(f"the header {name} appears more than once")
        mapping[name] = value
    return mapping


def _lowercase_names(headers: Mapping[str, str]) -> dict[str, str]:
    # Names differing in case only are one header sent twice: refused as header_map does.
    return header_map(headers.items())


def _is_single_valued(name: str) -> bool:
    return name in _SINGLE_VALUED or _is_signed_log_header(name)


_SINGLE_VALUED = frozenset(
    ("host", "authorization", "date", "content-md5", "content-type", "content-length")
)


def _is_signed_log_header(name: str) -> bool:
    return name.startswith("x-acs-") or (
        name.startswith("x-log-") and not name.startswith("x-log-meta-")
    )


def _is_v4_signed_header(name: str) -> bool:
    return name in ("content-type", "host") or _is_signed_log_header(name)
