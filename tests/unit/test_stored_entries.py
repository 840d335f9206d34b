"""Stored entries (``loghub.wire.stored``): a producer's LZ4 block kept as it came, the pull
replies joined from such blocks, and the walk that finds a block's last sequence, compiled
and in Python, giving the same answers."""

from __future__ import annotations

import random

import lz4.block
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from loghub.wire import stored
from loghub.wire.logs import frame_log_group

try:
    from loghub.wire._logcheck import lz4_last_sequence as compiled_walk  # type: ignore[import-not-found]
except ImportError:  # reported by test_the_compiled_walk_is_built
    compiled_walk = None


def test_the_compiled_walk_is_built() -> None:
    assert compiled_walk is not None, "run `make setup` to build loghub.wire._logcheck"
    assert stored.lz4_last_sequence is compiled_walk
    assert stored.expand is not stored.expand_python
    assert stored._compiled_join is not None


def _group(rng: random.Random, size: int, kind: str) -> bytes:
    """Bytes to compress: text like logs, random (incompressible), or one repeated byte."""
    if kind == "random":
        return rng.randbytes(size)
    if kind == "repeated":
        return bytes([rng.randrange(256)]) * size
    words = [b"GET", b"/api/v1/items", b"200", b"Mozilla/5.0", b"10.0.0.1", b"status"]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + rng.randbytes(rng.randrange(0, 4))
    return bytes(out[:size])


groups = st.tuples(
    st.integers(0, 2**32),
    st.sampled_from([0, 1, 4, 5, 12, 13, 14, 15, 16, 19, 20, 100, 270, 300, 5000, 70_000]),
    st.sampled_from(["text", "random", "repeated"]),
    st.booleans(),  # stored as the producer's lz4 block (else framed)
)


@given(entries=st.lists(groups, min_size=1, max_size=12))
@settings(max_examples=examples(300), deadline=None)
def test_a_reply_joined_from_stored_blocks_decompresses_to_the_log_group_list(
    entries: list[tuple[int, int, str, bool]],
) -> None:
    data = bytearray()
    expected = bytearray()
    for seed, size, kind, as_lz4 in entries:
        raw = _group(random.Random(seed), size, kind)
        entry = stored.lz4_entry(lz4.block.compress(raw, store_size=False), len(raw))
        if not raw:
            assert entry is None  # an empty group is refused before it is stored
        data += entry if as_lz4 and entry is not None else frame_log_group(raw)
        expected += frame_log_group(raw)
    assert stored.expand(data, len(expected)) == expected
    assert stored.expand_python(data, len(expected)) == expected
    block, raw_size = stored.lz4_reply(data)
    assert raw_size == len(expected)
    assert lz4.block.decompress(block, uncompressed_size=raw_size) == expected
    assert stored.lz4_reply_python(data) == (block, raw_size)  # the compiled join's answer
    # every codec a pull may ask for gives the same list
    assert stored.reply_body("", data, len(expected)) == expected


def test_a_block_kept_as_it_came_is_smaller_than_its_group_and_joins_without_recompressing() -> (
    None
):
    rng = random.Random(7)
    raws = [_group(rng, 4000, "text") for _ in range(50)]
    data = b"".join(
        stored.stored_entry("lz4", lz4.block.compress(raw, store_size=False), raw) for raw in raws
    )
    framed = b"".join(frame_log_group(raw) for raw in raws)
    assert len(data) < len(framed) / 2
    block, raw_size = stored.lz4_reply(data)
    assert stored.lz4_reply_python(data) == (block, raw_size)  # the compiled join agrees
    # the joined reply is the stored blocks plus a few bytes of tokens and framing per entry
    assert len(block) <= len(data) + 8 * len(raws)


@pytest.mark.parametrize("codec", [None, "", "zstd", "deflate", "LZ4 "])
def test_only_an_lz4_body_is_kept_compressed(codec: str | None) -> None:
    raw = b"a log group" * 20
    body = lz4.block.compress(raw, store_size=False)
    entry = stored.stored_entry(codec, body, raw)
    if codec == "LZ4 ":
        assert entry[0] == stored.LZ4_ENTRY_MARK
    else:
        assert entry == frame_log_group(raw)


@pytest.mark.parametrize(
    "block",
    [
        b"",  # nothing
        b"\x10",  # literals promised, none there
        b"\xf0",  # a literal length that never ends
        b"\x11a\x01",  # a match with half its offset
        b"\x11a\x00\x00\x00",  # offset 0
        b"\x1fa\x01\x00",  # a match length that never ends
        b"\x10a\x00",  # bytes after the last literals... read as a truncated sequence
    ],
)
def test_a_block_whose_sequences_do_not_end_at_its_end_is_stored_framed(block: bytes) -> None:
    assert stored.lz4_last_sequence_python(block) == -1
    if compiled_walk is not None:
        assert compiled_walk(block) == -1
    raw = b"a log group"
    assert stored.stored_entry("lz4", block, raw) == frame_log_group(raw)


@given(data=st.binary(max_size=300))
@settings(max_examples=examples(2000), deadline=None)
def test_both_walks_agree_on_any_bytes(data: bytes) -> None:
    if compiled_walk is not None:
        assert compiled_walk(data) == stored.lz4_last_sequence_python(data)


@given(seed=st.integers(0, 2**32), size=st.integers(1, 200_000))
@settings(max_examples=examples(200), deadline=None)
def test_both_walks_find_the_last_sequence_of_real_blocks(seed: int, size: int) -> None:
    raw = _group(random.Random(seed), size, "text")
    block = lz4.block.compress(raw, store_size=False)
    last = stored.lz4_last_sequence_python(block)
    assert last >= 0
    if compiled_walk is not None:
        assert compiled_walk(block) == last


def test_entries_that_are_not_stored_entries_are_refused() -> None:
    for data in (b"\x12\x01a", b"\x0a\x05abc", b"\xff\x01\x00"):
        for expand in (stored.expand, stored.expand_python):
            with pytest.raises(ValueError):
                expand(data, 5)
    good = stored.lz4_entry(lz4.block.compress(b"x" * 100, store_size=False), 100)
    assert good is not None
    for expand in (stored.expand, stored.expand_python):
        assert expand(good, 102) == b"\x0a\x64" + b"x" * 100
        for size in (0, 101, 103):  # not what the entries expand to
            with pytest.raises(ValueError):
                expand(good, size)


@given(seed=st.integers(0, 2**32), flips=st.integers(1, 4))
@settings(max_examples=examples(500), deadline=None)
def test_the_compiled_expand_never_reads_or_writes_out_of_bounds_on_damaged_blocks(
    seed: int, flips: int
) -> None:
    """A stored block is one the reference decoder accepted, but the compiled decoder checks
    every bound anyway: damaged input gives ValueError or bytes of the size asked, never a
    crash. Where both decoders accept a damaged block, they agree."""
    rng = random.Random(seed)
    raw = _group(rng, rng.choice([20, 300, 5000]), "text")
    entry = bytearray(stored.lz4_entry(lz4.block.compress(raw, store_size=False), len(raw)) or b"")
    for _ in range(flips):
        entry[rng.randrange(stored.LZ4_ENTRY_HEAD_BYTES, len(entry))] = rng.randrange(256)
    size = stored.expanded_size(len(raw))
    try:
        compiled = stored.expand(bytes(entry), size)
    except ValueError:
        compiled = None
    try:
        reference = stored.expand_python(bytes(entry), size)
    except ValueError:
        reference = None
    if compiled is not None:
        assert len(compiled) == size
        if reference is not None:
            assert compiled == reference
