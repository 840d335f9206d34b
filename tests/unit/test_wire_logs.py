"""Log groups: the SDK's bytes parse with our schema, framed groups are a LogGroupList, and
bodies that are not complete log groups are PostBodyInvalid."""

from __future__ import annotations

import pytest
from aliyun.log.proto import LogGroupList as SdkLogGroupList
from aliyun.log.proto import LogGroupRaw as SdkLogGroup
from aliyun.log.pulllog_response import PullLogResponse
from hypothesis import given
from hypothesis import strategies as st

from loghub.errors import PostBodyInvalid
from loghub.wire.logs import (
    frame_log_group,
    log_group_to_dict,
    make_log_group,
    parse_log_group,
    parse_log_group_list,
    parse_pulled_log_group_list,
)


def sdk_log_group(value: bytes = b"hello lz4 0") -> bytes:
    """A LogGroup built the way LogClient.put_logs builds one (values as bytes)."""
    group = SdkLogGroup()
    group.Topic = "cap-topic"
    group.Source = "10.0.0.9"
    for i in range(2):
        log = group.Logs.add()
        log.Time = 1700000000 + i
        log.Time_ns = 123456789
        for key, content_value in [("msg", value), ("level", b"INFO")]:
            content = log.Contents.add()
            content.Key = key
            content.Value = content_value
    tag = group.LogTags.add()
    tag.Key = "env"
    tag.Value = "capture"
    return bytes(group.SerializeToString())


def test_sdk_log_group_parses_with_our_schema() -> None:
    group = parse_log_group(sdk_log_group())
    assert log_group_to_dict(group) == {
        "topic": "cap-topic",
        "source": "10.0.0.9",
        "tags": {"env": "capture"},
        "logs": [
            {
                "time": 1700000000 + i,
                "time_ns": 123456789,
                "contents": {"msg": "hello lz4 0", "level": "INFO"},
            }
            for i in range(2)
        ],
    }
    assert group.SerializeToString() == sdk_log_group()


def test_non_utf8_value_is_accepted_and_kept() -> None:
    raw = sdk_log_group(value=b"\xff\xfebinary")
    group = parse_log_group(raw)
    assert group.SerializeToString() == raw
    assert log_group_to_dict(group)["logs"][0]["contents"]["msg"] == "\ufffd\ufffdbinary"


def test_make_log_group_builds_what_the_sdk_reads() -> None:
    group = make_log_group(
        [(1700000000, {"msg": "héllo", "level": "INFO"}), (1700000001, {})],
        topic="t",
        source="s",
        tags={"env": "test"},
    )
    sdk = SdkLogGroup.FromString(group.SerializeToString())
    assert (sdk.Topic, sdk.Source) == ("t", "s")
    assert [(c.Key, c.Value) for c in sdk.Logs[0].Contents] == [
        ("msg", "héllo".encode()),
        ("level", b"INFO"),
    ]
    assert [log.Time for log in sdk.Logs] == [1700000000, 1700000001]
    assert [(t.Key, t.Value) for t in sdk.LogTags] == [("env", "test")]


def test_framed_groups_concatenate_into_a_log_group_list() -> None:
    groups = [
        sdk_log_group(),
        make_log_group([(1, {"k": "v" * 300})]).SerializeToString(),  # a 2-byte varint length
        b"",  # an empty LogGroup is a valid one
    ]
    body = b"".join(frame_log_group(raw) for raw in groups)
    parsed = parse_log_group_list(body)
    assert [g.SerializeToString() for g in parsed.LogGroups] == groups
    sdk = SdkLogGroupList.FromString(body)
    assert [g.SerializeToString() for g in sdk.LogGroups] == groups


def test_sdk_pull_response_reads_framed_groups() -> None:
    body = b"".join(frame_log_group(sdk_log_group()) for _ in range(3))
    header = {"x-log-count": "3", "x-log-bodyrawsize": str(len(body)), "x-log-cursor": "Mw=="}
    response = PullLogResponse(body, header)
    logs = response.get_flatten_logs_json()
    assert len(logs) == 6
    assert logs[0]["msg"] == "hello lz4 0"
    assert logs[0]["__topic__"] == "cap-topic"
    assert logs[0]["__tag__:env"] == "capture"


def test_frame_of_a_long_group_uses_a_multi_byte_varint() -> None:
    raw = make_log_group([(1, {"k": "v" * 20000})]).SerializeToString()
    framed = frame_log_group(raw)
    assert framed[0] == 0x0A
    assert framed.endswith(raw)
    assert len(framed) == len(raw) + 1 + 3  # 20 000 and a bit needs three 7-bit groups


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff",
        b"\x0a\x05abc",  # length past the end
        b"\x0a\x00",  # a Log without its required Time
        b"\x0a\x06\x08\x01\x12\x02\x0a\x00",  # a Content without its required Value
        b"\x32\x03\x0a\x01k",  # a LogTag without Value
    ],
)
def test_malformed_log_group_is_post_body_invalid(raw: bytes) -> None:
    with pytest.raises(PostBodyInvalid):
        parse_log_group(raw)


def test_malformed_log_group_list_is_post_body_invalid() -> None:
    with pytest.raises(PostBodyInvalid):
        parse_log_group_list(frame_log_group(b"\x0a\x00"))


def test_a_pulled_list_decodes_the_same_groups_without_the_required_field_walk() -> None:
    body = b"".join(frame_log_group(sdk_log_group()) for _ in range(3))
    pulled = parse_pulled_log_group_list(body)
    assert pulled == parse_log_group_list(body)
    # the walk is skipped (the server checked every group when it was written): a group
    # lacking a required field reads with its default instead of failing the whole reply
    partial = parse_pulled_log_group_list(frame_log_group(b"\x0a\x00"))
    assert partial.LogGroups[0].Logs[0].Time == 0
    with pytest.raises(PostBodyInvalid):  # what is not protobuf still fails
        parse_pulled_log_group_list(b"\x0a\x05abc")


@given(st.binary(max_size=256))
def test_random_bytes_parse_or_raise_post_body_invalid(raw: bytes) -> None:
    try:
        group = parse_log_group(raw)
    except PostBodyInvalid:
        return
    assert group.IsInitialized()
