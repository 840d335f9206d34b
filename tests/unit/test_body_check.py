"""Checking a large PutLogs body a slice at a time gives the verdict and the log count of
parsing it whole, for any body: whole groups, truncated ones, junk, unknown fields."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loghub.errors import LogHubError, PostBodyInvalid
from loghub.server.validation import count_logs
from loghub.wire.logs import make_log_group, parse_log_group

SLICE_BYTES = 64  # tiny, so that even small bodies are cut into many slices


def _whole(raw: bytes) -> int | str:
    try:
        return len(parse_log_group(raw).Logs)
    except LogHubError as exc:
        return exc.code


def _sliced(raw: bytes) -> int | str:
    try:
        return count_logs(raw, SLICE_BYTES)
    except LogHubError as exc:
        return exc.code


_records = st.lists(
    st.tuples(
        st.integers(0, 2**32 - 1),
        st.dictionaries(st.text(max_size=8), st.text(max_size=40), max_size=4),
    ),
    max_size=30,
)


@settings(derandomize=True, max_examples=150, deadline=None)
@given(_records, st.text(max_size=20), st.dictionaries(st.text(max_size=5), st.text(max_size=5)))
def test_sliced_check_counts_what_a_whole_parse_counts(
    records: list[tuple[int, dict[str, str]]], topic: str, tags: dict[str, str]
) -> None:
    raw = make_log_group(records, topic=topic, tags=tags).SerializeToString()
    assert _sliced(raw) == _whole(raw) == len(records)


@settings(derandomize=True, max_examples=150, deadline=None)
@given(_records, st.data())
def test_sliced_check_refuses_what_a_whole_parse_refuses(
    records: list[tuple[int, dict[str, str]]], data: st.DataObject
) -> None:
    raw = make_log_group(records).SerializeToString()
    cut = data.draw(st.integers(0, len(raw)))
    junk = data.draw(st.binary(max_size=40))
    for body in (raw[:cut], raw[:cut] + junk, junk + raw[cut:]):
        assert _sliced(body) == _whole(body), body


def test_a_log_missing_its_time_is_refused_sliced() -> None:
    log_without_time = b"\x12\x06\x0a\x01k\x12\x01v"  # Contents only; Time is required
    entry = b"\x0a" + bytes([len(log_without_time)]) + log_without_time
    body = make_log_group([(1, {"k": "v"})] * 20).SerializeToString() + entry
    assert len(body) > 2 * SLICE_BYTES
    with pytest.raises(PostBodyInvalid):
        count_logs(body, SLICE_BYTES)
