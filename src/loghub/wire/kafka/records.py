"""Kafka record batches, magic 2: parse what producers send, build what consumers fetch.

Batch layout (61-byte header, all big-endian), then the records::

    0  baseOffset int64          outside the CRC
    8  batchLength int32         bytes after this field
    12 partitionLeaderEpoch int32
    16 magic int8 (= 2)          a legacy message set has 0 or 1 at this same byte
    17 crc uint32                CRC-32C of bytes 21..end
    21 attributes int16          bits 0-2 codec (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd),
                                 bit 3 LogAppendTime, bit 4 transactional, bit 5 control
    23 lastOffsetDelta int32
    27 baseTimestamp int64
    35 maxTimestamp int64
    43 producerId int64
    51 producerEpoch int16
    53 baseSequence int32
    57 recordsCount int32        not compressed
    61 records                   compressed as one block when the codec is not 0

Each record: ``length, attributes int8, timestampDelta, offsetDelta, keyLength, key,
valueLength, value, headerCount, (keyLength, key, valueLength, value)*`` where every length
and delta is a zigzag varint and -1 means null.

Compression: gzip, snappy (raw, as librdkafka writes it, or in the xerial framing of the Java
client's SnappyOutputStream), lz4 (frame) and zstd are read. Decompression is
bounded by ``bytes_max`` so a small batch cannot claim gigabytes. Batches written here are
uncompressed, with CreateTime.

Pure functions; thread-safe.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass, field

import cramjam
import crc32c
import lz4.frame
import zstandard

from loghub.errors import CorruptBatch, UnsupportedCompression, UnsupportedMagic

__all__ = [
    "CODEC_NAMES",
    "BatchInfo",
    "CorruptBatch",
    "Record",
    "RecordBatch",
    "UnsupportedCompression",
    "UnsupportedMagic",
    "build_batch",
    "parse_batches",
]

CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_HEADER = struct.Struct(">qiibIhiqqqhii")
_HEADER_BYTES = 61
_CRC_START = 21
_MAGIC_OFFSET = 16
_CONTROL_BIT = 0x20
_TRANSACTIONAL_BIT = 0x10
assert _HEADER.size == _HEADER_BYTES


@dataclass(frozen=True)
class Record:
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    offset_delta: int = 0


@dataclass(frozen=True)
class BatchInfo:
    """The header fields a broker acts on."""

    base_offset: int
    last_offset_delta: int
    attributes: int
    base_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def codec(self) -> int:
        return self.attributes & 0x07

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)


@dataclass(frozen=True)
class RecordBatch:
    info: BatchInfo
    records: list[Record] = field(default_factory=list)


# -- varints ---------------------------------------------------------------------------------


def _zigzag(value: int) -> bytes:
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while encoded >= 0x80:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


def _read_zigzag(data: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 63:
            raise CorruptBatch("a record's varint runs past its batch")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _read_blob(data: bytes, pos: int) -> tuple[bytes | None, int]:
    size, pos = _read_zigzag(data, pos)
    if size < 0:
        return None, pos
    end = pos + size
    if end > len(data):
        raise CorruptBatch("a record's key, value or header runs past its batch")
    return data[pos:end], end


# -- parsing ---------------------------------------------------------------------------------


def parse_batches(data: bytes, bytes_max: int) -> list[RecordBatch]:
    """Every batch in a Produce request's ``Records``, its CRC checked and records decoded.

    ``bytes_max`` bounds each batch's decompressed records. Raises ``UnsupportedMagic``,
    ``UnsupportedCompression`` or ``CorruptBatch``."""
    batches: list[RecordBatch] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < _HEADER_BYTES:
            if len(data) - pos > _MAGIC_OFFSET and data[pos + _MAGIC_OFFSET] in (0, 1):
                raise UnsupportedMagic("legacy message sets (magic 0 and 1) are not accepted")
            raise CorruptBatch("records end inside a batch header")
        fields = _HEADER.unpack_from(data, pos)
        (base, length, _epoch, magic, crc, attributes, last_delta) = fields[:7]
        if magic != 2:
            raise UnsupportedMagic(f"message format magic {magic} is not accepted (only 2)")
        end = pos + 12 + length
        if length < _HEADER_BYTES - 12 or end > len(data):
            raise CorruptBatch("a batch's length does not match the records sent")
        if crc32c.crc32c(data[pos + _CRC_START : end]) != crc:
            raise CorruptBatch("a batch's CRC-32C does not match its contents")
        info = BatchInfo(base, last_delta, attributes, *fields[7:])
        body = _decompress(info.codec, data[pos + _HEADER_BYTES : end], bytes_max)
        batches.append(RecordBatch(info, [] if info.is_control else _records(info, body)))
        pos = end
    return batches


def _records(info: BatchInfo, body: bytes) -> list[Record]:
    records: list[Record] = []
    pos = 0
    for _ in range(info.records_count):
        length, pos = _read_zigzag(body, pos)
        end = pos + length
        if length < 0 or end > len(body):
            raise CorruptBatch("a record runs past its batch")
        pos += 1  # attributes, unused
        timestamp_delta, pos = _read_zigzag(body, pos)
        offset_delta, pos = _read_zigzag(body, pos)
        key, pos = _read_blob(body, pos)
        value, pos = _read_blob(body, pos)
        header_count, pos = _read_zigzag(body, pos)
        if header_count < 0 or header_count > length:
            raise CorruptBatch("a record's header count is out of range")
        headers = []
        for _h in range(header_count):
            name, pos = _read_blob(body, pos)
            header_value, pos = _read_blob(body, pos)
            if name is None:
                raise CorruptBatch("a record header has a null key")
            try:
                headers.append((name.decode(), header_value))
            except UnicodeDecodeError as exc:
                raise CorruptBatch("a record header key is not UTF-8") from exc
        if pos != end:
            raise CorruptBatch("a record's length does not match its fields")
        records.append(
            Record(
                info.base_timestamp_ms + timestamp_delta, key, value, tuple(headers), offset_delta
            )
        )
    if pos != len(body):
        raise CorruptBatch("bytes left after a batch's last record")
    return records


def _decompress(codec: int, data: bytes, bytes_max: int) -> bytes:
    try:
        if codec == 0:
            return data
        if codec == 1:
            inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
            out = inflater.decompress(data, bytes_max + 1)
        elif codec == 2:
            out = _snappy(data, bytes_max)
        elif codec == 3:
            out = lz4.frame.LZ4FrameDecompressor().decompress(data, max_length=bytes_max + 1)
        elif codec == 4:
            with zstandard.ZstdDecompressor().stream_reader(data) as reader:
                out = reader.read(bytes_max + 1)
        else:
            raise UnsupportedCompression(
                f"compression {CODEC_NAMES.get(codec, codec)} is not supported; "
                "use none, gzip, lz4 or zstd"
            )
    except (
        zlib.error, RuntimeError, zstandard.ZstdError, gzip.BadGzipFile,
        cramjam.DecompressionError, struct.error,
    ) as exc:  # fmt: skip
        raise CorruptBatch(f"a {CODEC_NAMES[codec]} batch does not decompress") from exc
    if len(out) > bytes_max:
        raise CorruptBatch(f"a batch decompresses to more than {bytes_max} bytes")
    return out


_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16  # magic, then version and compatible version (int32 each)


def _snappy(data: bytes, bytes_max: int) -> bytes:
    """Raw snappy, or xerial blocks (each an int32 length and a raw snappy block); every
    block's declared size is checked against what is left of ``bytes_max`` before it is
    decompressed."""
    if not data.startswith(_XERIAL_MAGIC):
        blocks = [data]
    else:
        blocks, pos = [], _XERIAL_HEADER_BYTES
        while pos < len(data):
            (length,) = struct.unpack_from(">i", data, pos)
            if length < 0 or pos + 4 + length > len(data):
                raise CorruptBatch("a snappy block runs past the end of the batch")
            blocks.append(data[pos + 4 : pos + 4 + length])
            pos += 4 + length
    out, left = [], bytes_max
    for block in blocks:
        size = cramjam.snappy.decompress_raw_len(block)
        if size > left:
            raise CorruptBatch(f"a batch decompresses to more than {bytes_max} bytes")
        out.append(bytes(cramjam.snappy.decompress_raw(block)))
        left -= size
    return b"".join(out)


# -- building --------------------------------------------------------------------------------


def build_batch(
    base_offset: int, records: list[Record], *, producer_id: int = -1, base_sequence: int = -1
) -> bytes:
    """One uncompressed CreateTime batch of ``records`` (``offset_delta`` as given, so a
    batch may have gaps), ready for a Fetch response."""
    assert records
    base_ts = records[0].timestamp_ms
    max_ts = max(r.timestamp_ms for r in records)
    varint = _varint  # the hot loop of a fetch: local names, small varints from a table
    parts: list[bytes] = []
    append = parts.append
    for record in records:
        key, value, headers = record.key, record.value, record.headers
        inner = [
            b"\x00",
            varint(record.timestamp_ms - base_ts),
            varint(record.offset_delta),
            _NULL if key is None else varint(len(key)) + key,
            _NULL if value is None else varint(len(value)) + value,
            varint(len(headers)),
        ]
        for name, header_value in headers:
            name_bytes = name.encode()
            inner.append(varint(len(name_bytes)) + name_bytes)
            inner.append(
                _NULL if header_value is None else varint(len(header_value)) + header_value
            )
        encoded = b"".join(inner)
        append(varint(len(encoded)))
        append(encoded)
    last_delta = records[-1].offset_delta
    after_crc = struct.pack(
        ">hiqqqhii", 0, last_delta, base_ts, max_ts, producer_id, -1, base_sequence, len(records)
    ) + b"".join(parts)
    crc = crc32c.crc32c(after_crc)
    head = struct.pack(">qiibI", base_offset, len(after_crc) + 9, 0, 2, crc)
    return head + after_crc


_SMALL_VARINTS = [_zigzag(value) for value in range(1 << 14)]
_NULL = _zigzag(-1)


def _varint(value: int) -> bytes:
    """``_zigzag``, from a table for the common small non-negative values."""
    return _SMALL_VARINTS[value] if 0 <= value < 16384 else _zigzag(value)
