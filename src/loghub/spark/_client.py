"""What the data source asks of the service: shard extents, and pulls as raw bytes.

``RawPullClient.pull_raw`` is ``LogHubClient.pull_logs_raw`` in sequence numbers: no
protobuf parse, since the source decodes the bytes itself (``_decode``) and parsing them
twice cost about a third of its time.

A client holds an HTTP connection pool, so it is opened where it is used (in ``read()``,
``latestOffset()``), never in a reader's ``__init__``: readers are pickled.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from loghub.client import LogHubClient
from loghub.errors import InvalidCursor
from loghub.spark.offsets import ShardExtent
from loghub.spark.options import Connection
from loghub.wire.cursor import decode_cursor, encode_cursor

__all__ = ["RawPull", "RawPullClient", "list_extents"]

PULL_GROUPS_MAX = 1000  # the service's limit for one pull


@dataclass(frozen=True)
class RawPull:
    data: bytes  # a serialized LogGroupList
    count: int  # groups in it
    next_seq: int


class RawPullClient(LogHubClient):
    def pull_raw(
        self,
        project: str,
        logstore: str,
        shard_id: int,
        start_seq: int,
        end_seq: int,
        compress_type: str = "lz4",
    ) -> RawPull:
        """Groups from ``start_seq`` up to (not including) ``end_seq``, as many as one pull
        returns, sent compressed with ``compress_type`` ("" for none)."""
        assert 0 <= start_seq < end_seq, (start_seq, end_seq)
        pull = self.pull_logs_raw(
            project,
            logstore,
            shard_id,
            encode_cursor(start_seq),
            min(PULL_GROUPS_MAX, end_seq - start_seq),
            encode_cursor(end_seq),
            compress_type,
        )
        return RawPull(pull.data, pull.count, decode_cursor(pull.next_cursor))

    def iter_range(
        self,
        project: str,
        logstore: str,
        shard_id: int,
        start_seq: int,
        end_seq: int,
        compress_type: str = "lz4",
    ) -> Iterator[RawPull]:
        """Every group of ``[start_seq, end_seq)``; ``InvalidCursor`` when the service no
        longer (or does not yet) hold all of them."""
        seq = start_seq
        while seq < end_seq:
            pull = self.pull_raw(project, logstore, shard_id, seq, end_seq, compress_type)
            if pull.count == 0 or pull.next_seq != seq + pull.count:
                raise InvalidCursor(
                    f"shard {shard_id}: groups [{seq}, {end_seq}) should be readable, but a "
                    f"pull returned {pull.count} ending at {pull.next_seq}"
                )
            yield pull
            seq = pull.next_seq


def list_extents(
    client: LogHubClient, connection: Connection, at_time_s: int | None = None
) -> list[ShardExtent]:
    """Every shard of the logstore with the groups it holds now (and, with ``at_time_s``,
    the position of the first group received at or after then)."""
    project, logstore = connection.project, connection.logstore
    extents = []
    for shard in client.list_shards(project, logstore):
        shard_id = shard.shard_id
        begin = decode_cursor(client.get_cursor(project, logstore, shard_id, "begin"))
        if shard.end_cursor is not None:
            end = decode_cursor(shard.end_cursor)
        else:
            end = decode_cursor(client.get_cursor(project, logstore, shard_id, "end"))
        at_time = None
        if at_time_s is not None:
            at_time = decode_cursor(client.get_cursor(project, logstore, shard_id, at_time_s))
        extents.append(
            ShardExtent(
                shard_id,
                begin,
                max(begin, end),
                read_only=not shard.writable,
                parents=shard.parents,
                at_time=at_time,
            )
        )
    return sorted(extents, key=lambda extent: extent.shard_id)
