"""Body compression as LogHub uses it: raw LZ4 blocks, zstd frames, zlib streams.

Why not HTTP ``Content-Encoding``: the protocol names the codec in ``x-log-compresstype`` and
the uncompressed length in ``x-log-bodyrawsize``, and the SDK ignores ``Content-Encoding``.

- ``lz4``: an LZ4 *block* without the 4-byte size prefix that ``lz4.block`` normally adds;
  the size travels in ``x-log-bodyrawsize`` instead.
- ``zstd``: one zstd frame.
- ``deflate`` and ``gzip``: a zlib-wrapped deflate stream (what ``zlib.compress`` writes and
  what the SDK's ``zlib.decompress`` reads); on input a gzip wrapper is accepted too.
- ``""`` (or None): no compression.

Hostile input: ``decompress`` never produces more than ``raw_bytes_max`` bytes and never
allocates by a size the sender claims before that size has been checked against the limit,
so a small body cannot make the server hang or run out of memory. Every failure is a
``RequestError``: ``InvalidCompressType``, ``PostBodyTooLarge`` or ``PostBodyInvalid``.

All functions are pure and thread-safe; the codecs release the GIL while they work.
"""

from __future__ import annotations

import zlib

import lz4.block
import zstandard

from loghub.errors import InvalidCompressType, PostBodyInvalid, PostBodyTooLarge

__all__ = [
    "COMPRESS_TYPES",
    "choose_response_compression",
    "compress",
    "decompress",
]

COMPRESS_TYPES = frozenset({"", "lz4", "zstd", "deflate", "gzip"})
"""Every value of ``x-log-compresstype`` understood here; ``""`` means none."""

_ZSTD_LEVEL = 1  # as the SDK: pulls are latency-bound, and level 1 already halves log text
_ZLIB_OR_GZIP_WBITS = 32 + zlib.MAX_WBITS  # detect a zlib or a gzip header automatically


def _normalize(compress_type: str | None) -> str:
    name = (compress_type or "").strip().lower()
    if name not in COMPRESS_TYPES:
        raise InvalidCompressType(f"unsupported compress type {compress_type!r}")
    return name


def compress(compress_type: str | None, data: bytes | bytearray | memoryview) -> bytes:
    """``data`` encoded as ``compress_type`` says (see the module docstring), as new bytes
    that do not share memory with ``data`` (bytes given are returned as they are), so a
    caller may reuse its buffer once this returns."""
    name = _normalize(compress_type)
    if name == "lz4":
        return bytes(lz4.block.compress(data, store_size=False))
    if name == "zstd":
        return bytes(zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(data))
    if name in ("deflate", "gzip"):
        return zlib.compress(data)
    return bytes(data)


def decompress(
    compress_type: str | None, body: bytes, raw_size: int | None, raw_bytes_max: int
) -> bytes:
    """The raw bytes of a request ``body`` sent with ``x-log-compresstype: compress_type``.

    ``raw_size`` is the received ``x-log-bodyrawsize`` (None when absent). It is required
    for a compressed body and must equal the decompressed length; for an uncompressed body it
    is ignored, because the SDK sends wrong values there on some calls. Raises
    ``InvalidCompressType`` for an unknown codec, ``PostBodyTooLarge`` when the raw body
    would exceed ``raw_bytes_max``, and ``PostBodyInvalid`` for anything else wrong.
    """
    assert raw_bytes_max >= 0, raw_bytes_max
    name = _normalize(compress_type)
    if name == "":
        if len(body) > raw_bytes_max:
            raise PostBodyTooLarge(f"body of {len(body)} bytes is over {raw_bytes_max}")
        return body
    if raw_size is None or raw_size < 0:
        raise PostBodyInvalid(f"a {name} body needs x-log-bodyrawsize (got {raw_size!r})")
    if raw_size > raw_bytes_max:
        raise PostBodyTooLarge(f"x-log-bodyrawsize {raw_size} is over {raw_bytes_max} bytes")
    try:
        if name == "lz4":
            data = _lz4_decompress(body, raw_size)
        elif name == "zstd":
            data = _zstd_decompress(body, raw_size)
        else:
            data = _zlib_decompress(body, raw_size)
    except (lz4.block.LZ4BlockError, zstandard.ZstdError, zlib.error) as exc:
        raise PostBodyInvalid(f"corrupt {name} body: {exc}") from exc
    if len(data) != raw_size:
        raise PostBodyInvalid(
            f"{name} body decompresses to at least {len(data)} bytes,"
            f" but x-log-bodyrawsize says {raw_size}"
        )
    return data


def _lz4_decompress(body: bytes, raw_size: int) -> bytes:
    return bytes(lz4.block.decompress(body, uncompressed_size=raw_size))


def _zstd_decompress(body: bytes, raw_size: int) -> bytes:
    # A stream reader bounds the output by what we ask for; ZstdDecompressor.decompress would
    # trust the content size written in the frame header and allocate it up front.
    limit = raw_size + 1  # one byte more than expected reveals a size mismatch
    chunks: list[bytes] = []
    produced = 0
    with zstandard.ZstdDecompressor().stream_reader(body) as reader:
        while produced < limit:
            chunk = reader.read(limit - produced)
            if not chunk:
                break
            chunks.append(chunk)
            produced += len(chunk)
    return b"".join(chunks)


def _zlib_decompress(body: bytes, raw_size: int) -> bytes:
    decompressor = zlib.decompressobj(_ZLIB_OR_GZIP_WBITS)
    data = decompressor.decompress(body, raw_size + 1)
    if len(data) <= raw_size and not decompressor.eof:
        raise zlib.error("truncated stream")
    return data


def choose_response_compression(accept_encoding: str | None) -> str:
    """The codec for a pull response: the first one the client lists that we support.

    The SDK sends a single name (``lz4`` by default) or an empty header for no compression;
    q-values are ignored. Returns ``""`` (no compression) when nothing listed is supported.
    """
    for item in (accept_encoding or "").split(","):
        name = item.split(";", 1)[0].strip().lower()
        if name and name in COMPRESS_TYPES:
            return name
    return ""
