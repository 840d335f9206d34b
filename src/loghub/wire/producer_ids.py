"""Write ids of idempotent PutLogs: what LogHub's client sends and the server stores.

A write id is a producer id (random, one per client) and a sequence (one per write, the
same on every retry), sent as ``x-log-loghub-producer: <producer id>:<sequence>`` (an
``x-log-`` header, so the request's signature covers it). The server stores it with the
write as the log group's ``Reserved`` field, ``loghub-producer:<id>:<sequence>``, appended
to the group's bytes (``marked``), where a new leader finds it again (``marker_of``); see
``loghub.server.idempotence``.
"""

from __future__ import annotations

import itertools
import re
import secrets
import threading
from dataclasses import dataclass

from loghub.errors import ParameterInvalid

__all__ = ["PRODUCER_HEADER", "ProducerIds", "WriteId", "marked", "marker_of",
           "parse_producer_header"]  # fmt: skip

PRODUCER_HEADER = "x-log-loghub-producer"
_MARK = b"loghub-producer:"
_RESERVED_TAG = b"\x12"  # LogGroup.Reserved: field 2, length-delimited
_ID = re.compile(r"[0-9A-Za-z_-]{1,32}")
_SEQUENCE_MAX = 2**63 - 1


@dataclass(frozen=True)
class WriteId:
    producer: str
    sequence: int

    @property
    def header(self) -> str:
        return f"{self.producer}:{self.sequence}"


class ProducerIds:
    """A producer id and its next sequences: one per client. Thread-safe."""

    def __init__(self, producer: str | None = None) -> None:
        self.producer = producer or secrets.token_hex(8)
        if not _ID.fullmatch(self.producer):
            raise ParameterInvalid("a producer id is 1-32 letters, digits, '-' or '_'")
        self._sequences = itertools.count()
        self._lock = threading.Lock()

    def next(self) -> WriteId:
        with self._lock:
            return WriteId(self.producer, next(self._sequences))


def parse_producer_header(value: str | None) -> WriteId | None:
    """The write id a PutLogs names, or None; ParameterInvalid when malformed."""
    if value is None:
        return None
    producer, _, sequence = value.strip().partition(":")
    if not _ID.fullmatch(producer) or not sequence.isdigit() or len(sequence) > 19:
        raise ParameterInvalid(
            f"{PRODUCER_HEADER} must be <producer id>:<sequence> (an id of 1-32 letters, "
            f"digits, '-' or '_', and a sequence of digits), not {value!r}"
        )
    number = int(sequence)
    if number > _SEQUENCE_MAX:
        raise ParameterInvalid(f"{PRODUCER_HEADER}: the sequence is above 2**63-1")
    return WriteId(producer, number)


def marked(raw: bytes, write: WriteId) -> bytes:
    """The serialized LogGroup ``raw`` with the write id as its ``Reserved`` field."""
    value = _MARK + f"{write.producer}:{write.sequence}".encode()
    assert len(value) < 128  # one length byte: ``marker_of`` reads it back from the end
    return raw + _RESERVED_TAG + bytes([len(value)]) + value


def marker_of(group: bytes | memoryview) -> WriteId | None:
    """The write id ``marked`` put at the end of a serialized LogGroup, or None."""
    tail = bytes(group[-80:])
    at = tail.rfind(_MARK)
    if at < 2 or tail[at - 2 : at - 1] != _RESERVED_TAG or tail[at - 1] != len(tail) - at:
        return None
    producer, _, sequence = tail[at + len(_MARK) :].decode("ascii", "replace").partition(":")
    if not _ID.fullmatch(producer) or not sequence.isdigit():
        return None
    return WriteId(producer, int(sequence))
