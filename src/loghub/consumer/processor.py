"""The processor API: what a user writes to consume a logstore.

One processor instance per shard, made by the factory passed to ``ConsumerWorker`` (usually
the class itself), so a processor may keep per-shard state without locks: the worker never
runs two calls of one processor at once, and never runs ``process`` for a shard concurrently
with itself. The life cycle, as the worker drives it::

    initialize(shard_id) ──> process(log_groups, checkpointer) ... ──> shutdown(checkpointer)

- ``process`` gets the log groups of one pull (in shard order) and a ``Checkpointer``. Call
  ``checkpointer.save()`` once the batch is done (cheap: in memory, flushed in the
  background), or ``save(persistent=True)`` to write it at once. Returning a cursor rolls the
  shard back: the next batch starts there (for example ``checkpointer.cursor``, to see this
  batch again). Raising an exception is reported and, by default, the shard resumes from its
  last saved checkpoint (``on_process_error="retry"``), so a failed batch is never skipped
  silently.
- ``shutdown`` is called when the shard moves to another worker, is finished (read-only and
  read to its end) or the worker stops. Save there what you have not saved yet; the worker
  flushes the checkpoint right after.

Why a base class rather than only a protocol: ``initialize`` and ``shutdown`` have useful
defaults (remember the shard id; nothing to add at shutdown), so a processor is one method.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from loghub.wire.proto import LogGroup

if TYPE_CHECKING:
    from loghub.consumer.checkpoint import Checkpointer

__all__ = ["ConsumerProcessor", "ProcessorFactory"]


class ConsumerProcessor:
    """Subclass and override ``process``; ``initialize`` and ``shutdown`` are optional."""

    shard_id: int = -1

    def initialize(self, shard_id: int) -> None:
        """Called once, before the first batch of ``shard_id``."""
        self.shard_id = shard_id

    def process(self, log_groups: Sequence[LogGroup], checkpointer: Checkpointer) -> str | None:
        """Handle one batch; return None, or a cursor of this shard to roll back to."""
        raise NotImplementedError

    def shutdown(self, checkpointer: Checkpointer) -> None:
        """Called once when the worker lets go of the shard. The default does nothing: what
        ``process`` saved is flushed by the worker right after."""


ProcessorFactory = Callable[[], ConsumerProcessor]
