"""The Kafka codec and record batches: golden bytes the real clients send and expect, and
round trips against kafka-python's own (independently written) protocol classes."""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():  # kafka-python 3.0 reads its specs with a deprecated call
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.consumer.group import JoinGroupRequest, OffsetCommitResponse
    from kafka.protocol.metadata.metadata import MetadataResponse
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from loghub.kafka.mapping import group_to_records, offset_of, position_of, records_to_group
from loghub.wire.kafka.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    read_request_header,
)
from loghub.wire.kafka.records import (
    CorruptBatch,
    Record,
    UnsupportedCompression,
    UnsupportedMagic,
    build_batch,
    parse_batches,
)
from loghub.wire.logs import make_log_group

FIXED = settings(derandomize=True, max_examples=60, deadline=None)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# -- golden bytes ----------------------------------------------------------------------------


def test_heartbeat_responses_match_the_bytes_captured_from_a_broker() -> None:
    # v4 is flexible: a tag byte after the header and after the body; v3 has none
    assert encode_response(12, 4, 9, {}).hex() == "0000000c000000090000000000000000"
    assert encode_response(12, 3, 7, {}).hex() == "0000000a00000007000000000000"


def test_api_versions_response_header_has_no_tag_byte_even_when_flexible() -> None:
    frame = encode_response(18, 3, 2, {"ApiKeys": [{"ApiKey": 0, "MaxVersion": 10}]})
    # size, correlation id, then straight to the error code and a compact array of one entry
    assert frame[4:8].hex() == "00000002"
    assert frame[8:11].hex() == "000002"


def test_librdkafka_all_topics_metadata_request_with_trailing_bytes_reads_as_all_topics() -> None:
    # captured from librdkafka 2.16: Metadata v12 "all topics", an int32 left where a varint goes
    header = bytes.fromhex("0003000c00000003") + b"\x00\x04rdkf" + b"\x00"
    frame = header + bytes.fromhex("00000000010000")
    parsed, start = read_request_header(frame)
    assert (parsed.api_key, parsed.api_version, parsed.correlation_id) == (3, 12, 3)
    assert parsed.client_id == "rdkf"
    request = decode_request(3, 12, frame[start:])
    assert request["Topics"] is None


def test_kafka_python_record_captured_on_the_wire_decodes() -> None:
    # record of §6.2: key "k0", 20-byte value, one header h=v0
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=1001,
        producer_epoch=0, base_sequence=0, batch_size=1 << 20,
    )  # fmt: skip
    builder.append(0, timestamp=1_700_000_000_000, key=b"k0", value=b"kafka-python value 0",
                   headers=[("h", b"v0")])  # fmt: skip
    data = bytes(builder.build())
    captured = (
        bytes.fromhex("4200000004")
        + b"k0"
        + b"\x28"
        + b"kafka-python value 0"
        + bytes.fromhex("0202680476")
        + b"0"
    )
    assert data.endswith(captured)
    (batch,) = parse_batches(data, 1 << 20)
    assert batch.info.producer_id == 1001
    assert batch.records[0].key == b"k0"
    assert batch.records[0].headers == (("h", b"v0"),)


# -- round trips against kafka-python --------------------------------------------------------

_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
_blobs = st.binary(max_size=40)


@FIXED
@given(
    version=st.sampled_from([0, 1, 4, 5, 6, 7]),
    group=_names,
    member=_names,
    session_ms=st.integers(0, 2**31 - 1),
    protocols=st.lists(st.tuples(_names, _blobs), max_size=3),
)
def test_join_group_requests_written_by_kafka_python_decode_to_the_same_fields(
    version: int, group: str, member: str, session_ms: int, protocols: list[tuple[str, bytes]]
) -> None:
    request = JoinGroupRequest(
        group_id=group,
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=session_ms,
        member_id=member,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[
            JoinGroupRequest.JoinGroupRequestProtocol(name=n, metadata=m) for n, m in protocols
        ],
    )
    decoded = decode_request(11, version, request.encode(version=version))
    assert decoded["GroupId"] == group
    assert decoded["MemberId"] == member
    assert decoded["SessionTimeoutMs"] == session_ms
    assert [(p["Name"], p["Metadata"]) for p in decoded["Protocols"]] == protocols
    # and ours writes the same bytes
    assert encode_request(11, version, decoded) == bytes(request.encode(version=version))


@FIXED
@given(
    version=st.integers(0, 12),
    host=_names,
    port=st.integers(0, 65535),
    topics=st.lists(st.tuples(_names, st.lists(st.integers(0, 1000), max_size=4)), max_size=3),
)
def test_metadata_responses_we_write_are_read_back_by_kafka_python(
    version: int, host: str, port: int, topics: list[tuple[str, list[int]]]
) -> None:
    message: dict[str, Any] = {
        "Brokers": [{"NodeId": 1, "Host": host, "Port": port, "Rack": None}],
        "ClusterId": "loghub",
        "ControllerId": 1,
        "Topics": [
            {
                "Name": name,
                "TopicId": bytes(range(16)),
                "Partitions": [
                    {"PartitionIndex": p, "LeaderId": 1, "ReplicaNodes": [1], "IsrNodes": [1]}
                    for p in partitions
                ],
            }
            for name, partitions in topics
        ],
    }
    frame = encode_response(3, version, 5, message)
    body = frame[8 + (1 if version >= 9 else 0) :]
    theirs = MetadataResponse.decode(body, version=version).to_dict()
    assert theirs["brokers"][0]["host"] == host
    assert theirs["brokers"][0]["port"] == port
    assert [t["name"] for t in theirs["topics"]] == [name for name, _ in topics]
    assert [[p["partition_index"] for p in t["partitions"]] for t in theirs["topics"]] == [
        partitions for _, partitions in topics
    ]
    # our own decoder agrees with our encoder
    ours = decode_response(3, version, body)
    assert [t["Name"] for t in ours["Topics"]] == [name for name, _ in topics]
    assert ours["Brokers"][0]["Port"] == port


@FIXED
@given(version=st.integers(2, 9), partitions=st.lists(st.integers(0, 100), max_size=5))
def test_offset_commit_responses_round_trip_through_kafka_python(
    version: int, partitions: list[int]
) -> None:
    message = {
        "Topics": [
            {
                "Name": "p.t",
                "Partitions": [{"PartitionIndex": p, "ErrorCode": 22} for p in partitions],
            }
        ]
    }
    frame = encode_response(8, version, 1, message)
    body = frame[8 + (1 if version >= 8 else 0) :]
    theirs = OffsetCommitResponse.decode(body, version=version).to_dict()
    assert [p["partition_index"] for p in theirs["topics"][0]["partitions"]] == partitions
    assert decode_response(8, version, body)["Topics"] == [
        {
            "Name": "p.t",
            "Partitions": [{"PartitionIndex": p, "ErrorCode": 22} for p in partitions],
        }
    ]


# -- record batches --------------------------------------------------------------------------

_records = st.lists(
    st.builds(
        Record,
        timestamp_ms=st.integers(0, 2**41),
        key=st.none() | _blobs,
        value=st.none() | _blobs,
        headers=st.lists(st.tuples(_names, st.none() | _blobs), max_size=3).map(tuple),
    ),
    min_size=1,
    max_size=8,
).map(lambda rs: [Record(r.timestamp_ms, r.key, r.value, r.headers, i) for i, r in enumerate(rs)])


@FIXED
@given(records=_records, base=st.integers(0, 2**50))
def test_batches_we_build_are_read_by_kafka_python_and_by_us(
    records: list[Record], base: int
) -> None:
    data = build_batch(base, records)
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc()
    assert [(r.offset, r.key, r.value) for r in theirs] == [
        (base + r.offset_delta, r.key, r.value) for r in records
    ]
    (ours,) = parse_batches(data, 1 << 20)
    assert ours.records == records


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_compressed_batches_from_kafka_python_are_read(codec: int) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i in range(50):
        builder.append(i, timestamp=1000 + i, key=None, value=b"value %d " % i * 20, headers=[])
    data = bytes(builder.build())
    assert data[22] & 0x07 == codec  # compressed indeed
    (batch,) = parse_batches(data, 1 << 20)
    assert [r.value for r in batch.records] == [b"value %d " % i * 20 for i in range(50)]


def _with_codec(data: bytes, codec: int, body: bytes) -> bytes:
    """``data``'s batch with its records replaced by ``body`` under ``codec``, CRC fixed."""
    import crc32c

    batch = bytearray(data[:61]) + body
    batch[22] = (batch[22] & ~0x07) | codec
    batch[8:12] = (len(batch) - 12).to_bytes(4, "big")
    batch[17:21] = crc32c.crc32c(bytes(batch[21:])).to_bytes(4, "big")
    return bytes(batch)


def test_snappy_raw_and_xerial_framed_are_read_and_a_bomb_is_refused() -> None:
    import cramjam

    records = [Record(i, None, b"value %d " % i * 30) for i in range(40)]
    data = build_batch(0, records)
    plain = data[61:]
    raw = bytes(cramjam.snappy.compress_raw(plain))
    half = len(plain) // 2
    xerial = b"\x82SNAPPY\x00" + (1).to_bytes(4, "big") + (1).to_bytes(4, "big")
    for part in (plain[:half], plain[half:]):
        block = bytes(cramjam.snappy.compress_raw(part))
        xerial += len(block).to_bytes(4, "big") + block
    for body in (raw, xerial):
        (batch,) = parse_batches(_with_codec(data, 2, body), 1 << 20)
        assert batch.records == records
    with pytest.raises(CorruptBatch, match="more than"):
        parse_batches(_with_codec(data, 2, raw), len(plain) - 1)
    with pytest.raises(CorruptBatch):  # not snappy at all
        parse_batches(_with_codec(data, 2, plain), 1 << 20)
    with pytest.raises(CorruptBatch):  # a block longer than the batch
        parse_batches(_with_codec(data, 2, xerial[:-5]), 1 << 20)


def test_an_unknown_codec_legacy_magic_and_bad_crc_are_refused_clearly() -> None:
    data = bytearray(build_batch(0, [Record(1, None, b"v")]))
    odd = bytearray(data)
    odd[22] |= 5
    with pytest.raises(CorruptBatch):  # the attributes are under the CRC
        parse_batches(bytes(odd), 1 << 20)
    import crc32c

    odd[17:21] = crc32c.crc32c(bytes(odd[21:])).to_bytes(4, "big")
    with pytest.raises(UnsupportedCompression):
        parse_batches(bytes(odd), 1 << 20)
    legacy = bytearray(data)
    legacy[16] = 1
    with pytest.raises(UnsupportedMagic):
        parse_batches(bytes(legacy), 1 << 20)


def test_a_decompression_bomb_is_refused() -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=4, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 24,
    )  # fmt: skip
    builder.append(0, timestamp=0, key=None, value=bytes(4 << 20), headers=[])
    with pytest.raises(CorruptBatch, match="more than"):
        parse_batches(bytes(builder.build()), 1 << 20)


# -- mapping ---------------------------------------------------------------------------------


@FIXED
@given(records=_records)
def test_records_survive_a_trip_through_a_log_group(records: list[Record]) -> None:
    back = group_to_records(records_to_group(records))
    for sent, got in zip(records, back, strict=True):
        assert got.key == sent.key
        assert got.value == sent.value or (sent.value is None and got.value is None)
        assert got.timestamp_ms == sent.timestamp_ms
        assert [n for n, _ in got.headers] == [n for n, _ in sent.headers]


def test_a_log_written_over_rest_reads_as_a_json_record_with_its_group_headers() -> None:
    raw = make_log_group([(1_700_000_000, {"level": "info", "msg": "hé"})], topic="t", source="s")
    (record,) = group_to_records(raw.SerializeToString())
    assert record.key is None
    assert record.value == '{"level":"info","msg":"hé"}'.encode()
    assert record.headers == (("__topic__", b"t"), ("__source__", b"s"))
    assert record.timestamp_ms == 1_700_000_000_000


def test_offsets_name_a_log_inside_a_stored_group() -> None:
    assert position_of(offset_of(7, 3)) == (7, 3)
    assert offset_of(1) == 1 << 20
