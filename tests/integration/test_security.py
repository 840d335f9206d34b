"""Forged, tampered and replayed requests against a real signed server, and keys limited to
projects.

Each attack starts from a request signed as the official SDKs sign it (v1 with HMAC-SHA1 as
the classic SDKs do, v1 with HMAC-SHA256 as the OpenAPI-generation SDKs do, and v4), changes
one thing, and sends the bytes over a plain socket (client libraries would not send two
`Host` headers). The attacker holds project alpha's key and aims at project bravo, which
holds a logstore with data: every attack must be refused, and bravo must read back exactly
as before.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest
import raw_http
from raw_http import Headers, RawConnection, Reply, replace_header, target
from server_process import ServerProcess

from loghub.wire.logs import make_log_group
from loghub.wire.signing import Credentials, sign_v1

Version = Literal["v1", "v1-sha256", "v4"]
VERSIONS: tuple[Version, ...] = ("v1", "v1-sha256", "v4")


def signed(
    version: Version,
    method: str,
    host: str,
    path: str,
    query: list[tuple[str, str]],
    body: bytes = b"",
    **kw: object,
) -> Headers:
    """raw_http.signed, and v1 with HMAC-SHA256 (``x-log-signaturemethod: hmac-sha256``)."""
    if version != "v1-sha256":
        return raw_http.signed(version, method, host, path, query, body, **kw)  # type: ignore[arg-type]
    extra: dict[str, str] = kw.get("extra") or {}  # type: ignore[assignment]
    headers = {
        "host": host,
        "content-type": "application/json",
        "x-log-apiversion": "0.6.0",
        "x-log-bodyrawsize": str(len(body)),
        **extra,
    }
    credentials = Credentials(str(kw.get("key_id", "ak")), str(kw.get("secret", "sk")))
    now_s = kw.get("now_s")
    when = time.time() if now_s is None else float(now_s)  # type: ignore[arg-type]
    sign_v1(method, path, query, headers, body, credentials, when, "hmac-sha256")
    return list(headers.items())


ALPHA = "alpha.127.0.0.1"
BRAVO = "bravo.127.0.0.1"
PUT_PATH = "/logstores/store/shards/0"


def _group(marker: str) -> bytes:
    return make_log_group([(1_700_000_000, {"marker": marker})]).SerializeToString()


def _ok(
    http: RawConnection,
    version: Version,
    method: str,
    host: str,
    path: str,
    query: list[tuple[str, str]] | None = None,
    body: bytes = b"",
    **kw: object,
) -> Reply:
    query = query or []
    reply = http.send(
        method,
        target(path, query),
        signed(version, method, host, path, query, body, **kw),  # type: ignore[arg-type]
        body,
    )
    assert reply.status == 200, reply.body
    return reply


def _snapshot(http: RawConnection, host: str) -> tuple[bytes, bytes, bytes]:
    """What an attack on `host` could change: its logstores, and every group in shard 0."""
    logstores = _ok(http, "v4", "GET", host, "/logstores").body
    cursor = _ok(http, "v4", "GET", host, PUT_PATH, [("type", "cursor"), ("from", "begin")])
    pulled = _ok(
        http,
        "v4",
        "GET",
        host,
        PUT_PATH,
        [("type", "log"), ("cursor", cursor.json()["cursor"]), ("count", "1000")],
        extra={"accept-encoding": "lz4"},
    )
    return logstores, pulled.body, pulled.headers["x-log-count"].encode()


@pytest.fixture(scope="module")
def http(signed_server: ServerProcess) -> Iterator[RawConnection]:
    with RawConnection(signed_server.port) as connection:
        for host in (ALPHA, BRAVO):
            project = host.split(".")[0]
            body = json.dumps({"projectName": project}).encode()
            _ok(connection, "v4", "POST", host, "/", body=body)
            for name in ("store", "gone"):
                body = json.dumps({"logstoreName": name, "shardCount": 1, "ttl": 7}).encode()
                _ok(connection, "v4", "POST", host, "/logstores", body=body)
            _ok(connection, "v4", "POST", host, PUT_PATH, body=_group(f"{project}-original"))
        yield connection


# Each attack: (version, http) -> the reply to one forged request aimed at bravo.
Attack = Callable[[Version, RawConnection], Reply]


def _put(version: Version, **kw: object) -> tuple[Headers, bytes]:
    body = _group("forged")
    return signed(version, "POST", BRAVO, PUT_PATH, [], body, **kw), body  # type: ignore[arg-type]


def _wrong_key_id(version: Version, http: RawConnection) -> Reply:
    headers, body = _put(version, key_id="nobody")
    return http.send("POST", PUT_PATH, headers, body)


def _wrong_secret(version: Version, http: RawConnection) -> Reply:
    headers, body = _put(version, secret="not-the-secret")
    return http.send("POST", PUT_PATH, headers, body)


def _tampered_body_keeping_digest(version: Version, http: RawConnection) -> Reply:
    headers, _ = _put(version)
    return http.send("POST", PUT_PATH, headers, _group("tampered"))


def _tampered_body_without_digest(version: Version, http: RawConnection) -> Reply:
    headers, _ = _put(version)
    digest = "content-md5" if version != "v4" else "x-log-content-sha256"
    return http.send("POST", PUT_PATH, replace_header(headers, digest, None), _group("tampered"))


def _tampered_body_with_new_digest(version: Version, http: RawConnection) -> Reply:
    import hashlib

    headers, _ = _put(version)
    body = _group("tampered")
    if version != "v4":
        headers = replace_header(headers, "content-md5", hashlib.md5(body).hexdigest().upper())
    else:
        headers = replace_header(headers, "x-log-content-sha256", hashlib.sha256(body).hexdigest())
    return http.send("POST", PUT_PATH, headers, body)


def _tampered_query(version: Version, http: RawConnection) -> Reply:
    # signed as a harmless read of the logstores; sent as a delete of "gone" by the query
    query = [("offset", "0"), ("size", "10")]
    headers = signed(version, "GET", BRAVO, "/logstores", query)
    return http.send("GET", target("/logstores", [("offset", "0"), ("size", "1")]), headers)


def _tampered_method_and_path(version: Version, http: RawConnection) -> Reply:
    headers = signed(version, "GET", BRAVO, "/logstores/gone", [])
    return http.send("DELETE", "/logstores/gone", headers)


def _date_header(version: Version) -> str:
    return "date" if version != "v4" else "x-log-date"


def _without_date(version: Version, http: RawConnection) -> Reply:
    headers, body = _put(version)
    headers = replace_header(replace_header(headers, "date", None), "x-log-date", None)
    return http.send("POST", PUT_PATH, headers, body)


def _unparsable_date(version: Version, http: RawConnection) -> Reply:
    headers, body = _put(version)
    headers = replace_header(headers, _date_header(version), "yesterday, around noon")
    return http.send("POST", PUT_PATH, headers, body)


def _date_in_year_99999999999(version: Version, http: RawConnection) -> Reply:
    headers, body = _put(version)
    date = "Mon, 01 Jan 99999999999 00:00:00 GMT" if version != "v4" else "99999999999T000000Z"
    headers = replace_header(headers, _date_header(version), date)
    if version != "v4":
        headers = replace_header(headers, "x-log-date", date)
    return http.send("POST", PUT_PATH, headers, body)


def _skew(seconds: float) -> Attack:
    def attack(version: Version, http: RawConnection) -> Reply:
        headers, body = _put(version, now_s=time.time() + seconds)
        return http.send("POST", PUT_PATH, headers, body)

    attack.__name__ = f"_skew_{seconds:+.0f}s"
    return attack


def _replay_to_another_project(version: Version, http: RawConnection) -> Reply:
    # a valid delete of alpha's "gone", captured and sent again with bravo's Host
    headers = signed(version, "DELETE", ALPHA, "/logstores/gone", [])
    assert http.send("DELETE", "/logstores/gone", headers).status == 200
    replayed = replace_header(headers, "host", BRAVO)
    reply = http.send("DELETE", "/logstores/gone", replayed)
    # alpha's "gone" comes back for the next attack
    body = json.dumps({"logstoreName": "gone", "shardCount": 1, "ttl": 7}).encode()
    _ok(http, "v4", "POST", ALPHA, "/logstores", body=body)
    return reply


def _replay_write_to_another_project(version: Version, http: RawConnection) -> Reply:
    body = _group("alpha-write")
    headers = signed(version, "POST", ALPHA, PUT_PATH, [], body)
    assert http.send("POST", PUT_PATH, headers, body).status == 200
    return http.send("POST", PUT_PATH, replace_header(headers, "host", BRAVO), body)


def _replay_to_another_path(version: Version, http: RawConnection) -> Reply:
    body = _group("alpha-write-2")
    headers = signed(version, "POST", ALPHA, PUT_PATH, [], body)
    assert http.send("POST", PUT_PATH, headers, body).status == 200
    return http.send("POST", "/logstores/gone/shards/0", headers, body)


def _relabelled_signature_method(version: Version, http: RawConnection) -> Reply:
    """The other v1 hash function named over the same signature (v4 sends no method: one
    is added, and v4 signs it)."""
    headers, body = _put(version)
    other = "hmac-sha1" if version == "v1-sha256" else "hmac-sha256"
    return http.send(
        "POST", PUT_PATH, replace_header(headers, "x-log-signaturemethod", other), body
    )


def _unknown_signature_method(version: Version, http: RawConnection) -> Reply:
    headers, body = _put(version)
    return http.send(
        "POST", PUT_PATH, replace_header(headers, "x-log-signaturemethod", "hmac-md5"), body
    )


def _dropped_signature_method(version: Version, http: RawConnection) -> Reply:
    """Without the header v1 means hmac-sha1: a SHA-256 signature must not pass as one."""
    headers, body = _put(version)
    if version == "v1-sha256":
        headers = replace_header(headers, "x-log-signaturemethod", None)
    else:
        headers = replace_header(headers, "x-log-signaturemethod", "")
    return http.send("POST", PUT_PATH, headers, body)


def _duplicate_host(first: bool, method: str) -> Attack:
    """Signed for alpha, with bravo's Host added before or after alpha's."""

    def attack(version: Version, http: RawConnection) -> Reply:
        if method == "DELETE":
            headers, body = signed(version, "DELETE", ALPHA, "/logstores/gone", []), b""
            path = "/logstores/gone"
        else:
            body = _group("smuggled")
            headers, path = signed(version, "POST", ALPHA, PUT_PATH, [], body), PUT_PATH
        extra = ("Host", BRAVO)
        return http.send(method, path, [extra, *headers] if first else [*headers, extra], body)

    attack.__name__ = f"_duplicate_host_{'first' if first else 'last'}_{method}"
    return attack


ATTACKS: list[Attack] = [
    _wrong_key_id,
    _wrong_secret,
    _tampered_body_keeping_digest,
    _tampered_body_without_digest,
    _tampered_body_with_new_digest,
    _tampered_query,
    _tampered_method_and_path,
    _without_date,
    _unparsable_date,
    _date_in_year_99999999999,
    _skew(16 * 60),
    _skew(-16 * 60),
    _skew(10**9),
    _replay_to_another_project,
    _replay_write_to_another_project,
    _replay_to_another_path,
    _relabelled_signature_method,
    _unknown_signature_method,
    _dropped_signature_method,
    _duplicate_host(True, "DELETE"),
    _duplicate_host(False, "DELETE"),
    _duplicate_host(True, "POST"),
    _duplicate_host(False, "POST"),
]


def test_forged_tampered_and_replayed_requests_are_all_refused(http: RawConnection) -> None:
    before = _snapshot(http, BRAVO)
    accepted: list[str] = []
    for version in VERSIONS:
        for attack in ATTACKS:
            reply = attack(version, http)
            name = f"{version} {attack.__name__}"
            if reply.status < 300:
                accepted.append(name)
            assert 400 <= reply.status < 500 or reply.status == 503, (name, reply.body)
            assert reply.error_code() is not None, (name, reply.body)
            if "duplicate_host" in name:
                assert reply.status == 400, (name, reply.body)
            elif name.startswith("v1") and "_replay" in name and "another_project" in name:
                assert reply.status == 503, (name, reply.body)
                assert reply.error_code() == "SignatureReused"
            elif "replay_to_another_path" not in name:
                assert reply.status == 401, (name, reply.body)
    print(f"attacks sent: {len(VERSIONS) * len(ATTACKS)}, accepted: {len(accepted)}")
    assert accepted == []
    assert _snapshot(http, BRAVO) == before


def test_a_v1_signature_sent_to_two_projects_is_refused_until_signed_again(
    http: RawConnection,
) -> None:
    """Identical v1 requests to two projects in one second have one signature (v1 does not
    sign Host): the second is refused with a status the SDK retries, and passes re-signed."""
    query = [("offset", "0"), ("size", "100")]
    for version in ("v1", "v1-sha256"):
        now_s = time.time()
        first = signed(version, "GET", ALPHA, "/logstores", query, now_s=now_s)
        assert http.send("GET", target("/logstores", query), first).status == 200
        second = signed(version, "GET", BRAVO, "/logstores", query, now_s=now_s)
        refused = http.send("GET", target("/logstores", query), second)
        assert (refused.status, refused.error_code()) == (503, "SignatureReused"), version
        assert refused.headers["retry-after"] == "1"
        again = signed(version, "GET", BRAVO, "/logstores", query, now_s=now_s + 1)
        assert http.send("GET", target("/logstores", query), again).status == 200


def test_a_v1_signature_that_names_its_project_is_bound_to_it(http: RawConnection) -> None:
    """LogHub's own client signs an ``x-log-project`` header in v1: identical requests to two
    projects in one second then differ, and the header cannot be moved to another Host."""
    now_s = time.time()
    query = [("offset", "0"), ("size", "100")]
    for host, project in ((ALPHA, "alpha"), (BRAVO, "bravo")):
        headers = signed(
            "v1", "GET", host, "/logstores", query, now_s=now_s, extra={"x-log-project": project}
        )
        assert http.send("GET", target("/logstores", query), headers).status == 200
    for version in VERSIONS:
        body = _group("named")
        headers = signed(
            version, "POST", ALPHA, PUT_PATH, [], body, extra={"x-log-project": "alpha"}
        )
        moved = http.send("POST", PUT_PATH, replace_header(headers, "host", BRAVO), body)
        assert moved.status == 401, (version, moved.body)
        lying = signed(version, "POST", ALPHA, PUT_PATH, [], body, extra={"x-log-project": "bravo"})
        refused = http.send("POST", PUT_PATH, lying, body)
        assert refused.status == 401, (version, refused.body)


def test_a_date_in_year_99999999999_is_an_auth_error_not_a_500(http: RawConnection) -> None:
    for version in VERSIONS:
        reply = _date_in_year_99999999999(version, http)
        assert (reply.status, reply.error_code()) == (401, "Unauthorized"), reply.body


@pytest.mark.parametrize(
    "name",
    ["Content-MD5", "x-log-date", "Date", "Authorization", "Content-Type", "x-log-bodyrawsize"],
)
def test_a_second_copy_of_a_signed_header_is_refused(http: RawConnection, name: str) -> None:
    for version in VERSIONS:
        body = _group("copy")
        headers = signed(version, "POST", ALPHA, PUT_PATH, [], body)
        present = {n.lower(): v for n, v in headers}
        # a copy of the signed value, or two copies where this version sends none
        copies = [(name, present[name.lower()])] if name.lower() in present else [(name, "x")] * 2
        reply = http.send("POST", PUT_PATH, [*headers, *copies], body)
        assert (reply.status, reply.error_code()) == (400, "ParameterInvalid"), reply.body


def test_a_repeated_query_parameter_is_refused(http: RawConnection) -> None:
    query = [("type", "cursor"), ("from", "begin")]
    headers = signed("v4", "GET", ALPHA, PUT_PATH, [*query, ("from", "end")])
    reply = http.send("GET", target(PUT_PATH, [*query, ("from", "end")]), headers)
    assert (reply.status, reply.error_code()) == (400, "ParameterInvalid"), reply.body


# -- keys limited to projects --------------------------------------------------------------

SECRETS = {
    "admin": "admin-secret-3b1f0c",
    "alpha-writer": "alpha-writer-secret-9d2e47",
    "alpha-reader": "alpha-reader-secret-51c8aa",
}


@pytest.fixture(scope="module")
def scoped_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base: Path = tmp_path_factory.mktemp("scoped")
    keys_file = base / "keys.json"
    keys_file.write_text(
        json.dumps(
            {
                "admin": SECRETS["admin"],  # the old form: every project, read and write
                "alpha-writer": {"secret": SECRETS["alpha-writer"], "projects": ["alpha"]},
                "alpha-reader": {
                    "secret": SECRETS["alpha-reader"],
                    "projects": ["alpha"],
                    "access": "read",
                },
            }
        )
    )
    server = ServerProcess(base / "data", extra_args=("--keys-file", str(keys_file))).start()
    try:
        yield server
    finally:
        server.stop()


def _as(key_id: str, version: Version = "v1") -> dict[str, object]:
    return {"key_id": key_id, "secret": SECRETS[key_id]}


def _call(
    http: RawConnection,
    key_id: str,
    method: str,
    host: str,
    path: str,
    query: list[tuple[str, str]] | None = None,
    body: bytes = b"",
    version: Version = "v1",
) -> Reply:
    query = query or []
    headers = signed(version, method, host, path, query, body, **_as(key_id))  # type: ignore[arg-type]
    return http.send(method, target(path, query), headers, body)


def test_keys_reach_only_their_projects_and_read_keys_only_read(
    scoped_server: ServerProcess,
) -> None:
    with RawConnection(scoped_server.port) as http:
        store = json.dumps({"logstoreName": "store", "shardCount": 1, "ttl": 7}).encode()
        for host in (ALPHA, BRAVO):
            project = json.dumps({"projectName": host.split(".")[0]}).encode()
            reply = _call(http, "admin", "POST", host, "/", body=project, version="v4")
            assert reply.status == 200, reply.body
            reply = _call(http, "admin", "POST", host, "/logstores", body=store, version="v4")
            assert reply.status == 200, reply.body

        def refused(reply: Reply) -> None:
            assert (reply.status, reply.error_code()) == (401, "Unauthorized"), reply.body

        for version in VERSIONS:
            # the writer: everything in alpha, nothing in bravo
            reply = _call(
                http, "alpha-writer", "POST", ALPHA, PUT_PATH, body=_group("w"), version=version
            )
            assert reply.status == 200, reply.body
            refused(_call(http, "alpha-writer", "GET", BRAVO, "/logstores", version=version))
            refused(
                _call(
                    http, "alpha-writer", "POST", BRAVO, PUT_PATH, body=_group("x"), version=version
                )
            )
            refused(
                _call(http, "alpha-writer", "DELETE", BRAVO, "/logstores/store", version=version)
            )
            # the reader: reads and consumes alpha, writes nothing, sees nothing of bravo
            assert (
                _call(http, "alpha-reader", "GET", ALPHA, "/logstores", version=version).status
                == 200
            )
            refused(
                _call(
                    http, "alpha-reader", "POST", ALPHA, PUT_PATH, body=_group("r"), version=version
                )
            )
            refused(
                _call(http, "alpha-reader", "DELETE", ALPHA, "/logstores/store", version=version)
            )
            refused(_call(http, "alpha-reader", "GET", BRAVO, "/logstores", version=version))
            refused(
                _call(
                    http,
                    "alpha-reader",
                    "POST",
                    "charlie.127.0.0.1",
                    "/",
                    body=b'{"projectName": "charlie"}',
                    version=version,
                )
            )
            # CreateProject at the bare endpoint (the name in the body): the same grants
            for key_id in ("alpha-reader", "alpha-writer"):
                refused(
                    _call(
                        http,
                        key_id,
                        "POST",
                        "127.0.0.1",
                        "/",
                        body=b'{"projectName": "charlie"}',
                        version=version,
                    )
                )

        group = json.dumps({"consumerGroup": "cg", "timeout": 4.0, "order": False}).encode()
        groups = "/logstores/store/consumergroups"
        assert _call(http, "alpha-reader", "POST", ALPHA, groups, body=group).status == 200
        heartbeat = _call(
            http,
            "alpha-reader",
            "POST",
            ALPHA,
            groups + "/cg",
            [("type", "heartbeat"), ("consumer", "c1")],
            b"[]",
        )
        assert heartbeat.status == 200, heartbeat.body
        refused(_call(http, "alpha-reader", "DELETE", ALPHA, groups + "/cg"))

        # listing projects: each key sees what it may reach
        def names(key_id: str) -> list[str]:
            reply = _call(http, key_id, "GET", "127.0.0.1", "/")
            assert reply.status == 200, reply.body
            return sorted(p["projectName"] for p in reply.json()["projects"])

        assert names("admin") == ["alpha", "bravo"]
        assert names("alpha-reader") == ["alpha"]
        assert names("alpha-writer") == ["alpha"]

        # bravo was never written by the limited keys
        pulled = _call(http, "admin", "GET", BRAVO, PUT_PATH, [("type", "cursor"), ("from", "end")])
        assert pulled.json()["cursor"] == base64.b64encode(b"0").decode()


def test_metrics_need_a_key_when_keys_are_set_and_health_does_not(
    scoped_server: ServerProcess,
) -> None:
    with RawConnection(scoped_server.port) as http:
        assert http.send("GET", "/health", [("Host", "127.0.0.1")]).status == 200
        anonymous = http.send("GET", "/metrics", [("Host", "127.0.0.1")])
        assert (anonymous.status, anonymous.error_code()) == (401, "Unauthorized")
        basic = base64.b64encode(f"admin:{SECRETS['admin']}".encode()).decode()
        good = http.send(
            "GET", "/metrics", [("Host", "127.0.0.1"), ("Authorization", f"Basic {basic}")]
        )
        assert good.status == 200 and b"loghub_" in good.body
        wrong = base64.b64encode(b"admin:guess").decode()
        reply = http.send(
            "GET", "/metrics", [("Host", "127.0.0.1"), ("Authorization", f"Basic {wrong}")]
        )
        assert reply.status == 401
        assert _call(http, "alpha-reader", "GET", "127.0.0.1", "/metrics").status == 200
    log = scoped_server.log_path.read_text(errors="replace")
    for secret in SECRETS.values():
        assert secret not in log


@pytest.fixture(scope="module")
def unbound_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("unbound") / "data",
        keys={"ak": "sk"},
        extra_args=("--no-v1-project-binding",),
    ).start()
    try:
        yield server
    finally:
        server.stop()


def test_without_the_v1_binding_the_same_call_to_two_projects_passes(
    unbound_server: ServerProcess,
) -> None:
    """The switch for v1 clients that do not retry a 503, on servers reached over TLS: two
    projects, the same call in the same second, from two connections."""
    now_s = time.time()
    query = [("offset", "0"), ("size", "10")]
    for host in (ALPHA, BRAVO):
        with RawConnection(unbound_server.port) as connection:
            body = json.dumps({"projectName": host.split(".")[0], "description": ""}).encode()
            created = connection.send("POST", "/", signed("v4", "POST", host, "/", [], body), body)
            assert created.status == 200, created.body
            headers = signed("v1", "GET", host, "/logstores", query, now_s=now_s)
            reply = connection.send("GET", target("/logstores", query), headers)
            assert reply.status == 200, reply.body
