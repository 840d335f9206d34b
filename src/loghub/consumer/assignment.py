"""Assignment: where a worker's shards come from, behind one small interface.

The worker and its shard consumers do not care whether shards are handed out by the server's
consumer group (``heartbeat.HeartbeatAssignment``) or taken as leases in a SQL database
(``leases.LeaseAssignment``); both run their own thread, which talks to the network or the
database, and answer the worker's questions from memory:

- ``assigned()``: the shards this worker should run now. A shard that leaves the set must be
  stopped: processing ends, its checkpoint is written, and only then does ``set_held`` stop
  listing it.
- ``may_consume(shard)``: asked before every batch. False once this worker may no longer be
  sure the shard is still its own (it could not heartbeat or renew for too long): a worker
  that cannot prove it holds a shard stops by itself rather than risk a second consumer.
- ``read_checkpoint``/``write_checkpoint``: the durable checkpoint, fenced: a write by a
  worker that no longer holds the shard fails with ``LeaseLostError``.
- ``set_held(shards)``: the shards that still have a consumer here (in any state), which a
  heartbeat must keep reporting so that nobody else is given them yet.
- ``mark_finished(shard)``: the shard is read-only and its end checkpoint is written.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from loghub.client import ShardInfo

__all__ = ["Assignment", "Wake"]

# Called by an assignment's thread when ``assigned()`` or the shard list changed.
Wake = Callable[[], None]


class Assignment(Protocol):
    def start(self) -> None:
        """Set up (create the consumer group, open the lease store) and start the thread.
        Raises what the set-up raised: a worker with a wrong group or URL fails at once."""
        ...

    def assigned(self) -> frozenset[int]: ...

    def shards(self) -> Mapping[int, ShardInfo]:
        """The logstore's shards as last listed (read-only ones with their end cursor)."""
        ...

    def set_held(self, shard_ids: Collection[int]) -> None: ...

    def may_consume(self, shard_id: int) -> bool: ...

    def read_checkpoint(self, shard_id: int) -> str:
        """The shard's durable checkpoint, "" when it has none."""
        ...

    def write_checkpoint(self, shard_id: int, cursor: str) -> None: ...

    def mark_finished(self, shard_id: int) -> None: ...

    def shutdown(self) -> None:
        """Leave: called after every shard was stopped and its checkpoint written."""
        ...
