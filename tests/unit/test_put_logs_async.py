"""LogHubService.put_logs_async: small bodies are checked on the event loop, large ones by
the offload (a thread), so a body of megabytes never stalls the loop."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lz4.block

from loghub._clock import SystemClock
from loghub.server.config import ServerConfig
from loghub.server.service import LogHubService, loop_body_bytes_max
from loghub.wire.logs import make_log_group


def _body(value_bytes: int) -> tuple[bytes, int]:
    raw = make_log_group([(1_700_000_000, {"k": os.urandom(value_bytes // 2).hex()})])
    data = raw.SerializeToString()
    return bytes(lz4.block.compress(data, store_size=False)), len(data)


def test_only_bodies_over_the_loop_limit_are_checked_off_the_loop(tmp_path: Path) -> None:
    service = LogHubService(ServerConfig(data_dir=tmp_path / "data", port=0), SystemClock())
    service.metadata.create_project("offload", "test")
    service.create_logstore("offload", {"logstoreName": "store", "ttl": 7, "shardCount": 1})
    offloaded: list[str] = []

    async def offload(fn: Callable[..., Any], *args: Any) -> Any:
        offloaded.append(getattr(fn, "__name__", repr(fn)))
        return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args))

    async def put(body: bytes, raw_size: int) -> int:
        return await service.put_logs_async(
            "offload", "store", "0", None, body, "lz4", raw_size, offload
        )

    small, small_raw = _body(1000)
    large, large_raw = _body(2 * loop_body_bytes_max)
    try:
        assert asyncio.run(put(small, small_raw)) == 0
        assert offloaded == []
        assert asyncio.run(put(large, large_raw)) == 1
        assert offloaded == ["checked_raw"]
    finally:
        service.close()
