"""The read path's record walk: the compiled twin and the pure-Python one give the same answer
for every call, on intact and on damaged segment files, and both give what the format says
(the payloads packed in order, the first damaged record named)."""

from __future__ import annotations

import os
import random
from typing import Any

import crc32c
import lz4.block
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from loghub.storage import _gather
from loghub.storage.segment import HEADER, HEADER_BYTES, encode_header
from loghub.wire import stored

try:
    from loghub.storage._gather_c import crc32c as compiled_crc32c  # type: ignore[import-not-found]
    from loghub.storage._gather_c import gather as compiled_gather
except ImportError:  # reported by test_the_compiled_walk_is_built
    compiled_gather = compiled_crc32c = None

PAYLOAD_BYTES_MAX = 4096


def records(payloads: list[bytes], base_seq: int) -> bytes:
    return b"".join(
        encode_header(base_seq + index, 1_000 + index, payload) + payload
        for index, payload in enumerate(payloads)
    )


def call_both(
    file: bytes, out_size: int, out_offset: int, *args: int | bool, read_max: int | None = None
) -> tuple[Any, ...]:
    """Runs both walks over ``file`` (an in-memory file, as the page cache serves a segment)
    on fresh, equal buffers; asserts they agree (answer and buffer). ``read_max`` defaults to
    the buffer's room after ``out_offset``."""
    read_max = out_size - out_offset if read_max is None else read_max
    answers = []
    buffers = []
    fd = os.memfd_create("segment")
    try:
        os.write(fd, file)
        for walk in (_gather.gather_python, compiled_gather):
            if walk is None:
                continue
            out = bytearray(b"\xee" * out_size)
            answers.append(walk(fd, out, out_offset, *args, read_max))
            buffers.append(out)
    finally:
        os.close(fd)
    assert all(answer == answers[0] for answer in answers), answers
    status, _position, _sequence, out_end, _count, _taken, _loaded = answers[0]
    # the packed bytes (and what precedes them) agree; bytes after out_end are scratch
    assert all(buffer[:out_end] == buffers[0][:out_end] for buffer in buffers)
    return (*answers[0], buffers[0])


def test_the_compiled_walk_is_built() -> None:
    assert compiled_gather is not None, (
        "loghub.storage._gather_c was not built: run `make setup` "
        "or `python setup.py build_ext --inplace`"
    )
    assert _gather.IMPLEMENTATION == "compiled"


def test_the_header_layout_is_the_segments() -> None:
    assert _gather._HEADER.format == HEADER.format and HEADER_BYTES == _gather._HEADER_BYTES


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 26, 64, 1000, 65_537])
def test_the_compiled_crc32c_is_the_packages(size: int) -> None:
    assert compiled_crc32c is not None
    data = random.Random(size).randbytes(size)
    for table in (False, True):
        assert compiled_crc32c(data, 0, table) == crc32c.crc32c(data)
        assert compiled_crc32c(data, 12345, table) == crc32c.crc32c(data, 12345)


def test_a_walk_packs_the_payloads_of_the_range_in_order() -> None:
    payloads = [bytes([index]) * (10 + index) for index in range(20)]
    file = records(payloads, 100)
    size = len(file)
    status, position, sequence, out_end, count, taken, _loaded, out = call_both(
        file, size + 8, 8, 0, size, 100, 103, 110, 1000, 1 << 20, True, False, PAYLOAD_BYTES_MAX
    )
    assert (status, sequence, count) == (_gather.DONE, 110, 7)
    assert bytes(out[8:out_end]) == b"".join(payloads[3:10]) and taken == out_end - 8
    assert position == len(records(payloads[:10], 100))


def test_a_walk_asks_for_room_for_a_record_that_does_not_fit() -> None:
    payloads = [b"a" * 50, b"b" * 500, b"c" * 50]
    file = records(payloads, 0)
    size = len(file)
    status, position, sequence, out_end, count, _taken, _loaded, out = call_both(
        file, 200, 0, 0, size, 0, 0, 3, 10, 1 << 20, True, False, PAYLOAD_BYTES_MAX
    )
    assert (status, sequence, count, position) == (_gather.NEED_ROOM, 1, 1, 80)
    assert bytes(out[:out_end]) == payloads[0]
    # the stopping record's header is intact where the walk left it
    assert HEADER.unpack_from(out, 0 + position)[5] == 500


def test_a_walk_reads_no_more_than_read_max_of_a_larger_buffer() -> None:
    """A kept buffer grown by a large pull must not make a small one read the file up to
    the buffer's size: the walk stops at read_max and asks for room for what is past it."""
    payloads = [bytes([index]) * 100 for index in range(50)]
    file = records(payloads, 0)
    size = len(file)
    read_max = 3 * (HEADER_BYTES + 100) + 10
    status, position, sequence, out_end, count, _taken, loaded_end, out = call_both(
        file, 4 * size, 0, 0, size, 0, 0, 50, 50, 1 << 20, True, False, PAYLOAD_BYTES_MAX,
        read_max=read_max,
    )  # fmt: skip
    assert loaded_end == read_max
    assert (status, sequence, count) == (_gather.NEED_ROOM, 3, 3)
    assert position == 3 * (HEADER_BYTES + 100)
    assert bytes(out[:out_end]) == b"".join(payloads[:3])


def test_the_first_record_is_taken_past_the_byte_limit_only_when_asked() -> None:
    file = records([b"x" * 100, b"y"], 0)
    size = len(file)
    for take_first, expected in ((True, (_gather.LIMIT, 1)), (False, (_gather.LIMIT, 0))):
        answer = call_both(file, size, 0, 0, size, 0, 0, 2, 10, 10, take_first, False, 4096)
        assert (answer[0], answer[4]) == expected


def intact_file(draw: st.DrawFn) -> tuple[list[bytes], int]:
    sizes = draw(st.lists(st.integers(0, 300), min_size=1, max_size=40))
    rng = random.Random(draw(st.integers(0, 2**32)))
    payloads = [rng.randbytes(size) for size in sizes]
    for index, payload in enumerate(payloads):  # some look like lz4 entries: counted expanded
        if len(payload) >= 13 and rng.random() < 0.3:
            payloads[index] = b"\xff" + payload[1:]
    base_seq = draw(st.integers(0, 2**40))
    return payloads, base_seq


@st.composite
def walks(draw: st.DrawFn) -> tuple[bytes, int, int, tuple[int | bool, ...], int]:
    payloads, base_seq = intact_file(draw)
    data = bytearray(records(payloads, base_seq))
    damage = draw(st.sampled_from(["none", "flip", "cut", "zero"]))
    if damage != "none" and data:
        at = draw(st.integers(0, len(data) - 1))
        if damage == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif damage == "cut":
            del data[at:]
        else:
            data[at : at + draw(st.integers(1, 64))] = bytes(min(64, len(data) - at))
    size = len(records(payloads, base_seq))
    # a record boundary to start from, and a limit at or after it
    starts = [0]
    for payload in payloads:
        starts.append(starts[-1] + HEADER_BYTES + len(payload))
    first = draw(st.integers(0, len(payloads) - 1))
    position = starts[first]
    sequence = base_seq + first
    start_seq = sequence + draw(st.integers(0, 3))
    stop_seq = start_seq + draw(st.integers(0, len(payloads)))
    # as a plan makes it: the end of the stop record (or of the file), sometimes elsewhere
    planned = starts[min(stop_seq - base_seq, len(payloads))]
    limit = draw(st.one_of(st.just(planned), st.integers(position, size)))
    out_offset = draw(st.integers(0, 64))
    out_size = out_offset + draw(st.one_of(st.just(size), st.integers(0, size + 64)))
    args = (
        position,
        limit,
        sequence,
        start_seq,
        stop_seq,
        draw(st.integers(0, 50)),  # count_max
        draw(st.one_of(st.just(1 << 20), st.integers(0, 4000))),  # bytes_max
        draw(st.booleans()),  # take_first
        draw(st.booleans()),  # raw
        draw(st.sampled_from([PAYLOAD_BYTES_MAX, 100])),  # payload_bytes_max
    )
    # the room the caller expects to need, often less than the (reused) buffer holds
    read_max = draw(st.one_of(st.just(out_size - out_offset), st.integers(0, size + 64)))
    return bytes(data), out_size, out_offset, args, read_max


def _costs(file: bytes, args: tuple[int | bool, ...], count: int) -> int:
    """What the ``count`` records taken count against bytes_max, from the file's headers:
    whole records when raw; else payload lengths, an lz4 entry its expanded size."""
    position, sequence, start_seq, raw = int(args[0]), int(args[2]), int(args[3]), args[8]
    total = taken = 0
    while taken < count:
        length = HEADER.unpack_from(file, position)[5]
        if sequence >= start_seq:
            payload = file[position + HEADER_BYTES : position + HEADER_BYTES + length]
            if raw:
                total += HEADER_BYTES + length
            elif payload[:1] == b"\xff" and length >= 13:
                total += stored.expanded_size(int.from_bytes(payload[1:5], "little"))
            else:
                total += length
            taken += 1
        position += HEADER_BYTES + length
        sequence += 1
    return total


@settings(max_examples=examples(200), deadline=None)
@given(walk=walks())
def test_both_walks_agree_on_intact_and_damaged_files(
    walk: tuple[bytes, int, int, tuple[int | bool, ...], int],
) -> None:
    file, out_size, out_offset, args, read_max = walk
    status, _position, sequence, out_end, count, taken, loaded_end, _out = call_both(
        file, out_size, out_offset, *args, read_max=read_max
    )
    assert out_offset <= out_end <= loaded_end <= out_size and count >= 0
    assert loaded_end - out_offset <= read_max
    assert taken == _costs(file, args, count)
    if count and status in (_gather.DONE, _gather.LIMIT):
        assert sequence == args[3] + count or sequence == args[4]


@pytest.mark.parametrize("raw", [False, True])
def test_a_damaged_payload_stops_the_walk_at_its_record(raw: bool) -> None:
    payloads = [bytes([index]) * 100 for index in range(5)]
    data = bytearray(records(payloads, 7))
    data[3 * (HEADER_BYTES + 100) - 10] ^= 0x40  # inside the third payload
    status, position, sequence, out_end, count, _taken, _loaded, out = call_both(
        bytes(data), len(data), 0, 0, len(data), 7, 7, 12, 10, 1 << 20, True, raw, PAYLOAD_BYTES_MAX
    )
    assert (status, sequence, count) == (_gather.CRC_MISMATCH, 9, 2)
    assert position == 2 * (HEADER_BYTES + 100)
    kept = data[: 2 * (HEADER_BYTES + 100)] if raw else b"".join(payloads[:2])
    assert bytes(out[:out_end]) == kept


def test_an_lz4_entry_counts_as_the_framed_entry_it_expands_to() -> None:
    """A pull's byte limit and its x-log-bodyrawsize are in raw bytes, whatever is stored."""
    entries = [
        stored.lz4_entry(lz4.block.compress(raw, store_size=False), len(raw))
        for raw in (b"x" * 300, bytes(range(256)) * 3, b"y" * 200_000)
    ]
    assert all(entries)
    payloads = [entry for entry in entries if entry] + [b"\x0a\x03abc"]
    file = records(payloads, 0)
    expanded = [stored.expanded_size(n) for n in (300, 768, 200_000)] + [5]
    out_size = len(file) + 64
    for bytes_max, taken in (
        (1 << 30, sum(expanded)),
        (expanded[0] + expanded[1], expanded[0] + expanded[1]),
        (expanded[0], expanded[0]),
    ):
        answer = call_both(
            file, out_size, 0, 0, len(file), 0, 0, 10, 10, bytes_max, True, False, 1 << 20
        )
        assert answer[5] == taken, answer[:7]
        assert answer[3] == sum(len(p) for p in payloads[: answer[4]])  # the stored bytes moved
