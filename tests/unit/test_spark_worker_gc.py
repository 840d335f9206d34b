"""The source's first call in a Python worker (a read on an executor, ``schema()`` or
``reader()`` where a read is planned) freezes what the worker already holds (``gc.freeze``),
once per process, after one full collection and after importing what a pull imports on first
use, so that later full collections walk only what tasks allocate. Each check runs in a fresh
interpreter: freezing the test process would change what later tests see of the garbage
collector."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import gc
    import weakref

    from loghub.spark.options import parse_read_options
    from loghub.spark.schema import spark_schema
    from loghub.spark.source import LogHubBatchReader, LogHubDataSource, ShardRange

    full = []
    gc.callbacks.append(
        lambda phase, info: full.append(1) if phase == "start" and info["generation"] == 2 else None
    )

    class Node:
        pass

    cycle = Node()
    cycle.self = cycle
    garbage = weakref.ref(cycle)
    del cycle

    options = {"endpoint": "127.0.0.1:9", "project": "p", "logstore": "s"}
    # an executor gets the reader unpickled: made here without the source's reader()
    reader = LogHubBatchReader(parse_read_options(options, streaming=False))
    assert gc.get_freeze_count() == 0
    assert list(reader.read(object())) == []  # Spark's empty partition: nothing to read
    assert gc.get_freeze_count() == 0, "an empty partition reads nothing and freezes nothing"

    before = len(full)
    first = reader.read(ShardRange(0, 0, 1))  # not iterated: no pull is made
    frozen = gc.get_freeze_count()
    assert len(full) == before + 1, "one full collection before the freeze"
    assert garbage() is None, "garbage is collected, not frozen"
    assert frozen > 10_000, frozen  # pyspark, pyarrow, protobuf and this package

    second = reader.read(ShardRange(1, 0, 1))
    assert gc.get_freeze_count() == frozen, "once per process"
    assert len(full) == before + 1, "no second full collection"
    first.close()
    second.close()

    # A pull's first connection imports nothing that would stay outside the frozen heap (the
    # HTTP client's backends were imported before the freeze): 8,500 objects before.
    try:
        list(reader.read(ShardRange(2, 0, 1)))
    except Exception:  # nothing listens on port 9
        pass
    gc.collect()
    assert len(gc.get_objects()) < 2_000, len(gc.get_objects())
    print("ok", frozen)
    """
)

# Planning: schema() in one worker, reader() in another; each freezes its process once.
_PLANNING = textwrap.dedent(
    """
    import gc

    from loghub.spark.schema import spark_schema
    from loghub.spark.source import LogHubDataSource

    source = LogHubDataSource({"endpoint": "127.0.0.1:9", "project": "p", "logstore": "s"})
    assert gc.get_freeze_count() == 0
    source.schema()
    frozen = gc.get_freeze_count()
    assert frozen > 10_000, frozen
    source.reader(spark_schema())
    source.streamReader(spark_schema())
    source.schema()
    assert gc.get_freeze_count() == frozen, "once per process"
    print("ok", frozen)
    """
)


def _passes_in_a_fresh_interpreter(script: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok "), done.stdout


def test_the_planning_workers_freeze_their_heap_once() -> None:
    _passes_in_a_fresh_interpreter(_PLANNING)


def test_the_first_read_freezes_the_worker_heap_once_after_a_full_collection() -> None:
    _passes_in_a_fresh_interpreter(_SCRIPT)
