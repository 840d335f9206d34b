"""The OpenAPI-generation SDK `alibabacloud-sls20201230`, unmodified, against a real keyed
`loghub serve`, in both of its signature versions.

In its default mode (v1) this SDK signs with HMAC-SHA256 and says so in
``x-log-signaturemethod: hmac-sha256``; with ``signature_version="v4"`` it signs as the
classic SDK's v4 does. It creates projects at the bare endpoint (``POST /`` with the name in
the body) and addresses every other call to ``<project>.<endpoint>``.

How it reaches the server: ``endpoint="127.0.0.1:PORT"`` with ``protocol="http"`` (its
default is https), and ``HTTP_PROXY`` pointing at the server (the ``sdk_proxy_env`` fixture):
the SDK's transport (requests) honours HTTP_PROXY, so ``<project>.127.0.0.1:PORT``, a name
that does not resolve here, goes to the server as an absolute-form request target and the
project travels in ``Host``, as against the hosted service. Logs it writes are read back
with the classic Python SDK, every field compared.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from alibabacloud_sls20201230 import models
from alibabacloud_sls20201230.client import Client
from alibabacloud_tea_openapi.models import Config
from aliyun.log import LogClient
from server_process import ServerProcess
from Tea.exceptions import TeaException

pytestmark = pytest.mark.usefixtures("sdk_proxy_env")

VERSIONS = ("v1", "v4")
LOGSTORE = "openapi-store"
HALF_KEY = "8" + "0" * 31  # the boundary of two shards


def _client(server: ServerProcess, version: str, secret: str = "sk") -> Client:
    config = Config(
        access_key_id="ak",
        access_key_secret=secret,
        endpoint=server.endpoint,
        protocol="http",
        region_id="cn-local",
        signature_version=version,
    )
    return Client(config)


def _project(version: str) -> str:
    return f"openapi-{version}"


@pytest.fixture(scope="module", params=VERSIONS)
def project(signed_server: ServerProcess, request: pytest.FixtureRequest) -> Iterator[str]:
    """A project with a two-shard logstore, made by the SDK itself (at the bare endpoint)."""
    version: str = request.param
    sdk = _client(signed_server, version)
    name = _project(version)
    sdk.create_project(models.CreateProjectRequest(project_name=name, description="openapi"))
    sdk.create_log_store(
        name, models.CreateLogStoreRequest(logstore_name=LOGSTORE, ttl=7, shard_count=2)
    )
    yield name


def _sdk(server: ServerProcess, project: str) -> Client:
    return _client(server, project.rsplit("-", 1)[1])


def _error(call: object) -> TeaException:
    with pytest.raises(TeaException) as raised:
        call()  # type: ignore[operator]
    return raised.value


def test_project_and_logstore_crud(signed_server: ServerProcess, project: str) -> None:
    sdk = _sdk(signed_server, project)
    got = sdk.get_project(project, models.GetProjectRequest()).body
    assert (got.project_name, got.description, got.status) == (project, "openapi", "Normal")
    # offset and size make this GET / differ from GetProject's in a v1 signature (v1 does
    # not sign Host): see the replay rule in docs/protocol.md
    listed = sdk.list_project(models.ListProjectRequest(offset=0, size=100)).body
    assert project in [p.project_name for p in listed.projects]
    error = _error(lambda: sdk.create_project(models.CreateProjectRequest(project_name=project)))
    assert (error.code, error.statusCode) == ("ProjectAlreadyExist", 400)

    store = sdk.get_log_store(project, LOGSTORE).body
    assert (store.logstore_name, store.ttl, store.shard_count) == (LOGSTORE, 7, 2)
    other = "openapi-other"
    sdk.create_log_store(
        project, models.CreateLogStoreRequest(logstore_name=other, ttl=3, shard_count=1)
    )
    sdk.update_log_store(
        project, other, models.UpdateLogStoreRequest(logstore_name=other, ttl=30, shard_count=1)
    )
    assert sdk.get_log_store(project, other).body.ttl == 30
    names = sdk.list_log_stores(project, models.ListLogStoresRequest()).body.logstores
    assert sorted(names) == sorted([LOGSTORE, other])
    sdk.delete_log_store(project, other)
    error = _error(lambda: sdk.get_log_store(project, other))
    assert (error.code, error.statusCode) == ("LogStoreNotExist", 404)

    scratch = f"{project}-scratch"
    sdk.create_project(models.CreateProjectRequest(project_name=scratch, description="x"))
    sdk.delete_project(scratch, models.DeleteProjectRequest())
    # v1 does not sign Host, so GetProject of two projects in one second carries one
    # signature, which the server binds to the first project (docs/protocol.md); the next
    # second gives a new one
    _next_second()
    error = _error(lambda: sdk.get_project(scratch, models.GetProjectRequest()))
    assert (error.code, error.statusCode) == ("ProjectNotExist", 404)


def _next_second() -> None:
    time.sleep(1.05 - time.time() % 1)


def test_shards_split_and_cursors(signed_server: ServerProcess, project: str) -> None:
    sdk = _sdk(signed_server, project)
    store = "openapi-shards"
    sdk.create_log_store(
        project, models.CreateLogStoreRequest(logstore_name=store, ttl=7, shard_count=1)
    )
    shards = sdk.list_shards(project, store).body
    assert [(s.shard_id, s.status) for s in shards] == [(0, "readwrite")]
    split = sdk.split_shard(project, store, "0", models.SplitShardRequest(key=HALF_KEY)).body
    assert sorted((s.shard_id, s.status) for s in split) == [
        (0, "readonly"),
        (1, "readwrite"),
        (2, "readwrite"),
    ]
    shards = sdk.list_shards(project, store).body
    assert {s.shard_id: s.exclusive_end_key for s in shards}[1] == HALF_KEY

    begin = sdk.get_cursor(project, store, "1", models.GetCursorRequest(from_="begin")).body
    end = sdk.get_cursor(project, store, "1", models.GetCursorRequest(from_="end")).body
    assert begin.cursor == end.cursor == "MA=="
    future_s = str(int(time.time()) + 3600)
    at_time = sdk.get_cursor(project, store, "1", models.GetCursorRequest(from_=future_s))
    assert at_time.body.cursor == end.cursor
    cursor_time = sdk.get_cursor_time(
        project, store, "1", models.GetCursorTimeRequest(cursor=end.cursor)
    ).body.cursor_time
    assert abs(int(cursor_time) - time.time()) < 600


def test_put_logs_reads_back_through_the_python_sdk(
    signed_server: ServerProcess, project: str
) -> None:
    sdk = _sdk(signed_server, project)
    before = _end_cursors(signed_server, project)
    group = models.LogGroup(
        topic="openapi-topic",
        source="10.1.2.3",
        log_tags=[models.LogTag(key="env", value="prod"), models.LogTag(key="zone", value="z1")],
        log_items=[
            models.LogItem(
                time=1_700_000_000 + i,
                time_ns=123_456_789 + i,
                contents=[
                    models.LogContent(key="msg", value=f"{project} {i}"),
                    models.LogContent(key="unicode", value="日志 ✓"),
                ],
            )
            for i in range(3)
        ],
    )
    sdk.put_logs(project, LOGSTORE, models.PutLogsRequest(body=group))

    logs = _pull_since(signed_server, project, before)
    assert [log["msg"] for log in logs] == [f"{project} {i}" for i in range(3)]
    for i, log in enumerate(logs):
        assert log["__topic__"] == "openapi-topic"
        assert log["__source__"] == "10.1.2.3"
        assert log["__tag__:env"] == "prod"
        assert log["__tag__:zone"] == "z1"
        assert log["__time__"] == 1_700_000_000 + i
        assert log["__time_ns_part__"] == (123_456_789 + i,)  # the SDK's own trailing comma
        assert log["unicode"] == "日志 ✓"


def _python_sdk(server: ServerProcess) -> LogClient:
    return LogClient(server.endpoint, "ak", "sk")


def _end_cursors(server: ServerProcess, project: str) -> dict[int, str]:
    reader = _python_sdk(server)
    return {shard: reader.get_end_cursor(project, LOGSTORE, shard).get_cursor() for shard in (0, 1)}


def _pull_since(server: ServerProcess, project: str, cursors: dict[int, str]) -> list[dict]:  # type: ignore[type-arg]
    reader = _python_sdk(server)
    logs: list[dict] = []  # type: ignore[type-arg]
    for shard, cursor in cursors.items():
        response = reader.pull_logs(project, LOGSTORE, shard, cursor, count=1000)
        logs.extend(response.get_flatten_logs_json())
    return sorted(logs, key=lambda log: str(log["msg"]))


def test_consumer_group_life_cycle(signed_server: ServerProcess, project: str) -> None:
    sdk = _sdk(signed_server, project)
    group = "openapi-group"
    sdk.create_consumer_group(
        project,
        LOGSTORE,
        models.CreateConsumerGroupRequest(consumer_group=group, timeout=20, order=False),
    )
    error = _error(
        lambda: sdk.create_consumer_group(
            project,
            LOGSTORE,
            models.CreateConsumerGroupRequest(consumer_group=group, timeout=20, order=False),
        )
    )
    assert (error.code, error.statusCode) == ("ConsumerGroupAlreadyExist", 400)
    sdk.update_consumer_group(
        project, LOGSTORE, group, models.UpdateConsumerGroupRequest(timeout=30, order=True)
    )
    listed = sdk.list_consumer_group(project, LOGSTORE).body
    assert [(g.name, g.timeout, g.order) for g in listed] == [(group, 30, True)]

    deadline = time.monotonic() + 10
    held: list[int] = []
    while True:  # a lone consumer is given every shard
        heartbeat = models.ConsumerGroupHeartBeatRequest(consumer="c1", body=held)
        held = sdk.consumer_group_heart_beat(project, LOGSTORE, group, heartbeat).body
        assert all(isinstance(shard, int) for shard in held), held
        if sorted(held) == [0, 1]:
            break
        assert time.monotonic() < deadline, held
        time.sleep(0.2)
    cursor = _python_sdk(signed_server).get_end_cursor(project, LOGSTORE, 1).get_cursor()
    sdk.consumer_group_update_check_point(
        project,
        LOGSTORE,
        group,
        models.ConsumerGroupUpdateCheckPointRequest(
            shard=1, checkpoint=cursor, consumer="c1", force_success=False
        ),
    )
    one = sdk.get_check_point(project, LOGSTORE, group, models.GetCheckPointRequest(shard=1))
    assert [(c.shard, c.checkpoint, c.consumer) for c in one.body] == [(1, cursor, "c1")]
    every = sdk.get_check_point(project, LOGSTORE, group, models.GetCheckPointRequest())
    assert sorted(c.shard for c in every.body) == [0, 1]

    sdk.delete_consumer_group(project, LOGSTORE, group)
    error = _error(
        lambda: sdk.get_check_point(project, LOGSTORE, group, models.GetCheckPointRequest())
    )
    assert (error.code, error.statusCode) == ("ConsumerGroupNotExist", 404)


def test_queries_are_refused_as_for_a_logstore_without_an_index(
    signed_server: ServerProcess, project: str
) -> None:
    sdk = _sdk(signed_server, project)
    now_s = int(time.time())
    error = _error(
        lambda: sdk.get_logs(
            project, LOGSTORE, models.GetLogsRequest(from_=now_s - 60, to=now_s, query="*")
        )
    )
    assert (error.code, error.statusCode) == ("IndexConfigNotExist", 400)
    error = _error(
        lambda: sdk.get_histograms(
            project, LOGSTORE, models.GetHistogramsRequest(from_=now_s - 60, to=now_s)
        )
    )
    assert (error.code, error.statusCode) == ("IndexConfigNotExist", 400)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_right_secret_is_accepted_and_a_wrong_one_refused(
    signed_server: ServerProcess, version: str
) -> None:
    request = models.CreateProjectRequest(project_name=f"secret-{version}", description="d")
    wrong = _client(signed_server, version, secret="not-the-secret")
    started = time.monotonic()
    error = _error(lambda: wrong.create_project(request))
    assert (error.code, error.statusCode) == ("SignatureNotMatch", 401)
    _client(signed_server, version).create_project(request)
    error = _error(lambda: wrong.list_shards(_project(version), LOGSTORE))
    assert (error.code, error.statusCode) == ("SignatureNotMatch", 401)
    assert time.monotonic() - started < 5, "an auth error must not be retried"
