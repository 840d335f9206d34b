"""Large buffers go back to the system when freed, so the server's size follows its load.

glibc's malloc serves a large block with mmap and unmaps it on free, but after the first
such free it raises its threshold up to 32 MiB, and from then on a 30 MiB request body is
carved from a heap of the thread that asked, where it stays after it is freed. With dozens
of storage threads, each heap keeps the largest bodies it ever held: six 30 MiB bodies
handled one after another grew the server by 263 MiB (benchmarks/big_bodies.py). Fixing the
threshold (which also turns off its adjustment) keeps every block over it mapped on its own.
Blocks under it are small enough for the heaps to reuse.

Linux with glibc only; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["return_large_buffers_to_os"]

_M_MMAP_THRESHOLD = -3  # from <malloc.h>
_MMAP_THRESHOLD_BYTES = 1024 * 1024


def return_large_buffers_to_os() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
