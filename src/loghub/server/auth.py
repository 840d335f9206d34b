"""Who may call what: signatures, the projects a key may touch, and the metrics page.

A request is checked in three steps, all on one mapping of its headers (``header_map``, which
refuses a second copy of any header that routing or a signature reads):

1. ``verify`` (wire/signing.py): a known key, a date within the allowed skew, a matching
   signature over the body, path, query and signed headers.
2. Replay across projects (v1 only). Signature v1 does not cover ``Host``, and the project
   is carried by ``Host`` alone, so a captured v1 request would verify just as well when sent
   again to another project. Each v1 signature is therefore bound, for as long as its date is
   acceptable, to the project its ``Host`` named when it was first accepted; the same
   signature for another project is refused with 503 ``SignatureReused``. Not a 4xx: two
   byte-identical v1 requests to two projects in the same second (dates have one-second
   resolution) carry the same signature too, and the SDK retries a 5xx after a second,
   signed anew, which then passes; a replay cannot be signed anew. ``--no-v1-project-
   binding`` turns this off, for a server reached only over TLS whose v1 clients do not
   retry a 503. v4 signs ``Host`` and needs no such memory, and neither does a v1 request
   that carries the project in a signed ``x-log-project`` header (v1 signs every
   ``x-log-*`` header), as LogHub's own client does: the signature then binds the project by
   itself, and a request whose header and ``Host`` disagree is refused.
3. The key's grant (``KeyGrant``): the project must be one the key names (or ``*``), and an
   operation that changes something needs ``"access": "write"``. Consumer-group operations
   (create, update, heartbeat, checkpoint) count as reading: they are what a consumer with a
   read-only key must do to read. Deleting a group, writing logs and administration are
   writes.

``/metrics`` takes a signed request or HTTP Basic credentials (key id and secret), so that
Prometheus can scrape it; any known key may read it.

Thread-safety: call from the event loop thread only (the replay memory is not locked).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections import OrderedDict
from collections.abc import Mapping

from loghub.errors import SignatureReused, Unauthorized
from loghub.server.config import KeyGrant, ServerConfig
from loghub.wire.signing import verify

__all__ = ["PROJECT_HEADER", "Authenticator", "needs_write"]

# A v1 request may name its project in this header; v1 signs it, so the project is bound.
PROJECT_HEADER = "x-log-project"

_FULL_ACCESS = KeyGrant()
# Bounds the replay memory; at about 200 bytes an entry this is about 20 MiB. When it is full
# the oldest entry goes first: the binding then holds for the latest this-many v1 requests.
_V1_SIGNATURES_MAX = 100_000


def needs_write(method: str, parts: list[str]) -> bool:
    """Whether an API call changes something a read-only key may not change."""
    if method == "GET":
        return False
    is_consumer_group = len(parts) >= 3 and parts[0] == "logstores" and parts[2] == "consumergroups"
    return not (is_consumer_group and method in ("POST", "PUT"))


class Authenticator:
    def __init__(self, config: ServerConfig) -> None:
        self._keys = config.keys
        self._grants = config.key_grants
        self._skew_s_max = float(config.limits.clock_skew_s_max)
        self._v1_binding = config.v1_project_binding
        # v1 Authorization value -> (project it was first seen with ("" for none), when)
        self._v1_hosts: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def authenticate(
        self,
        method: str,
        path: str,
        raw_query: bytes,
        headers: Mapping[str, str],
        body: bytes,
        now_s: float,
        project: str | None,
        write: bool,
    ) -> str:
        """The key id that signed this request and may make it; an ``AuthError`` otherwise.

        ``project`` None is the bare endpoint (listing projects), which every key may call
        (the listing shows a key only its projects). The grant is checked before the replay
        memory, so a refused request leaves no trace there."""
        verified = verify(
            method, path, raw_query, headers, body, self._keys.get, now_s, self._skew_s_max
        )
        if project is not None:
            self._authorize(verified.access_key_id, project, write)
        named = headers.get(PROJECT_HEADER)
        if named is not None and named != (project or ""):
            raise Unauthorized(f"the signed {PROJECT_HEADER} header names another project")
        if verified.version == "v1" and named is None and self._v1_binding:
            self._bind_v1(headers["authorization"], project or "", now_s)
        return verified.access_key_id

    def _authorize(self, key_id: str, project: str, write: bool) -> None:
        grant = self.grant(key_id)
        if not grant.allows(project, write):
            what = "write to" if write and grant.allows(project, False) else "access"
            raise Unauthorized(f"access key {key_id!r} may not {what} project {project!r}")

    def grant(self, key_id: str) -> KeyGrant:
        return self._grants.get(key_id, _FULL_ACCESS)

    def authenticate_metrics(
        self,
        method: str,
        path: str,
        raw_query: bytes,
        headers: Mapping[str, str],
        now_s: float,
    ) -> None:
        authorization = headers.get("authorization", "")
        if not authorization.startswith("Basic "):
            self.authenticate(method, path, raw_query, headers, b"", now_s, None, False)
            return
        try:
            decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise Unauthorized("malformed Basic credentials") from None
        key_id, _, secret = decoded.partition(":")
        expected = self._keys.get(key_id)
        if expected is None or not hmac.compare_digest(expected.encode(), secret.encode()):
            raise Unauthorized("unknown key id or wrong secret")

    def _bind_v1(self, authorization: str, project: str, now_s: float) -> None:
        self._forget_expired(now_s)
        seen = self._v1_hosts.get(authorization)
        if seen is None:
            self._v1_hosts[authorization] = (project, now_s)
            if len(self._v1_hosts) > _V1_SIGNATURES_MAX:
                self._v1_hosts.popitem(last=False)
            return
        if seen[0] != project:
            raise SignatureReused(
                "this v1 signature was already used for another project: sign the request again"
            )

    def _forget_expired(self, now_s: float) -> None:
        # A date is acceptable for skew_s_max either side of the clock: after twice that, no
        # request with the same signature can pass verify any more.
        horizon_s = now_s - 2 * self._skew_s_max
        while self._v1_hosts:
            _, (_, seen_s) = next(iter(self._v1_hosts.items()))
            if seen_s >= horizon_s:
                return
            self._v1_hosts.popitem(last=False)
