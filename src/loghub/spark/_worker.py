"""What a Python worker is set up with before the source's code first runs in it, once per
process: the executors' workers (``read()``) and the workers that plan (``schema()``,
``reader()``, ``streamReader()``).

pyspark reuses its workers for task after task and query after query
(``spark.python.worker.reuse``), so these settings pay off over a worker's whole life. Both
are about memory:

- **The garbage collector** (``_freeze_heap``): a worker holds about 70,000 objects before the
  source first runs in it (pyspark, pyarrow, protobuf, this package, and the HTTP client's
  modules, imported first for the purpose), and every task or
  planning request leaves enough survivors to start a full collection about once a request.
  A full collection walks every one of those objects: 40 ms of CPU each, about a third of an
  executor worker's CPU in a streaming read here, and five sixths of the planning workers' CPU
  (about 55 of 65 ms a batch read, before any task can start). ``gc.freeze`` moves them out
  of every later collection's reach, after one full collection so that no garbage is frozen;
  what is frozen is what the worker keeps anyway (modules, classes, caches), and it is still
  freed by reference counting.
- **glibc's malloc** (``_keep_freed_memory``): each pull decompresses to one buffer of up to
  16 MiB, twice over (python-lz4 decompresses into a buffer of its own and copies that into
  the bytes it returns). With glibc's defaults every one of those buffers was new memory
  from the kernel: freeing the last one gave the top of the heap back (``M_TRIM_THRESHOLD``),
  so the next one page-faulted its way in again, about 8,000 faults and 20-35 ms a pull
  instead of 4-5 ms. Measured over reads of 300,000 rows on 2 cores: the worker processes
  used 0.25 s of CPU a read with the defaults and 0.17 s with the heap kept. The price: a
  worker keeps up to ``_TRIM_BYTES`` of freed memory for its next task instead of returning
  it, on top of what it uses. Only on glibc, where ``mallopt`` exists; elsewhere nothing
  changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import importlib
import logging
import platform
import threading

__all__ = ["prepare"]

log = logging.getLogger("loghub.spark")

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Freed memory at the top of the heap is given back only past this much: more than the
# buffers of one pull and its decoding together.
_TRIM_BYTES = 128 * 1024 * 1024
# Allocations from this size on get memory of their own, given back when freed (glibc's
# largest setting): a pull's buffers, at most 16 MiB, come from the heap instead.
_MMAP_BYTES = 32 * 1024 * 1024

_prepared = False
_lock = threading.Lock()


def prepare() -> None:
    """Sets up this process for reads, the first time only; thread-safe."""
    global _prepared
    with _lock:
        if _prepared:
            return
        _freeze_heap()
        _keep_freed_memory()
        _prepared = True


def _freeze_heap() -> None:
    # httpx imports httpcore, and httpcore its async backends (trio, attrs, h11: about 8,700
    # objects), only when the first connection is made, which is after this: import it now,
    # or every later collection would walk them.
    importlib.import_module("httpcore")
    gc.collect()
    gc.freeze()


def _keep_freed_memory() -> bool:
    """Raises glibc's trim and mmap thresholds (see the module's docstring); False where
    that is not glibc or it refused."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # setting either turns off glibc's own adjustment of both; mallopt returns 1 on success
    kept = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_BYTES) == 1)
    kept = bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_BYTES) == 1) and kept
    if not kept:
        log.info("glibc refused the malloc thresholds; the worker keeps its defaults")
    return kept
