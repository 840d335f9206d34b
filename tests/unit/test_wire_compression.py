"""Body compression: every codec round trips, interoperates with the SDK, and survives hostile
bodies with nothing but the request errors, within the raw size limit."""

from __future__ import annotations

import gzip
import zlib

import lz4.block
import pytest
import zstandard
from aliyun.log.compress import Compressor, lz_compresss, lz_decompress
from hypothesis import given, settings
from hypothesis import strategies as st

from loghub.errors import InvalidCompressType, PostBodyInvalid, PostBodyTooLarge
from loghub.wire.compression import (
    COMPRESS_TYPES,
    choose_response_compression,
    compress,
    decompress,
)

MIB = 1024 * 1024
DATA = b"".join(b"level=INFO msg=hello %d\n" % i for i in range(2000))
CODECS = sorted(COMPRESS_TYPES - {""})


@pytest.mark.parametrize("compress_type", [*CODECS, "", None, "LZ4"])
@pytest.mark.parametrize("data", [b"", b"x", DATA], ids=["empty", "one", "text"])
def test_round_trip(compress_type: str | None, data: bytes) -> None:
    body = compress(compress_type, data)
    assert decompress(compress_type, body, len(data), MIB) == data


@pytest.mark.parametrize("compress_type", CODECS)
def test_compression_shrinks_log_text(compress_type: str) -> None:
    assert len(compress(compress_type, DATA)) < len(DATA) // 4


def test_lz4_is_a_raw_block_without_size_prefix() -> None:
    assert compress("lz4", DATA) == lz4.block.compress(DATA)[4:]


def test_lz4_interoperates_with_the_sdk() -> None:
    assert decompress("lz4", lz_compresss(DATA), len(DATA), MIB) == DATA
    assert lz_decompress(len(DATA), compress("lz4", DATA)) == DATA


@pytest.mark.parametrize("compress_type", ["lz4", "deflate", "gzip", ""])
def test_sdk_reads_our_pull_response_bodies(compress_type: str) -> None:
    header = {"x-log-compresstype": compress_type, "x-log-bodyrawsize": str(len(DATA))}
    assert Compressor.decompress_response(header, compress(compress_type, DATA)) == DATA


def test_zstd_frame_from_another_writer_is_accepted() -> None:
    body = zstandard.ZstdCompressor(level=19, write_content_size=False).compress(DATA)
    assert decompress("zstd", body, len(DATA), MIB) == DATA


@pytest.mark.parametrize("compress_type", ["gzip", "deflate"])
def test_gzip_wrapped_stream_is_accepted(compress_type: str) -> None:
    assert decompress(compress_type, gzip.compress(DATA), len(DATA), MIB) == DATA


def test_unknown_compress_type_is_refused() -> None:
    with pytest.raises(InvalidCompressType):
        decompress("snappy", b"abc", 3, MIB)
    with pytest.raises(InvalidCompressType):
        compress("brotli", b"abc")


@pytest.mark.parametrize("compress_type", CODECS)
@pytest.mark.parametrize("raw_size", [None, -1])
def test_compressed_body_needs_a_raw_size(compress_type: str, raw_size: int | None) -> None:
    with pytest.raises(PostBodyInvalid):
        decompress(compress_type, compress(compress_type, DATA), raw_size, MIB)


@pytest.mark.parametrize("compress_type", CODECS)
@pytest.mark.parametrize("delta", [-1, 1, -len(DATA)])
def test_raw_size_must_match(compress_type: str, delta: int) -> None:
    with pytest.raises(PostBodyInvalid):
        decompress(compress_type, compress(compress_type, DATA), len(DATA) + delta, MIB)


@pytest.mark.parametrize("compress_type", CODECS)
def test_raw_size_over_the_limit_is_too_large(compress_type: str) -> None:
    with pytest.raises(PostBodyTooLarge):
        decompress(compress_type, compress(compress_type, DATA), len(DATA), len(DATA) - 1)


def test_uncompressed_body_over_the_limit_is_too_large() -> None:
    with pytest.raises(PostBodyTooLarge):
        decompress("", DATA, None, len(DATA) - 1)


def test_uncompressed_body_ignores_raw_size() -> None:
    # The SDK sends x-log-bodyrawsize 0 on JSON bodies.
    assert decompress(None, b"[0, 1]", 0, MIB) == b"[0, 1]"


@pytest.mark.parametrize("compress_type", CODECS)
def test_bomb_that_lies_about_its_raw_size_stops_at_the_claimed_size(compress_type: str) -> None:
    bomb = compress(compress_type, bytes(16 * MIB))  # 16 MiB of zeros, a few KiB compressed
    with pytest.raises(PostBodyInvalid):
        decompress(compress_type, bomb, 100, MIB)


@pytest.mark.parametrize("compress_type", CODECS)
def test_truncated_body_is_invalid(compress_type: str) -> None:
    body = compress(compress_type, DATA)
    with pytest.raises(PostBodyInvalid):
        decompress(compress_type, body[: len(body) // 2], len(DATA), MIB)


@settings(max_examples=300)
@given(
    compress_type=st.sampled_from(CODECS),
    body=st.binary(max_size=512)
    | st.sampled_from(CODECS)
    .map(lambda c: compress(c, DATA[:300]))
    .flatmap(
        lambda b: st.integers(0, len(b) - 1).map(
            lambda i: b[:i] + bytes([b[i] ^ 0x5A]) + b[i + 1 :]
        )
    ),
    raw_size=st.none() | st.integers(min_value=-(2**40), max_value=2**40) | st.integers(0, 4096),
)
def test_hostile_body_raises_only_request_errors(
    compress_type: str, body: bytes, raw_size: int | None
) -> None:
    try:
        data = decompress(compress_type, body, raw_size, 64 * 1024)
    except (PostBodyInvalid, PostBodyTooLarge):
        return
    assert len(data) == raw_size


@pytest.mark.parametrize(
    ("accept_encoding", "expected"),
    [
        ("lz4", "lz4"),
        ("zstd", "zstd"),
        ("deflate", "deflate"),
        ("gzip", "gzip"),
        ("", ""),
        (None, ""),
        ("br, gzip;q=0.5, lz4", "gzip"),
        (" LZ4 ", "lz4"),
        ("br, identity", ""),
        ("gzip, deflate", "gzip"),
    ],
)
def test_response_compression_is_the_first_supported_listed(
    accept_encoding: str | None, expected: str
) -> None:
    assert choose_response_compression(accept_encoding) == expected


def test_zlib_module_is_what_the_sdk_uses_for_deflate() -> None:
    assert zlib.decompress(compress("deflate", DATA)) == DATA
