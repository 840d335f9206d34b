"""The one-pass LogGroup check gives the protobuf runtime's verdict on every input.

Three implementations are held to one answer: the compiled walk (``_logcheck.c``), its
pure-Python twin (``scan_python``), and the reference, which is what the server did before:
upb's parse of the whole body followed by its required-field check. The walks must agree with
each other exactly (status, log count, offset of the broken field, index of the incomplete
log), and with the reference on the verdict: malformed, missing a required field, or the
number of logs.

Inputs: valid groups as the SDK builds them, groups written by hand with everything the
writers never do (unknown fields of every wire type, known fields with the wrong wire type,
groups, padded varints, required fields left out or repeated, bytes that are not UTF-8),
and those mutated (cut, flipped, spliced); the fuzz corpus of tests/integration/test_fuzz.py;
and explicit cases, each measured against upb.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import lz4.block
import pytest
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]  # no stubs
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from loghub.errors import PostBodyInvalid
from loghub.wire import logcheck
from loghub.wire.logs import make_log_group
from loghub.wire.proto import LogGroup

try:
    from loghub.wire._logcheck import scan as compiled_scan  # type: ignore[import-not-found]
except ImportError:  # reported by test_the_compiled_walk_is_built
    compiled_scan = None

Verdict = int | str  # a log count, "malformed" or "missing"


def reference(raw: bytes) -> Verdict:
    """The check as the server made it before: upb's parse, then its required fields."""
    message = LogGroup()
    try:
        message.ParseFromString(raw)
    except DecodeError:
        return "malformed"
    if message.FindInitializationErrors():
        return "missing"
    return len(message.Logs)


def verdict(scan: logcheck.Scan) -> Verdict:
    status, log_count, _where, _index = scan
    if status == logcheck.OK:
        return log_count
    return "malformed" if status <= logcheck.MALFORMED_DEPTH else "missing"


def assert_same(raw: bytes) -> Verdict:
    """All three agree on raw; returns the verdict."""
    python = logcheck.scan_python(raw)
    expected = reference(raw)
    assert verdict(python) == expected, (raw.hex(), python, expected)
    if compiled_scan is not None:
        assert compiled_scan(raw) == python, raw.hex()
    return expected


def test_the_compiled_walk_is_built() -> None:
    assert compiled_scan is not None, (
        "loghub.wire._logcheck was not built: run `make setup` "
        "or `python setup.py build_ext --inplace`"
    )
    assert logcheck.IMPLEMENTATION == "compiled"


# -- a hand-written protobuf encoder, so tests can write what the writers never do ---------


def varint(value: int, padding: int = 0) -> bytes:
    """value as a varint, with `padding` extra bytes that add nothing (still valid)."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    if padding:
        out[-1] |= 0x80
        out += b"\x80" * (padding - 1) + b"\x00"
    return bytes(out)


def tag(field: int, wire_type: int, padding: int = 0) -> bytes:
    return varint(field << 3 | wire_type, padding)


def delimited(field: int, payload: bytes, padding: int = 0) -> bytes:
    return tag(field, 2) + varint(len(payload), padding) + payload


def group(field: int, inner: bytes) -> bytes:
    return tag(field, 3) + inner + tag(field, 4)


# Extra bytes in a varint: up to 4 in a tag and 9 in a value are allowed, 5 and 10 are not
# (those only now and then, or nearly every body would be malformed).
paddings = st.sampled_from([0, 0, 0, 0, 0, 0, 1, 4, 9])
tag_paddings = st.sampled_from([0] * 20 + [1, 4, 5])
overlong_paddings = st.sampled_from([0] * 20 + [9, 10])
# the known numbers most often: under another wire type, they are unknown fields
field_numbers = st.sampled_from([1, 1, 1, 2, 2, 4, 6, 3, 7, 15, 16, 2047, 2**29 - 1])
text = st.binary(max_size=10) | st.text(max_size=6).map(str.encode)  # often not UTF-8
times = st.integers(0, 2**64 - 1)
repeats = st.sampled_from([1, 1, 1, 1, 0, 2])  # a required field: usually once
orders = st.integers(0, 2**16)  # the seed of a shuffle: fields in any order

# A field of any wire type under any number (a known number too: with another wire type, it
# is an unknown field); groups hold such fields, nested.
unknown_fields = st.recursive(
    st.builds(
        lambda n, t, p, v: tag(n, 0, t) + varint(v, p),
        field_numbers,
        tag_paddings,
        overlong_paddings,
        times,
    )
    | st.builds(lambda n, b: tag(n, 5) + b, field_numbers, st.binary(min_size=4, max_size=4))
    | st.builds(lambda n, b: tag(n, 1) + b, field_numbers, st.binary(min_size=8, max_size=8))
    | st.builds(delimited, field_numbers, st.binary(max_size=12), paddings),
    lambda inner: st.builds(
        lambda n, fields: group(n, b"".join(fields)), field_numbers, st.lists(inner, max_size=3)
    ),
    max_leaves=6,
)
some_unknown_fields = st.lists(unknown_fields, max_size=2)


def shuffled(fields: list[bytes], seed: int) -> bytes:
    random.Random(seed).shuffle(fields)
    return b"".join(fields)


@st.composite
def pairs(draw: st.DrawFn) -> bytes:
    """A Content or a LogTag: usually Key and Value, sometimes one missing or twice."""
    fields = []
    for number in (1, 2):
        for _ in range(draw(repeats)):
            fields.append(delimited(number, draw(text), draw(paddings)))
    return shuffled(fields + draw(some_unknown_fields), draw(orders))


some_pairs = st.lists(pairs(), max_size=4)


@st.composite
def logs(draw: st.DrawFn) -> bytes:
    fields = [tag(1, 0, draw(paddings)) + varint(draw(times)) for _ in range(draw(repeats))]
    fields += [delimited(2, content) for content in draw(some_pairs)]
    if draw(st.booleans()):
        fields.append(tag(4, 5) + draw(st.binary(min_size=4, max_size=4)))  # Time_ns
    return shuffled(fields + draw(some_unknown_fields), draw(orders))


some_logs = st.lists(logs(), max_size=5)
string_fields = st.lists(st.sampled_from([2, 3, 4, 5]), max_size=3)  # Reserved, Topic, ...


@st.composite
def log_groups(draw: st.DrawFn) -> bytes:
    fields = [delimited(1, log, draw(paddings)) for log in draw(some_logs)]
    fields += [delimited(6, pair) for pair in draw(some_pairs)]
    fields += [delimited(number, draw(text)) for number in draw(string_fields)]
    return shuffled(fields + draw(some_unknown_fields), draw(orders))


mutation_counts = st.sampled_from([0, 0, 1, 2, 3])
operations = st.sampled_from(["cut", "flip", "insert", "delete", "repeat"])


@st.composite
def mutated(draw: st.DrawFn, bodies: st.SearchStrategy[bytes]) -> bytes:
    body = bytearray(draw(bodies))
    for _ in range(draw(mutation_counts)):
        where = draw(st.integers(0, len(body)))
        operation = draw(operations)
        if operation == "cut":
            del body[where:]
        elif operation == "flip" and where < len(body):
            body[where] = draw(st.integers(0, 255))
        elif operation == "insert":
            body[where:where] = draw(st.binary(min_size=1, max_size=6))
        elif operation == "delete":
            del body[where : where + draw(st.integers(1, 4))]
        elif operation == "repeat":
            body[where:where] = body[draw(st.integers(0, where)) : where]
    return bytes(body)


# -- properties ------------------------------------------------------------------------------


@settings(max_examples=examples(150), deadline=None)
@given(mutated(log_groups()))
def test_every_walk_gives_the_protobuf_verdict(raw: bytes) -> None:
    assert_same(raw)


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**32 - 1),
            st.dictionaries(st.text(max_size=8), st.text(max_size=40), max_size=4),
        ),
        max_size=30,
    ),
    st.text(max_size=20),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5)),
)
def test_groups_the_sdk_builds_are_counted(
    records: list[tuple[int, dict[str, str]]], topic: str, tags: dict[str, str]
) -> None:
    raw = make_log_group(records, topic=topic, tags=tags).SerializeToString()
    assert assert_same(raw) == len(records)


@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_get_the_protobuf_verdict(raw: bytes) -> None:
    assert_same(raw)


def test_the_fuzz_corpus_gets_the_protobuf_verdict() -> None:
    """The PutLogs bodies of tests/integration/test_fuzz.py: groups, groups with 5% of their
    bytes flipped, lz4 blocks of groups sent as if raw, random bytes."""
    rng = random.Random(20261125)
    verdicts = set()
    for _ in range(3000):
        records = [(1_700_000_000 + i, {"k": str(rng.random())}) for i in range(rng.randint(1, 5))]
        raw = make_log_group(records).SerializeToString()
        kind = rng.randrange(4)
        if kind == 1:
            raw = bytes(b ^ 0xFF if rng.random() < 0.05 else b for b in raw)
        elif kind == 2:
            raw = lz4.block.compress(raw, store_size=False)
        elif kind == 3:
            raw = rng.randbytes(rng.randrange(1, 200))
        found = assert_same(raw)
        verdicts.add(found if isinstance(found, str) else "count")
    assert verdicts == {"count", "malformed"}


# -- explicit cases, each verdict measured against upb (protobuf 5.29) -----------------------

LOG = tag(1, 0) + varint(1_700_000_000)
CONTENT = delimited(1, b"k") + delimited(2, b"v")
GROUP = delimited(1, LOG + delimited(2, CONTENT)) + delimited(6, CONTENT)


def nested_groups(count: int) -> bytes:
    inner = b""
    for _ in range(count):
        inner = group(7, inner)
    return inner


CASES: dict[str, tuple[bytes, Verdict]] = {
    "zero logs": (b"", 0),
    "only a topic": (delimited(3, b"t"), 0),
    "a valid group": (GROUP, 1),
    "two logs": (GROUP + delimited(1, LOG), 2),
    "Time_ns": (delimited(1, LOG + tag(4, 5) + b"\0\0\0\0"), 1),
    "Time_ns cut": (delimited(1, LOG + tag(4, 5) + b"\0\0\0"), "malformed"),
    "Time_ns as a varint": (delimited(1, LOG + tag(4, 0) + b"\x05"), 1),
    # required fields
    "a log without Time": (delimited(1, delimited(2, CONTENT)), "missing"),
    "an empty log": (delimited(1, b""), "missing"),
    "Time as bytes": (delimited(1, delimited(1, b"ab")), "missing"),
    "Time as fixed32": (delimited(1, tag(1, 5) + b"\0\0\0\0"), "missing"),
    # no field of the schema is a repeated scalar, so nothing is packed: a scalar written as
    # a packed run is a known number with another wire type, an unknown field
    "Time packed": (delimited(1, delimited(1, varint(5) + varint(6))), "missing"),
    "Time_ns packed": (delimited(1, LOG + delimited(4, b"\0" * 8)), 1),
    "Time twice": (delimited(1, LOG + LOG), 1),
    "a content without Key": (delimited(1, LOG + delimited(2, delimited(2, b"v"))), "missing"),
    "a content without Value": (delimited(1, LOG + delimited(2, delimited(1, b"k"))), "missing"),
    "a content with Key twice": (delimited(1, LOG + delimited(2, CONTENT + CONTENT)), 1),
    "a content Key as a varint": (
        delimited(1, LOG + delimited(2, tag(1, 0) + b"\x01" + delimited(2, b"v"))),
        "missing",
    ),
    "a tag without Key": (GROUP + delimited(6, delimited(2, b"v")), "missing"),
    "a tag without Value": (GROUP + delimited(6, delimited(1, b"k")), "missing"),
    "malformed wins over missing": (delimited(1, b"") + tag(1, 7), "malformed"),
    # strings are not checked for UTF-8 (proto2 in upb)
    "a Key not UTF-8": (
        delimited(1, LOG + delimited(2, delimited(1, b"\xff") + delimited(2, b"\xc0"))),
        1,
    ),
    "a topic not UTF-8": (GROUP + delimited(3, b"\xff\xfe"), 1),
    "a tag not UTF-8": (GROUP + delimited(6, delimited(1, b"\xff") + delimited(2, b"\xed\xa0")), 1),
    # unknown fields are kept, whatever their wire type
    "unknown varint": (GROUP + tag(9, 0) + b"\x01", 1),
    "unknown fixed64": (GROUP + tag(9, 1) + b"\0" * 8, 1),
    "unknown fixed64 cut": (GROUP + tag(9, 1) + b"\0" * 7, "malformed"),
    "unknown delimited holding junk": (GROUP + delimited(9, b"\x0e\xff\xff"), 1),
    "unknown group": (GROUP + group(9, b""), 1),
    "unknown fixed32": (GROUP + tag(9, 5) + b"\0" * 4, 1),
    "unknown fields inside a log": (delimited(1, LOG + delimited(15, b"zz") + group(16, b"")), 1),
    "Logs as a varint": (GROUP + tag(1, 0) + b"\x01", 1),
    "Logs as a group": (GROUP + group(1, LOG), 1),
    "Contents as a group": (delimited(1, LOG + group(2, delimited(1, b"k"))), 1),
    "a topic as a varint": (GROUP + tag(3, 0) + b"\x01", 1),
    "nested unknown groups": (GROUP + group(7, group(8, b"") + delimited(2, b"\xff")), 1),
    # groups
    "an end-group tag at the top": (GROUP + tag(7, 4), "malformed"),
    "an end-group tag in a log": (delimited(1, LOG + tag(7, 4)), "malformed"),
    "an end-group tag in a content": (
        delimited(1, LOG + delimited(2, CONTENT + tag(7, 4))),
        "malformed",
    ),
    "a group ended by another number": (GROUP + tag(7, 3) + tag(8, 4), "malformed"),
    "a group never ended": (GROUP + tag(7, 3), "malformed"),
    "a group holding a bad tag": (GROUP + tag(7, 3) + b"\x0e" + tag(7, 4), "malformed"),
    "100 nested groups at the top": (GROUP + nested_groups(100), 1),
    "101 nested groups at the top": (GROUP + nested_groups(101), "malformed"),
    "99 nested groups in a log": (delimited(1, LOG + nested_groups(99)), 1),
    "100 nested groups in a log": (delimited(1, LOG + nested_groups(100)), "malformed"),
    "98 nested groups in a content": (
        delimited(1, LOG + delimited(2, CONTENT + nested_groups(98))),
        1,
    ),
    "99 nested groups in a content": (
        delimited(1, LOG + delimited(2, CONTENT + nested_groups(99))),
        "malformed",
    ),
    "99 nested groups in a tag": (GROUP + delimited(6, CONTENT + nested_groups(99)), 1),
    "100 nested groups in a tag": (GROUP + delimited(6, CONTENT + nested_groups(100)), "malformed"),
    # tags
    "field number 0": (GROUP + b"\x00\x00", "malformed"),
    "field number 0, delimited": (GROUP + b"\x02\x00", "malformed"),
    "field number 0, end group": (GROUP + b"\x04", "malformed"),
    "wire type 6": (GROUP + b"\x0e", "malformed"),
    "wire type 7": (GROUP + b"\x0f", "malformed"),
    "a tag padded to 5 bytes": (tag(1, 2, padding=4)[:5] + varint(len(LOG)) + LOG, 1),
    "a tag padded to 6 bytes": (bytes([0x8A, 0x80, 0x80, 0x80, 0x80, 0x00, 2]) + LOG, "malformed"),
    "the largest field number": (GROUP + bytes([0xF8, 0xFF, 0xFF, 0xFF, 0x0F, 0x00]), 1),
    "a tag over 32 bits": (GROUP + bytes([0x80, 0x80, 0x80, 0x80, 0x10]), "malformed"),
    "a tag cut": (GROUP + b"\xff", "malformed"),
    # varints and lengths
    "Time in 10 bytes": (delimited(1, tag(1, 0) + b"\xff" * 9 + b"\x7f"), 1),
    "Time in 11 bytes": (delimited(1, tag(1, 0) + b"\xff" * 10 + b"\x01"), "malformed"),
    "a varint cut": (GROUP + tag(9, 0) + b"\xff", "malformed"),
    "a length padded to 10 bytes": (b"\x0a" + varint(len(LOG), padding=9) + LOG, 1),
    "a length padded to 11 bytes": (b"\x0a" + varint(len(LOG), padding=10) + LOG, "malformed"),
    "a length with bit 64 set": (b"\x0a" + bytes([len(LOG) | 0x80] + [0x80] * 8 + [2]) + LOG, 1),
    "a length with bit 63 set": (
        b"\x0a" + bytes([len(LOG) | 0x80] + [0x80] * 8 + [1]) + LOG,
        "malformed",
    ),
    "a length past the end": (b"\x0a" + varint(len(LOG) + 1) + LOG, "malformed"),
    "a length of 2**32 + n": (b"\x0a" + varint(2**32 + len(LOG)) + LOG, "malformed"),
    "a length past its log": (delimited(1, LOG + b"\x12\x05ab"), "malformed"),
    "a length cut": (b"\x0a", "malformed"),
}


@pytest.mark.parametrize("name", CASES)
def test_explicit_case(name: str) -> None:
    raw, expected = CASES[name]
    assert reference(raw) == expected, "upb's verdict changed: update logcheck and this case"
    assert assert_same(raw) == expected


def test_a_group_cut_at_every_byte_gets_the_protobuf_verdict() -> None:
    whole = (
        GROUP
        + delimited(1, LOG + tag(4, 5) + b"\x01\x02\x03\x04" + delimited(2, CONTENT) * 2)
        + delimited(3, b"topic")
        + group(9, tag(1, 1) + b"\0" * 8)
        + delimited(6, CONTENT)
    )
    assert assert_same(whole) == 2
    verdicts = {assert_same(whole[:cut]) for cut in range(len(whole))}
    assert verdicts == {0, 1, 2, "malformed"}  # a cut inside a log is a cut of the group


def test_the_walks_report_the_same_place() -> None:
    """The offset of the broken field, and the first incomplete log and content."""
    log_without_value = LOG + delimited(2, CONTENT) + delimited(2, delimited(1, b"k"))
    raw = GROUP + delimited(1, log_without_value)
    assert logcheck.scan_python(raw) == (logcheck.MISSING_CONTENT_VALUE, 2, 1, 1)
    with pytest.raises(PostBodyInvalid, match=r"lacks required fields: Logs\[1\]\.Contents\[1\]"):
        logcheck.count_logs(raw)
    raw = GROUP + tag(7, 4)
    assert logcheck.scan_python(raw) == (logcheck.MALFORMED_GROUP, 1, len(GROUP), 0)
    with pytest.raises(PostBodyInvalid, match=f"does not end where it must, at byte {len(GROUP)}"):
        logcheck.count_logs(raw)


def test_the_compiled_walk_reads_any_buffer_in_place() -> None:
    assert compiled_scan is not None
    raw = b"junk" + GROUP * 3 + b"junk"
    view = memoryview(raw)[4:-4]
    assert compiled_scan(view) == compiled_scan(bytearray(view)) == logcheck.scan_python(view)
    assert verdict(compiled_scan(view)) == 3
    with pytest.raises(TypeError):
        compiled_scan("not bytes")


def test_a_large_group_gets_the_same_count_from_every_walk() -> None:
    """Over the size at which the compiled walk releases the GIL."""
    records = [(1_700_000_000, {"line": f"{i:06d} " + "x" * 180}) for i in range(2000)]
    raw = make_log_group(records).SerializeToString()
    assert len(raw) > 256 * 1024
    assert assert_same(raw) == 2000
    assert assert_same(raw[:-1]) == "malformed"


def _steps_while(call: Callable[[], object]) -> int:
    """How many steps the calling thread made while another thread was inside ``call``. A
    step is a wake-up from a 0.5 ms sleep that runs Python code, so it needs the GIL: while
    ``call`` holds the GIL the caller makes none (at most one or two at its edges, where the
    interpreter may switch threads), while ``call`` releases it the caller makes about one
    a millisecond, fewer on a loaded machine, whose walk also lasts longer."""
    started = threading.Event()
    window: list[int] = []
    steps = 0

    def run() -> None:
        started.set()
        window.append(steps)
        call()
        window.append(steps)

    thread = threading.Thread(target=run)
    thread.start()
    started.wait()
    while thread.is_alive():
        steps += 1
        time.sleep(0.0005)
    thread.join()
    return window[1] - window[0]


def test_the_compiled_walk_lets_other_threads_run_while_it_walks_a_large_body() -> None:
    """While one thread walks a 64 MiB body, another runs Python code: the walk releases
    the GIL. A call known to hold it (``sum`` over a large bytes object, a C loop) lets the
    other thread make no step, which shows the measure tells the two apart; five tries of
    the walk, since a loaded machine may deschedule the stepping thread for a while."""
    assert compiled_scan is not None
    body = (tag(7, 0) + b"\x01") * (32 << 20)  # unknown varints: the slowest bytes to walk
    held = _steps_while(lambda: sum(body))
    assert held <= 2, held
    tries = []
    for _attempt in range(5):
        tries.append(_steps_while(lambda: compiled_scan(body)))
        if tries[-1] >= 10:
            break
    assert tries[-1] >= 10, tries
    assert compiled_scan(body) == (logcheck.OK, 0, 0, 0)
