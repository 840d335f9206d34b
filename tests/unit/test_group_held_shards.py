"""A heartbeat's body, the shard ids its consumer holds: plain ids take a quick check, and
anything else the same per-id check as before, so both give the same answers."""

from __future__ import annotations

import pytest

from loghub.errors import ParameterInvalid
from loghub.server import groups
from loghub.server.groups import _held_shards


@pytest.mark.parametrize(
    ("held", "ids"),
    [
        ([], []),
        ([0, 3, 2], [0, 3, 2]),
        ([groups._SHARD_ID_MAX], [groups._SHARD_ID_MAX]),
        (list(range(1000)), list(range(1000))),
        (["4", 5], [4, 5]),  # SDKs that send numbers as strings
        ([4.0, 5], [4, 5]),  # and as integral floats
    ],
)
def test_held_shard_ids_are_read(held: list[object], ids: list[int]) -> None:
    assert _held_shards("c1", held) == ids


@pytest.mark.parametrize(
    "held",
    [
        [-1],
        [0, -1],
        [groups._SHARD_ID_MAX + 1],
        [1, True],  # a boolean is not an id, even among ints
        [True],
        [1.5],
        [None],
        [[1]],
        {"0": 1},
        "0",
        7,
    ],
)
def test_anything_else_is_refused(held: object) -> None:
    with pytest.raises(ParameterInvalid):
        _held_shards("c1", held)


def test_the_consumer_is_required_whatever_the_body() -> None:
    for held in ([], [1, 2]):
        with pytest.raises(ParameterInvalid):
            _held_shards("", held)
