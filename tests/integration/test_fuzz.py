"""Seeded fuzzing of a real server: mutated methods, paths, queries, headers and bodies.

Every reply must be a 2xx or a 4xx in LogHub's error format, never a 5xx; no error may name
a path of the server's disk; the server must still answer /health at the end; and a
logstore written before the run (in a project the fuzzer never names) must read back
byte-identical after it. The generator is a `random.Random` seeded by `LOGHUB_SEED`
(default fixed), so a failure replays exactly: the assertion message prints the seed and the
request.

Most requests go to an anonymous server; a share goes to a signed one, signed as the SDK
signs and then (mostly) mutated, so the checks run after authentication too.
"""

from __future__ import annotations

import collections
import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote

import lz4.block
import pytest
from raw_http import Headers, RawConnection, Reply, signed
from server_process import ServerProcess

from loghub.wire.logs import make_log_group

SEED = int(os.environ.get("LOGHUB_SEED", "20261125"))
ANONYMOUS_REQUESTS = 12_000
SIGNED_REQUESTS = 1_500
PROJECT = "fuzz"
KEEP = "keep"  # never named by a fuzzed request
STORE = "fz-store"

# values that broke int() and friends, and their neighbours
NUMBERS = [
    "0",
    "1",
    "2",
    "-1",
    "--1",
    "+1",
    " 3 ",
    "1_0",
    "²",
    "①",
    "٣",
    "１",
    "0x10",
    "1e3",
    "1.5",
    "",
    " ",
    "9" * 19,
    "9" * 20,
    "9" * 5000,
    "-0",
    "00",
    "4294967296",
    "nan",
    "\u0663\u0664",
]
SHARDS = [
    "0",
    "1",
    "2",
    "lb",
    "route",
    "-1",
    "²",
    "①",
    "٣",
    "--1",
    "99999999999",
    "",
    "0x1",
    "%00",
    "..",
    "1%2F2",
]
LOGSTORES = [STORE, "nope", "a", "x" * 70, "%2E%2E", "..", "%00", "\u00e9t\u00e9", "fz_store"]
HOSTS = [
    f"{PROJECT}.127.0.0.1",
    "127.0.0.1",
    "localhost",
    "other.127.0.0.1",
    "",
    "a.b.c",
    "[::1]",
    "fuzz.127.0.0.1:80",
    "FZ.127.0.0.1",
    "-.127.0.0.1",
    "fuzz..127.0.0.1",
]
QUERY_NAMES = [
    "type",
    "from",
    "cursor",
    "end_cursor",
    "count",
    "offset",
    "size",
    "shard",
    "consumer",
    "forceSuccess",
    "action",
    "key",
    "logstoreName",
    "projectName",
    "x",
]
QUERY_VALUES = [
    *NUMBERS,
    "log",
    "cursor",
    "cursor_time",
    "heartbeat",
    "checkpoint",
    "begin",
    "end",
    "split",
    "merge",
    "MA==",
    "MTA=",
    "////",
    "true",
    "False",
    "7f" + "0" * 30,
    "zz",
    "\u0000",
    "\U0001f600",
]
HEADER_NAMES = [
    "x-log-bodyrawsize",
    "x-log-compresstype",
    "content-type",
    "accept-encoding",
    "x-log-apiversion",
    "content-md5",
    "date",
    "x-log-date",
    "authorization",
    "x-log-signaturemethod",
    "x-acs-security-token",
]
HEADER_VALUES = [
    *NUMBERS,
    "lz4",
    "zstd",
    "deflate",
    "gzip",
    "br",
    "application/json",
    "application/x-protobuf",
    "LOG ak:xx",
    "SLS4-HMAC-SHA256 Credential=x",
    "Basic YWs6c2s=",
    "Mon, 01 Jan 99999999999 00:00:00 GMT",
]


def _group(rng: random.Random) -> bytes:
    logs = [(1_700_000_000 + i, {"k": str(rng.random())}) for i in range(rng.randint(1, 5))]
    return make_log_group(logs).SerializeToString()


def _json_values(rng: random.Random) -> object:
    return rng.choice(
        [0, 1, 4.0, 4.5, -1, True, None, "²", "٣", "--1", "12", 2**70, 1e308, [], {}, "x" * 100]
    )


def _body(rng: random.Random) -> bytes:
    kind = rng.randrange(12)
    if kind == 0:
        return b""
    if kind == 1:
        return b"[" * 10_000 + b"]" * 10_000
    if kind == 2:
        return b"9" * 5000
    if kind == 3:
        return b'{"shard": ' + b"9" * 5000 + b', "checkpoint": "MA=="}'
    if kind == 4:
        return _group(rng)
    if kind == 5:
        group = _group(rng)
        return bytes(b ^ 0xFF if rng.random() < 0.05 else b for b in group)
    if kind == 6:
        return lz4.block.compress(_group(rng), store_size=False)
    if kind == 7:
        return rng.randbytes(rng.randrange(1, 200))
    if kind == 8:  # a logstore body with mutated fields
        body = {
            "logstoreName": rng.choice([*LOGSTORES, "fz-new"]),
            "ttl": _json_values(rng),
            "shardCount": rng.choice([1, 2, 4.0, "2", "²", 0, -1, 2.5, None]),
            "autoSplit": _json_values(rng),
            "maxSplitShard": _json_values(rng),
        }
        return json.dumps(body).encode()
    if kind == 9:  # a consumer group body
        body = {
            "consumerGroup": rng.choice(["cg", "", 5]),
            "timeout": _json_values(rng),
            "order": _json_values(rng),
        }
        return json.dumps(body).encode()
    if kind == 10:  # a heartbeat or checkpoint body
        if rng.random() < 0.5:
            return json.dumps([_json_values(rng) for _ in range(rng.randrange(4))]).encode()
        return json.dumps(
            {
                "shard": _json_values(rng),
                "checkpoint": rng.choice(["MA==", "", "²", 5, "MTAwMDAwMDAw"]),
            }
        ).encode()
    return b'{"a": [1, 2, {"b": NaN}]}' if rng.random() < 0.5 else b'{"a": 1e99999}'


def _path(rng: random.Random) -> str:
    if rng.random() < 0.002:
        return "/metrics"  # rarely: its exposition takes tens of milliseconds
    logstore, shard = rng.choice(LOGSTORES), rng.choice(SHARDS)
    return rng.choice(
        [
            "/",
            "/logstores",
            f"/logstores/{logstore}",
            f"/logstores/{logstore}/shards",
            f"/logstores/{logstore}/shards/{shard}",
            f"/logstores/{logstore}/consumergroups",
            f"/logstores/{logstore}/consumergroups/cg",
            f"/logstores/{logstore}/x/{shard}",
            "//logstores",
            f"/logstores/{logstore}/shards/{shard}/extra",
        ]
    )


def _query(rng: random.Random) -> list[tuple[str, str]]:
    names = rng.sample(QUERY_NAMES, rng.randrange(0, 5))
    query = [(name, rng.choice(QUERY_VALUES)) for name in names]
    if query and rng.random() < 0.05:
        query.append(query[0])  # a repeated parameter
    return query


CURSORS = ["MA==", "MQ==", "Mg==", "MTA=", "MTAwMDAwMDA=", "", "²", "LTE=", "////", "MA"]


def _api_call(rng: random.Random) -> tuple[str, str, list[tuple[str, str]], Headers, bytes]:
    """A call of the real API on the fuzzed logstore, before mutation."""
    shard = f"/logstores/{STORE}/shards/{rng.choice(['0', '1'])}"
    group = f"/logstores/{STORE}/consumergroups/cg"
    cursor = rng.choice(CURSORS)
    kind = rng.randrange(8)
    if kind == 0:
        return "GET", shard, [("type", "log"), ("cursor", cursor), ("count", "10")], [], b""
    if kind == 1:
        position = rng.choice(["begin", "end", "1700000000", "0"])
        return "GET", shard, [("type", "cursor"), ("from", position)], [], b""
    if kind == 2:
        return "GET", shard, [("type", "cursor_time"), ("cursor", cursor)], [], b""
    if kind == 3:
        headers = [("x-log-bodyrawsize", "0")]
        return "POST", shard, [], headers, _group(rng)
    if kind == 4:
        query = [("type", "heartbeat"), ("consumer", "c1")]
        return "POST", group, query, [], rng.choice([b"[]", b"[0]", b"[0, 1]"])
    if kind == 5:
        body = json.dumps({"shard": rng.choice([0, 1]), "checkpoint": cursor}).encode()
        query = [("type", "checkpoint"), ("consumer", "c1"), ("forceSuccess", "true")]
        return "POST", group, query, [], body
    if kind == 6:
        return "GET", group, [("shard", rng.choice(["0", "1", "-1"]))], [], b""
    return "GET", "/logstores", [("offset", "0"), ("size", "10")], [], b""


def _mutated_api_call(rng: random.Random) -> tuple[str, str, Headers, bytes]:
    method, path, query, headers, body = _api_call(rng)
    mutation = rng.randrange(5)
    if mutation == 0 and query:
        index = rng.randrange(len(query))
        query[index] = (query[index][0], rng.choice(QUERY_VALUES))
    elif mutation == 1:
        headers = [*headers, (rng.choice(HEADER_NAMES), rng.choice(HEADER_VALUES))]
    elif mutation == 2:
        body = _body(rng)
    elif mutation == 3 and query:
        query = query[1:]
    target = path + ("?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in query) if query else "")
    return method, target, [("Host", f"{PROJECT}.127.0.0.1"), *headers], body


def _request(rng: random.Random) -> tuple[str, str, Headers, bytes]:
    if rng.random() < 0.4:
        return _mutated_api_call(rng)
    method = rng.choice(["GET", "GET", "POST", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
    path = _path(rng)
    host = rng.choice(HOSTS)
    if method == "DELETE" and path == "/" and host.startswith(PROJECT):
        method = "GET"  # deleting the fuzzed project would leave little to fuzz
    query = _query(rng)
    target = quote(path, safe="/%") + (
        "?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in query) if query else ""
    )
    headers: Headers = [("Host", host)] if host or rng.random() < 0.5 else []
    for _ in range(rng.randrange(0, 4)):
        headers.append((rng.choice(HEADER_NAMES), rng.choice(HEADER_VALUES)))
    return method, target, headers, _body(rng)


def _mutate_signed(rng: random.Random, headers: Headers, body: bytes) -> tuple[Headers, bytes]:
    kind = rng.randrange(6)
    if kind == 0:
        return headers, body  # as signed
    if kind == 1:
        return headers, body + b" "
    if kind == 2:
        index = rng.randrange(len(headers))
        name, _ = headers[index]
        return [*headers[:index], (name, rng.choice(HEADER_VALUES)), *headers[index + 1 :]], body
    if kind == 3:
        return [*headers, rng.choice(headers)], body  # a repeated header
    if kind == 4:
        return headers[1:], body  # no Host
    return [*headers, (rng.choice(HEADER_NAMES), rng.choice(HEADER_VALUES))], body


def _setup(http: RawConnection, sign: bool) -> None:
    """The fuzzed project with a logstore, and the kept one with data; idempotent."""
    for project in (PROJECT, KEEP):
        host = f"{project}.127.0.0.1"
        steps = [
            ("POST", "/", json.dumps({"projectName": project}).encode()),
            (
                "POST",
                "/logstores",
                json.dumps({"logstoreName": STORE, "shardCount": 2, "ttl": 7}).encode(),
            ),
            (
                "POST",
                f"/logstores/{STORE}/consumergroups",
                json.dumps({"consumerGroup": "cg", "timeout": 4.0, "order": True}).encode(),
            ),
        ]
        for method, path, body in steps:
            headers = signed("v4", method, host, path, [], body) if sign else [("Host", host)]
            reply = http.send(method, path, headers, body)
            assert reply.status == 200 or reply.error_code() in (
                "ProjectAlreadyExist",
                "LogStoreAlreadyExist",
                "ConsumerGroupAlreadyExist",
            ), reply.body


def _read_kept(http: RawConnection, sign: bool) -> list[bytes]:
    host = f"{KEEP}.127.0.0.1"
    replies = []
    for shard in (0, 1):
        path = f"/logstores/{STORE}/shards/{shard}"
        query = [("type", "log"), ("cursor", "MA=="), ("count", "1000")]
        target = path + "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query)
        extra = {"accept-encoding": "lz4"}
        headers = (
            signed("v4", "GET", host, path, query, extra=extra)
            if sign
            else [("Host", host), *extra.items()]
        )
        reply = http.send("GET", target, headers)
        assert reply.status == 200, reply.body
        replies.append(reply.body + reply.headers["x-log-count"].encode())
    return replies


def _check(
    reply: Reply, request: object, data_dir: Path, statuses: collections.Counter[int]
) -> None:
    statuses[reply.status] += 1
    where = f"LOGHUB_SEED={SEED} request={request!r:.600}"
    assert reply.status < 500, (where, reply.status, reply.body[:300])
    assert str(data_dir) not in reply.body.decode("latin-1"), (where, reply.body[:300])
    if reply.status >= 400:
        parsed = json.loads(reply.body)
        assert isinstance(parsed["errorCode"], str) and isinstance(parsed["errorMessage"], str), (
            where
        )


def _run(server: ServerProcess, count: int, sign: bool) -> collections.Counter[int]:
    rng = random.Random(f"{SEED}-{sign}")
    statuses: collections.Counter[int] = collections.Counter()
    data_dir = server.data_dir.resolve()
    with RawConnection(server.port) as http:
        _setup(http, sign)
        for _ in range(3):
            body = _group(rng)
            path = f"/logstores/{STORE}/shards/lb"
            host = f"{KEEP}.127.0.0.1"
            headers = signed("v4", "POST", host, path, [], body) if sign else [("Host", host)]
            assert http.send("POST", path, headers, body).status == 200
        before = _read_kept(http, sign)
        started = time.monotonic()
        for i in range(count):
            if i % 500 == 0:
                _setup(http, sign)
            method, target, headers, body = _request(rng)
            if sign:
                path, _, raw_query = target.partition("?")
                query = parse_qsl(raw_query, keep_blank_values=True)
                host = rng.choice([h for h in HOSTS if h])
                version = rng.choice(["v1", "v4"])
                # a signed header unique to each request: no two share a v1 signature
                headers = signed(
                    version,  # type: ignore[arg-type]
                    method,
                    host,
                    unquote(path),
                    query,
                    body,
                    extra={"x-log-fuzz-request": str(i)},
                )
                headers, body = _mutate_signed(rng, headers, body)
            request = (method, target, headers, body[:200])
            _check(http.send(method, target, headers, body), request, data_dir, statuses)
        elapsed_s = time.monotonic() - started
        alive = http.send("GET", "/health", [("Host", "127.0.0.1")])
        assert alive.status == 200 and alive.json()["pid"] == server.pid
        assert _read_kept(http, sign) == before
    print(
        f"\nfuzz {'signed' if sign else 'anonymous'}: {count} requests in {elapsed_s:.1f} s,"
        f" statuses {dict(sorted(statuses.items()))}"
    )
    return statuses


@pytest.fixture(scope="module")
def anonymous_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("fuzz") / "data").start()
    try:
        yield server
    finally:
        server.stop()


def test_fuzzed_requests_get_no_5xx_and_change_no_stored_data(
    anonymous_server: ServerProcess,
) -> None:
    statuses = _run(anonymous_server, ANONYMOUS_REQUESTS, sign=False)
    assert sum(statuses.values()) == ANONYMOUS_REQUESTS
    assert statuses[200] > 0  # the fuzzer reaches past the front door


def test_fuzzed_signed_requests_get_no_5xx(signed_server: ServerProcess) -> None:
    statuses = _run(signed_server, SIGNED_REQUESTS, sign=True)
    assert sum(statuses.values()) == SIGNED_REQUESTS


# -- cases the fuzzer finds, one by one: each was a 500 or accepted before -----------------

HOST = [("Host", f"{PROJECT}.127.0.0.1")]
SHARD = f"/logstores/{STORE}/shards/0"
GROUP = f"/logstores/{STORE}/consumergroups/cg"


@pytest.mark.parametrize(
    ("method", "target", "headers", "body", "code"),
    [
        ("GET", f"{SHARD}?type=cursor&from=%D9%A3", [], b"", "ParameterInvalid"),  # ٣ (read as 3)
        ("GET", "/logstores?offset=--1", [], b"", "ParameterInvalid"),
        ("GET", "/logstores?size=%E2%91%A0", [], b"", "ParameterInvalid"),  # ①
        ("GET", f"{GROUP}?shard=%C2%B2", [], b"", "ParameterInvalid"),
        (
            "GET",
            f"/logstores/{STORE}/shards/%C2%B2?type=cursor&from=begin",
            [],
            b"",
            "ShardNotExist",
        ),
        (  # was ignored, and the group stored
            "POST",
            SHARD,
            [("x-log-bodyrawsize", "²")],
            make_log_group([(1_700_000_000, {"k": "v"})]).SerializeToString(),
            "PostBodyInvalid",
        ),
        ("POST", "/logstores", [], b"[" * 10_000 + b"]" * 10_000, "PostBodyInvalid"),
        ("PUT", f"/logstores/{STORE}", [], b'{"ttl": "\xc2\xb2"}', "LogStoreInfoInvalid"),
        ("PUT", f"/logstores/{STORE}", [], b'{"ttl": "--1"}', "LogStoreInfoInvalid"),
    ],
)
def test_unicode_digits_double_minus_and_deep_json_are_4xx(
    anonymous_server: ServerProcess,
    method: str,
    target: str,
    headers: Headers,
    body: bytes,
    code: str,
) -> None:
    with RawConnection(anonymous_server.port) as http:
        _setup(http, sign=False)
        reply = http.send(method, target, [*HOST, *headers], body)
    assert 400 <= reply.status < 500 and reply.error_code() == code, reply.body


def test_integral_float_timeouts_and_empty_optional_parameters_are_accepted(
    anonymous_server: ServerProcess,
) -> None:
    with RawConnection(anonymous_server.port) as http:
        _setup(http, sign=False)
        body = json.dumps({"consumerGroup": "sdk-like", "timeout": 4.0, "order": False})
        reply = http.send("POST", f"/logstores/{STORE}/consumergroups", HOST, body.encode())
        assert reply.status == 200, reply.body
        fractional = json.dumps({"timeout": 2.5}).encode()
        reply = http.send("PUT", f"/logstores/{STORE}/consumergroups/sdk-like", HOST, fractional)
        assert reply.status == 200, reply.body
        groups = http.send("GET", f"/logstores/{STORE}/consumergroups", HOST).json()
        assert {g["name"]: g["timeout"] for g in groups}["sdk-like"] == 3
        # an empty optional parameter is the parameter left out
        assert http.send("GET", "/logstores?offset=&size=", HOST).status == 200
        pull = f"{SHARD}?type=log&cursor=MA%3D%3D&count=&end_cursor="
        assert http.send("GET", pull, HOST).status == 200
        assert http.send("GET", f"{GROUP}?shard=", HOST).status == 200


def test_an_error_names_no_path_of_the_data_directory(anonymous_server: ServerProcess) -> None:
    """A cursor past the end is refused by storage; the reply names the shard by logstore and
    id, never by its directory (storage names shards so, and the HTTP layer cuts any path
    under the data directory that a lower layer might still put in a message)."""
    with RawConnection(anonymous_server.port) as http:
        _setup(http, sign=False)
        reply = http.send("GET", f"{SHARD}?type=log&cursor=MTAwMDAwMDA%3D&count=10", HOST)
    assert (reply.status, reply.error_code()) == (400, "InvalidCursor"), reply.body
    body = reply.body.decode()
    assert str(anonymous_server.data_dir.resolve()) not in body
    assert "/shards/" not in body
    assert "shard 0 of logstore fz-store" in body
