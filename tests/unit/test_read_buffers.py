"""Pulls read into buffers kept between pulls: the total kept is bounded, and no reply shares
memory with a buffer that a later pull writes into."""

from __future__ import annotations

from pathlib import Path

import lz4.block
import pytest

from loghub._clock import SystemClock
from loghub.server.config import Limits, ServerConfig
from loghub.server.read_buffers import ReadBuffers
from loghub.server.service import LogHubService
from loghub.wire.cursor import encode_cursor
from loghub.wire.logs import frame_log_group, make_log_group


def test_buffers_are_kept_up_to_the_bound_and_the_warmest_comes_back_first() -> None:
    buffers = ReadBuffers(bytes_kept_max=100)
    first, second, large = bytearray(40), bytearray(50), bytearray(20)
    buffers.give_back(first)
    buffers.give_back(second)
    buffers.give_back(large)  # 40 + 50 + 20 would pass 100: freed, not kept
    assert buffers.kept_bytes == 90
    assert buffers.take() is second
    assert buffers.take() is first
    assert buffers.take() == bytearray()  # none left: a new, empty one
    assert buffers.kept_bytes == 0


def test_nothing_is_kept_when_the_bound_is_smaller_than_a_buffer() -> None:
    buffers = ReadBuffers(bytes_kept_max=10)
    buffers.give_back(bytearray(11))
    assert buffers.kept_bytes == 0


def _group(index: int) -> bytes:
    return make_log_group([(1_700_000_000, {"n": str(index) * 50})]).SerializeToString()


@pytest.mark.parametrize("codec", ["", "lz4"])
def test_a_pull_reply_keeps_its_bytes_when_the_next_pull_reuses_the_buffer(
    tmp_path: Path, codec: str
) -> None:
    config = ServerConfig(data_dir=tmp_path / "data", port=0, limits=Limits(pull_bytes_max=400))
    service = LogHubService(config, SystemClock())
    try:
        service.metadata.create_project("buffers", "test")
        service.create_logstore("buffers", {"logstoreName": "store", "ttl": 7, "shardCount": 1})
        groups = [_group(index) for index in range(8)]
        for group in groups:
            service.put_logs("buffers", "store", "0", None, group, None, None)

        def pull(seq: int) -> tuple[bytes, int]:
            result = service.pull_logs("buffers", "store", 0, encode_cursor(seq), 3, None, codec)
            body = result.body
            if codec:
                body = lz4.block.decompress(body, uncompressed_size=result.raw_size)
            return body, result.count

        first_reply = service.pull_logs("buffers", "store", 0, encode_cursor(0), 3, None, codec)
        first, count = pull(0)
        assert service.read_buffers.kept_bytes > 0  # the pull's buffer was kept for the next
        second, second_count = pull(count)
        assert first == b"".join(frame_log_group(g) for g in groups[:count])
        assert second == b"".join(frame_log_group(g) for g in groups[count : count + second_count])
        # the reply made before two more pulls went through the same buffer is unchanged
        body = first_reply.body
        if codec:
            body = lz4.block.decompress(body, uncompressed_size=first_reply.raw_size)
        assert body == first
    finally:
        service.close()
