"""Log groups as shard logs store them, and the pull replies made from them.

A record's payload is one entry, in one of two forms:

- **framed**: ``0x0A <varint n> <LogGroup, n bytes>``, exactly an entry of a serialized
  ``LogGroupList`` (``loghub.wire.logs.frame_log_group``);
- **lz4**: the LZ4 block the producer sent, kept as it came::

      offset  size  field
      0       1     0xFF              never the first byte of a framed entry (field 1 is 0x0A)
      1       4     raw_size          u32 little-endian: the LogGroup's length once decompressed
      5       4     block_size        u32 little-endian: the block's length
      9       4     last_sequence_at  u32 little-endian: where the block's last sequence
                                      (literals only) starts
      13      n     the LZ4 block

Why: a pull with ``Accept-Encoding: lz4`` (the SDK's default) used to compress every reply,
which cost more CPU than everything else on the read path together (about 1 ns a byte), for
bytes the producer had already compressed. LZ4 blocks cannot be concatenated as they are,
since a block ends with a run of literals and no match, but the next block's first run of
literals can take the previous block's last run (and the LogGroupList framing in between) in
front of it: one token's literal length is rewritten, and match offsets, being relative to
where they are used, stay right. ``lz4_reply`` joins a pull's entries that way, in time
proportional to the number of entries, not their bytes; runs of framed entries (bodies sent
with another codec, or marked by LogHub's idempotent client) are compressed as before and
joined the same way. The block's last sequence is found once, when the body is stored
(``lz4_entry``), so joining reads no block through. A stored block is also about 4-5 times
smaller on disk than the LogGroup it holds.

Every other reader (Kafka fetches, other codecs, the storage's own tools) gets framed entries
from ``expand``. Storage never looks inside a payload except to count an lz4 entry's
expanded size against a read's byte limit (``loghub.storage._gather``), so that a pull's
``loghub_max_bytes`` and ``x-log-bodyrawsize`` stay in raw bytes.

A block is stored only after the server decompressed it to exactly the declared size and
checked the LogGroup, and after its sequences were walked to its end; a block whose walk
fails is stored framed instead. The walk (``lz4_last_sequence``) and ``expand`` (whose
compiled twin decodes each block straight into the list's buffer, bounds-checked) are in
``_logcheck.c`` too; ``tests/unit/test_stored_entries.py`` holds each pair to the same
answers.

Pure functions; thread-safe.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

import lz4.block

from loghub.wire.compression import compress
from loghub.wire.logs import frame_log_group, log_group_list_entry_head

__all__ = [
    "LZ4_ENTRY_HEAD_BYTES",
    "LZ4_ENTRY_MARK",
    "expand",
    "expand_python",
    "expanded_size",
    "lz4_entry",
    "lz4_last_sequence",
    "lz4_last_sequence_python",
    "lz4_reply",
    "lz4_reply_python",
    "reply_body",
    "stored_entry",
]

LZ4_ENTRY_MARK: Final = 0xFF
LZ4_ENTRY_HEAD_BYTES: Final = 13
_HEAD = struct.Struct("<BIII")
_FRAMED_TAG: Final = 0x0A  # the tag of a LogGroupList entry (``log_group_list_entry_head``)
_U32_MAX: Final = 2**32 - 1


def _extended(block: bytes | bytearray | memoryview, at: int, length: int) -> tuple[int, int]:
    """``length`` plus the extension bytes from ``at`` (255 means another follows), and
    where they end; (-1, at) when the block ends first."""
    while True:
        if at >= len(block):
            return -1, at
        extra = block[at]
        at += 1
        length += extra
        if extra != 255:
            return length, at


def _literal_run(block: bytes | bytearray | memoryview, at: int) -> tuple[int, int, int]:
    """(literal length, where the literals start, the match nibble) of the token at ``at``;
    a literal length of -1 when the run does not fit the block. As ``literal_run`` in
    ``_logcheck.c``."""
    if at >= len(block):
        return -1, at, 0
    token = block[at]
    literals, at = token >> 4, at + 1
    if literals == 15:
        literals, at = _extended(block, at, literals)
    if literals > len(block) - at:
        return -1, at, 0
    return literals, at, token & 15


def lz4_last_sequence_python(block: bytes | bytearray | memoryview) -> int:
    """Where the last sequence of an LZ4 block starts, or -1 when its sequences do not end
    exactly at its end (not a block). Does not decompress: offsets are not checked."""
    size = len(block)
    at = 0
    while True:
        start = at
        literals, literals_at, match_nibble = _literal_run(block, at)
        if literals < 0:
            return -1
        at = literals_at + literals
        if at == size:
            return start
        if at + 2 > size:
            return -1
        if block[at] == 0 and block[at + 1] == 0:
            return -1  # offset 0 is invalid
        at += 2
        if match_nibble == 15:
            length, at = _extended(block, at, 0)
            if length < 0:
                return -1


try:
    from loghub.wire._logcheck import lz4_last_sequence as _compiled  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # built without a C compiler: the same answers, slower
    lz4_last_sequence = lz4_last_sequence_python
else:
    lz4_last_sequence = _compiled


def lz4_entry(block: bytes, raw_size: int) -> bytes | None:
    """The stored form of an LZ4 ``block`` that decompresses to a checked LogGroup of
    ``raw_size`` bytes; None when it cannot be kept as it is (store it framed then)."""
    if not 0 < raw_size <= _U32_MAX or len(block) > _U32_MAX:
        return None
    last = lz4_last_sequence(block)
    if last < 0:
        return None
    return _HEAD.pack(LZ4_ENTRY_MARK, raw_size, len(block), last) + block


def stored_entry(compress_type: str | None, body: bytes, raw: bytes) -> bytes:
    """What to store for a PutLogs ``body`` whose checked LogGroup is ``raw``: the producer's
    LZ4 block as it came when it is one, else the framed group."""
    if (compress_type or "").strip().lower() == "lz4":
        entry = lz4_entry(body, len(raw))
        if entry is not None:
            return entry
    return frame_log_group(raw)


def reply_body(
    compress_type: str, data: bytes | bytearray | memoryview, expanded_size: int
) -> bytes:
    """A pull reply's body, as ``compress_type`` (see ``loghub.wire.compression``), of the
    stored entries ``data`` (``expanded_size`` bytes once expanded): new bytes that share no
    memory with ``data``."""
    if compress_type == "lz4":
        return lz4_reply(data)[0]
    return compress(compress_type, expand(data, expanded_size))


def expanded_size(raw_size: int) -> int:
    """The bytes of the framed entry of a LogGroup of ``raw_size`` bytes."""
    return len(log_group_list_entry_head(raw_size)) + raw_size


def _entries(data: memoryview) -> Iterator[tuple[int, int, int, int]]:
    """(start, end, raw_size, last_sequence_at) of each entry; raw_size -1 for a framed one.
    Raises ValueError on bytes that are not entries."""
    at, size = 0, len(data)
    while at < size:
        first = data[at]
        if first == LZ4_ENTRY_MARK:
            if at + LZ4_ENTRY_HEAD_BYTES > size:
                raise ValueError(f"a truncated lz4 entry at {at}")
            _mark, raw_size, block_size, last = _HEAD.unpack_from(data, at)
            end = at + LZ4_ENTRY_HEAD_BYTES + block_size
            if end > size or last >= block_size:
                raise ValueError(f"a malformed lz4 entry at {at}")
            yield at, end, raw_size, last
        elif first == _FRAMED_TAG:
            length, shift, cursor = 0, 0, at + 1
            while True:
                if cursor >= size or shift > 35:
                    raise ValueError(f"a malformed framed entry at {at}")
                byte = data[cursor]
                cursor += 1
                length |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            end = cursor + length
            if end > size:
                raise ValueError(f"a truncated framed entry at {at}")
            yield at, end, -1, 0
        else:
            raise ValueError(f"not a stored entry at {at}: first byte {first:#04x}")
        at = end


def expand_python(data: bytes | bytearray | memoryview, expanded_size: int) -> bytes:
    """The serialized ``LogGroupList`` of stored entries (``expanded_size`` bytes: what the
    read counted them as): lz4 entries decompressed and framed, framed ones as they are.
    Raises ValueError on bytes that are not entries of that size."""
    with memoryview(data) as view:
        parts: list[bytes | memoryview] = []
        for start, end, raw_size, _last in _entries(view):
            if raw_size < 0:
                parts.append(view[start:end])
                continue
            block = view[start + LZ4_ENTRY_HEAD_BYTES : end]
            try:
                group = lz4.block.decompress(block, uncompressed_size=raw_size)
            except lz4.block.LZ4BlockError as exc:
                raise ValueError(f"an lz4 entry at {start} does not decode: {exc}") from None
            if len(group) != raw_size:
                raise ValueError(f"an lz4 entry at {start} decodes to {len(group)} bytes")
            parts += (log_group_list_entry_head(raw_size), group)
        out = b"".join(parts)
    if len(out) != expanded_size:
        raise ValueError(f"the entries expand to {len(out)} bytes, not {expanded_size}")
    return out


try:
    from loghub.wire._logcheck import expand as _compiled_expand  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # built without a C compiler: the same answers, slower
    expand = expand_python
else:
    # One new buffer, decoded into in place, with the GIL released: the reference decoder
    # returns a copy of its own buffer, which for a pull of megabytes is a second fresh
    # allocation and its page faults.
    expand = _compiled_expand


def _token(out: bytearray, literals: int, match_nibble: int) -> None:
    if literals < 15:
        out.append((literals << 4) | match_nibble)
        return
    out.append(0xF0 | match_nibble)
    rest = literals - 15
    out += b"\xff" * (rest // 255)
    out.append(rest % 255)


class _Joiner:
    """Writes sequences of LZ4 blocks into one block (see the module docstring)."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.pending: list[bytes | memoryview] = []  # literals not written yet

    def join(self, prefix: bytes, block: memoryview, last: int) -> None:
        """Appends ``prefix`` (as literals) then ``block``, whose last sequence is at
        ``last``; the block's last literals wait for what comes next."""
        if prefix:
            self.pending.append(prefix)
        literals, literals_at, match_nibble = _literal_run(block, 0)
        if last == 0:  # one run of literals: all of it waits for the next match
            self.pending.append(block[literals_at : literals_at + literals])
            return
        waiting = b"".join(self.pending)
        self.pending.clear()
        _token(self.out, len(waiting) + literals, match_nibble)
        self.out += waiting
        self.out += block[literals_at:last]
        tail, tail_at, _nibble = _literal_run(block, last)
        self.pending.append(block[tail_at : tail_at + tail])

    def join_plain(self, plain: memoryview) -> None:
        """Appends bytes that are not compressed yet: compressed as one block first."""
        block = memoryview(lz4.block.compress(plain, store_size=False))
        last = lz4_last_sequence(block)
        assert last >= 0, "lz4 wrote a block its own walk does not end"
        self.join(b"", block, last)

    def finish(self) -> bytes:
        waiting = b"".join(self.pending)
        _token(self.out, len(waiting), 0)
        self.out += waiting
        return bytes(self.out)


def lz4_reply_python(data: bytes | bytearray | memoryview) -> tuple[bytes, int]:
    """One LZ4 block of the serialized ``LogGroupList`` of stored entries, and its raw size:
    what a pull answers with ``x-log-compresstype: lz4``. Stored blocks are joined as they
    are; each run of framed entries is compressed first."""
    joiner = _Joiner()
    raw_total = 0
    with memoryview(data) as view:
        plain_from = -1
        for start, end, raw_size, last in _entries(view):
            if raw_size < 0:
                if plain_from < 0:
                    plain_from = start
                raw_total += end - start
                continue
            if plain_from >= 0:
                joiner.join_plain(view[plain_from:start])
                plain_from = -1
            block = view[start + LZ4_ENTRY_HEAD_BYTES : end]
            joiner.join(log_group_list_entry_head(raw_size), block, last)
            raw_total += expanded_size(raw_size)
        if plain_from >= 0:
            joiner.join_plain(view[plain_from:])
        return joiner.finish(), raw_total


try:
    from loghub.wire._logcheck import lz4_join as _compiled_join  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # built without a C compiler: the same answers, slower
    _compiled_join = None


def lz4_reply(data: bytes | bytearray | memoryview) -> tuple[bytes, int]:
    """``lz4_reply_python``'s answer; entries that are all kept blocks (what LogHub stores
    for SDK writers) are joined by the compiled twin, at a few ns per entry instead of a
    few us, which is what a pull of 1,000 small groups is made of."""
    if _compiled_join is not None:
        joined: tuple[bytes, int] | None = _compiled_join(data)
        if joined is not None:
            return joined
    return lz4_reply_python(data)
