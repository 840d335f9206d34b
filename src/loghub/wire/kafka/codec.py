"""Kafka request and response bodies, read and written by interpreting Kafka's JSON specs.

The specs in ``specs/`` (Apache Kafka's own, with their licence notice) say, per API and
version, which fields a message has, their types, which are nullable and which are tagged.
One interpreter covers every API and version instead of a hand-written class per version:

- classic encoding: ``STRING`` int16 length, ``BYTES`` int32 length, ``ARRAY`` int32 count,
  -1 for null;
- flexible encoding (KIP-482, versions at or above the spec's ``flexibleVersions``): compact
  strings, bytes and arrays (unsigned varint of length + 1, 0 for null) and a tagged-field
  section after every struct (count, then ``tag, size, data``); unknown tags are skipped.

A message is a ``dict`` keyed by the spec's field names (``"Topics"``, ``"PartitionIndex"``);
nested structs are dicts, arrays are lists. When writing, a missing field takes its spec
default (0, ``""``, ``[]``, or the spec's ``default``), so handlers only set what they mean.

Reading tolerates trailing bytes after the body, as Kafka does: librdkafka 2.16 sends a
Metadata v12 "all topics" request with three surplus bytes.

Malformed input raises ``KafkaDecodeError``; the listener closes the connection then, as a
Kafka broker does. Pure functions over immutable schemas; thread-safe.
"""

from __future__ import annotations

import json
import re
import struct
import uuid
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from loghub.errors import KafkaDecodeError

__all__ = [
    "API_KEYS",
    "KafkaDecodeError",
    "Message",
    "RequestHeader",
    "Schema",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "read_request_header",
    "request_schema",
    "response_schema",
]

Message = dict[str, Any]

# api key -> spec name; the APIs whose specs ship in specs/
API_KEYS: dict[int, str] = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
    15: "DescribeGroups",
    16: "ListGroups",
    17: "SaslHandshake",
    18: "ApiVersions",
    19: "CreateTopics",
    22: "InitProducerId",
    36: "SaslAuthenticate",
}
_API_VERSIONS_KEY = 18
_NO_VERSION = 1 << 30


def _versions(text: str | None) -> tuple[int, int]:
    """A spec version range ("0+", "3-5", "7", "none") as inclusive (low, high)."""
    if text is None or text == "none":
        return (_NO_VERSION, -1)
    if text.endswith("+"):
        return (int(text[:-1]), _NO_VERSION)
    low, _, high = text.partition("-")
    return (int(low), int(high or low))


def _within(version: int, bounds: tuple[int, int]) -> bool:
    return bounds[0] <= version <= bounds[1]


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # "int32", "string", "[]int32", "[]Struct", "Struct"...
    versions: tuple[int, int]
    nullable: tuple[int, int]
    tag: int | None
    tagged: tuple[int, int]
    fields: tuple[Field, ...]  # for struct and []struct types
    default: Any

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def element(self) -> str:
        return self.type[2:] if self.is_array else self.type


_SCALAR_DEFAULTS: dict[str, Any] = {
    "int8": 0,
    "int16": 0,
    "int32": 0,
    "int64": 0,
    "uint16": 0,
    "uint32": 0,
    "float64": 0.0,
    "bool": False,
    "string": "",
    "bytes": b"",
    "records": None,
    "uuid": bytes(16),
}


@dataclass(frozen=True)
class Schema:
    """One message of one API (request or response), all versions."""

    api_key: int
    name: str
    valid: tuple[int, int]
    flexible: tuple[int, int]
    fields: tuple[Field, ...]

    def is_flexible(self, version: int) -> bool:
        return _within(version, self.flexible)


def _strip_comments(text: str) -> str:
    """The spec's ``//`` comments removed; a ``//`` inside a JSON string is kept."""
    return re.sub(
        r'"(?:\\.|[^"\\])*"|//[^\n]*', lambda m: m.group(0) if m.group(0)[0] == '"' else "", text
    )


def _default(spec: dict[str, Any], type_name: str, nullable: tuple[int, int]) -> Any:
    raw = spec.get("default")
    if type_name.startswith("[]"):
        return []
    if raw is None:
        return _SCALAR_DEFAULTS.get(type_name)  # None for a struct: built on demand
    if raw == "null":
        return None
    if type_name == "bool":
        return raw in (True, "true")
    if type_name.startswith(("int", "uint")):
        return int(raw, 0) if isinstance(raw, str) else int(raw)
    if type_name == "float64":
        return float(raw)
    return raw


def _field(spec: dict[str, Any], structs: dict[str, tuple[Field, ...]]) -> Field:
    type_name = spec["type"]
    element = type_name[2:] if type_name.startswith("[]") else type_name
    children: tuple[Field, ...] = ()
    if "fields" in spec:
        children = tuple(_field(child, structs) for child in spec["fields"])
        structs[element] = children
    elif element not in _SCALAR_DEFAULTS:
        children = structs[element]
    nullable = _versions(spec.get("nullableVersions"))
    return Field(
        name=spec["name"],
        type=type_name,
        versions=_versions(spec.get("versions")),
        nullable=nullable,
        tag=spec.get("tag"),
        tagged=_versions(spec.get("taggedVersions")),
        fields=children,
        default=_default(spec, type_name, nullable),
    )


@cache
def _schema(name: str) -> Schema:
    text = resources.files("loghub.wire.kafka").joinpath("specs", f"{name}.json").read_text()
    spec = json.loads(_strip_comments(text))
    structs: dict[str, tuple[Field, ...]] = {}
    for common in spec.get("commonStructs", []):
        structs[common["name"]] = tuple(_field(child, structs) for child in common["fields"])
    return Schema(
        api_key=spec["apiKey"],
        name=spec["name"],
        valid=_versions(spec["validVersions"]),
        flexible=_versions(spec.get("flexibleVersions")),
        fields=tuple(_field(child, structs) for child in spec["fields"]),
    )


def request_schema(api_key: int) -> Schema:
    return _schema(f"{API_KEYS[api_key]}Request")


def response_schema(api_key: int) -> Schema:
    return _schema(f"{API_KEYS[api_key]}Response")


# -- reading ---------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview, pos: int = 0) -> None:
        self.data = memoryview(data)
        self.pos = pos

    def take(self, size: int) -> memoryview:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise KafkaDecodeError(f"message ends early: {size} bytes wanted at {self.pos}")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, fmt: struct.Struct) -> Any:
        return fmt.unpack(self.take(fmt.size))[0]

    def uvarint(self) -> int:
        result, shift = 0, 0
        while True:
            if shift > 63:
                raise KafkaDecodeError("varint too long")
            byte = self.take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7


_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_UINT16 = struct.Struct(">H")
_UINT32 = struct.Struct(">I")
_FLOAT64 = struct.Struct(">d")
_FIXED = {
    "int8": _INT8,
    "int16": _INT16,
    "int32": _INT32,
    "int64": _INT64,
    "uint16": _UINT16,
    "uint32": _UINT32,
    "float64": _FLOAT64,
}


def _read_length(reader: _Reader, flexible: bool, classic: struct.Struct) -> int:
    """A length or count; -1 means null."""
    if flexible:
        return reader.uvarint() - 1
    value: int = reader.unpack(classic)
    return value


def _read_scalar(reader: _Reader, type_name: str, flexible: bool) -> Any:
    fixed = _FIXED.get(type_name)
    if fixed is not None:
        return reader.unpack(fixed)
    if type_name == "bool":
        return reader.take(1)[0] != 0
    if type_name == "uuid":
        return bytes(reader.take(16))
    if type_name == "string":
        size = _read_length(reader, flexible, _INT16)
        if size < 0:
            return None
        try:
            return str(reader.take(size), "utf-8")
        except UnicodeDecodeError as exc:
            raise KafkaDecodeError("a string is not UTF-8") from exc
    if type_name in ("bytes", "records"):
        size = _read_length(reader, flexible, _INT32)
        return None if size < 0 else bytes(reader.take(size))
    raise KafkaDecodeError(f"unknown type {type_name}")  # pragma: no cover - specs are fixed


def _read_value(reader: _Reader, field: Field, version: int, flexible: bool) -> Any:
    if field.is_array:
        count = _read_length(reader, flexible, _INT32)
        if count < 0:
            return None
        if count > len(reader.data) - reader.pos:
            raise KafkaDecodeError(f"array of {count} entries in a shorter message")
        if field.fields:
            return [_read_struct(reader, field.fields, version, flexible) for _ in range(count)]
        return [_read_scalar(reader, field.element, flexible) for _ in range(count)]
    if field.fields:
        # nullable structs are not used by the supported APIs; a struct is always present
        return _read_struct(reader, field.fields, version, flexible)
    return _read_scalar(reader, field.type, flexible)


def _read_struct(
    reader: _Reader, fields: tuple[Field, ...], version: int, flexible: bool
) -> Message:
    message: Message = {}
    tagged: dict[int, Field] = {}
    for field in fields:
        if not _within(version, field.versions):
            continue
        if field.tag is not None and _within(version, field.tagged):
            tagged[field.tag] = field
            message[field.name] = _default_value(field, version)
            continue
        message[field.name] = _read_value(reader, field, version, flexible)
    if flexible:
        for _ in range(reader.uvarint()):
            tag, size = reader.uvarint(), reader.uvarint()
            data = reader.take(size)
            known = tagged.get(tag)
            if known is not None:
                message[known.name] = _read_value(_Reader(data), known, version, flexible)
    return message


def _default_value(field: Field, version: int) -> Any:
    if field.is_array:
        return []
    if field.fields and field.default is None and not _within(version, field.nullable):
        return {f.name: _default_value(f, version) for f in field.fields}
    return field.default


# -- writing ---------------------------------------------------------------------------------


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _write_length(out: bytearray, size: int, flexible: bool, classic: struct.Struct) -> None:
    if flexible:
        out += _uvarint(size + 1)
    else:
        out += classic.pack(size)


def _write_scalar(out: bytearray, type_name: str, value: Any, flexible: bool) -> None:
    fixed = _FIXED.get(type_name)
    if fixed is not None:
        out += fixed.pack(value)
    elif type_name == "bool":
        out.append(1 if value else 0)
    elif type_name == "uuid":
        out += uuid.UUID(bytes=value).bytes if len(value) == 16 else bytes(16)
    elif type_name == "string":
        if value is None:
            _write_length(out, -1, flexible, _INT16)
        else:
            data = value.encode()
            _write_length(out, len(data), flexible, _INT16)
            out += data
    elif type_name in ("bytes", "records"):
        if value is None:
            _write_length(out, -1, flexible, _INT32)
        else:
            _write_length(out, len(value), flexible, _INT32)
            out += value
    else:  # pragma: no cover - specs are fixed
        raise AssertionError(f"unknown type {type_name}")


def _write_value(out: bytearray, field: Field, value: Any, version: int, flexible: bool) -> None:
    if field.is_array:
        if value is None:
            _write_length(out, -1, flexible, _INT32)
            return
        _write_length(out, len(value), flexible, _INT32)
        for item in value:
            if field.fields:
                _write_struct(out, field.fields, item, version, flexible)
            else:
                _write_scalar(out, field.element, item, flexible)
    elif field.fields:
        _write_struct(out, field.fields, value or {}, version, flexible)
    else:
        _write_scalar(out, field.type, value, flexible)


def _write_struct(
    out: bytearray, fields: tuple[Field, ...], message: Message, version: int, flexible: bool
) -> None:
    tagged: list[tuple[int, bytes]] = []
    for field in fields:
        if not _within(version, field.versions):
            continue
        value = message.get(field.name, field.default)
        if field.is_array and value is None and not _within(version, field.nullable):
            value = []
        if field.tag is not None and _within(version, field.tagged):
            if value is None or value == field.default or (field.fields and not value):
                continue  # a tagged field at its default is left out
            chunk = bytearray()
            _write_value(chunk, field, value, version, flexible)
            tagged.append((field.tag, bytes(chunk)))
            continue
        _write_value(out, field, value, version, flexible)
    if flexible:
        out += _uvarint(len(tagged))
        for tag, data in sorted(tagged):
            out += _uvarint(tag) + _uvarint(len(data)) + data


# -- messages and headers --------------------------------------------------------------------


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def read_request_header(frame: bytes | memoryview) -> tuple[RequestHeader, int]:
    """The header of a request frame (without its size prefix) and where the body starts.

    The client id is a classic int16 string even in header v2, so any request's header can
    be read, also one of an API or version this broker does not know (only then is the
    tagged section of a v2 header left unread: such a request is refused anyway)."""
    reader = _Reader(frame)
    api_key = reader.unpack(_INT16)
    api_version = reader.unpack(_INT16)
    correlation_id = reader.unpack(_INT32)
    size = reader.unpack(_INT16)
    client_id = None if size < 0 else str(reader.take(size), "utf-8", errors="replace")
    if api_key in API_KEYS:
        schema = request_schema(api_key)
        if _within(api_version, schema.valid) and schema.is_flexible(api_version):
            for _ in range(reader.uvarint()):
                reader.uvarint()
                reader.take(reader.uvarint())
    return RequestHeader(api_key, api_version, correlation_id, client_id), reader.pos


def _decode(schema: Schema, version: int, body: bytes | memoryview) -> Message:
    if not _within(version, schema.valid):
        raise KafkaDecodeError(f"{schema.name} has no version {version}")
    return _read_struct(_Reader(body), schema.fields, version, schema.is_flexible(version))


def _encode(schema: Schema, version: int, message: Message) -> bytes:
    assert _within(version, schema.valid), (schema.name, version)
    out = bytearray()
    _write_struct(out, schema.fields, message, version, schema.is_flexible(version))
    return bytes(out)


def decode_request(api_key: int, version: int, body: bytes | memoryview) -> Message:
    """The request body; bytes after it are ignored (see the module docstring)."""
    return _decode(request_schema(api_key), version, body)


def encode_request(api_key: int, version: int, message: Message) -> bytes:
    return _encode(request_schema(api_key), version, message)


def decode_response(api_key: int, version: int, body: bytes | memoryview) -> Message:
    return _decode(response_schema(api_key), version, body)


def encode_response(api_key: int, version: int, correlation_id: int, message: Message) -> bytes:
    """A whole response frame: size, header (v1 when flexible, except for ApiVersions, whose
    response header is always v0 so that any client can read its error) and body."""
    schema = response_schema(api_key)
    header = _INT32.pack(correlation_id)
    if schema.is_flexible(version) and api_key != _API_VERSIONS_KEY:
        header += b"\x00"
    body = _encode(schema, version, message)
    return _INT32.pack(len(header) + len(body)) + header + body
