"""An executor's Python worker keeps the memory of one pull for the next (``spark/_worker``):
with glibc's defaults, decompressing a 16 MiB pull page-faulted all of its buffers in again
every time, which cost a read more CPU than decoding it. Each check runs in a fresh process,
since the settings are process-wide."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

# Decompresses a 16 MB pull four times, as an executor does, and prints the page faults of
# each round.
_PULLS = textwrap.dedent(
    """
    import resource, sys
    import lz4.block
    from loghub.spark import _worker
    if sys.argv[1] == "prepared":
        _worker.prepare()
        _worker.prepare()  # the second call changes nothing
    raw = bytes(range(256)) * 62_500
    block = lz4.block.compress(raw, store_size=False)
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        pulled = lz4.block.decompress(block, uncompressed_size=len(raw))
        del pulled
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(mode: str) -> list[int]:
    done = subprocess.run(
        [sys.executable, "-c", _PULLS, mode], capture_output=True, text=True, timeout=60, check=True
    )
    return [int(line) for line in done.stdout.split()]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_prepared_worker_reuses_the_memory_of_its_last_pull() -> None:
    default, prepared = _faults("default"), _faults("prepared")
    # 16 MB is about 3,900 pages, and a pull needs two such buffers
    assert min(default[1:]) > 3_000, default  # glibc gives them back and faults them in again
    assert max(prepared[1:]) < 100, prepared  # kept: only the first pull faults
