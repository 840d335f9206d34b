"""Freed memory stays in the worker for the next batch, instead of going back to the system.

A worker decodes batch after batch of about the same size: each is parsed into a fresh set
of protobuf objects (several times its raw bytes) and freed when ``process`` returns. glibc's
malloc gives freed memory at the top of a heap back to the system once more than 128 KiB is
free (and grows heaps in small steps), so every batch faulted its pages in again: a catch-up
of 1 M logs took about 205,000 page faults and a third of the worker's CPU time
(``benchmarks/consumer_vs_sdk.py``). Keeping up to twice the memory budget free, and growing
heaps a budget at a time, cut that to about 20,000 faults and the worker's CPU per log to the
official SDK's. It does not raise the peak, which the budget bounds (``budget.py``): the
memory kept is memory the worker already held, and it is used again for the next batches.

Process-wide (malloc has one set of settings); Linux with glibc only, elsewhere nothing.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1  # from <malloc.h>
_M_TOP_PAD = -2


def keep_freed_memory(budget_bytes: int) -> None:
    """Keeps up to ``2 * budget_bytes`` of freed memory for reuse; heaps grow by
    ``budget_bytes`` (address space only: pages count once touched)."""
    assert budget_bytes > 0
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return
    int_max = 2**31 - 1  # mallopt takes an int
    mallopt(_M_TRIM_THRESHOLD, min(2 * budget_bytes, int_max))
    mallopt(_M_TOP_PAD, min(budget_bytes, int_max))
