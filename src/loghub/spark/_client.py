"""What the data source asks of the service: shard extents, and pulls as raw bytes.

``RawPullClient.pull_raw`` is ``LogHubClient.pull_logs_raw`` in sequence numbers: no
protobuf parse, since the source decodes the bytes itself (``_decode``) and parsing them
twice cost about a third of its time.

A client holds an HTTP connection pool, so it is opened where it is used (in ``read()``,
``latestOffset()``), never in a reader's ``__init__``: readers are pickled.

In a LogHub cluster any node answers a pull, passing it on to the node that holds the shard
when that is another one: a hop that carries every byte twice. ListShards names each shard's
node there, so ``ShardPulls`` sends a range's pulls to that node itself, marked owner-only;
when the node cannot be reached or says the shard is no longer its own (the shard moved
after planning), the rest of the range is pulled through the connection's endpoint, which
finds the shard wherever it is now.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from loghub.client import LogHubClient
from loghub.errors import InvalidCursor, ServerBusy, TransportError
from loghub.spark.offsets import ShardExtent
from loghub.spark.options import Connection
from loghub.wire.cursor import decode_cursor, encode_cursor
from loghub.wire.logs import OWNER_ONLY_HEADER

__all__ = ["RawPull", "RawPullClient", "ShardPulls", "list_extents", "node_endpoint"]

log = logging.getLogger("loghub.spark")

PULL_GROUPS_MAX = 1000  # the service's limit for one pull


@dataclass(frozen=True)
class RawPull:
    data: bytes  # a serialized LogGroupList
    count: int  # groups in it
    next_seq: int


class RawPullClient(LogHubClient):
    owner_only = False  # set on a client of the node that holds the shard (see ShardPulls)

    def _signed_headers(
        self,
        method: str,
        project: str | None,
        path: str,
        query: Sequence[tuple[str, str]],
        body: bytes,
        headers: Mapping[str, str] | None,
    ) -> dict[str, str]:
        # every request's headers are made here, whichever HTTP way it takes (pulls have
        # connections of their own), so the mark is on each one, and signed with it
        if self.owner_only:
            headers = {**(headers or {}), OWNER_ONLY_HEADER: "1"}
        return super()._signed_headers(method, project, path, query, body, headers)

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


def node_endpoint(endpoint: str, node_address: str) -> str:
    """The URL of a cluster node at ``node_address`` (host:port), with the scheme of the
    connection's ``endpoint``: the nodes of one cluster all speak http or all https."""
    https = endpoint.strip().lower().startswith("https://")
    return f"{'https' if https else 'http'}://{node_address}"


class ShardPulls:
    """The pulls of one shard range, from the node holding the shard when the shard list
    named one, else (and once that node fails) through the connection's endpoint."""

    def __init__(self, connection: Connection, node_address: str | None) -> None:
        self._connection = connection
        self.from_node = node_address is not None
        if node_address is None:
            self.client = connection.client_of(RawPullClient)
        else:
            direct = dataclasses.replace(
                connection, endpoint=node_endpoint(connection.endpoint, node_address)
            )
            self.client = direct.client_of(RawPullClient)
            self.client.owner_only = True

    def close(self) -> None:
        self.client.close()

    def iter_range(
        self, shard_id: int, start_seq: int, end_seq: int, compress_type: str = "lz4"
    ) -> Iterator[RawPull]:
        """Every group of ``[start_seq, end_seq)``; ``InvalidCursor`` when the service no
        longer (or does not yet) hold all of them."""
        project, logstore = self._connection.project, self._connection.logstore
        seq = start_seq
        while seq < end_seq:
            try:
                pull = self.client.pull_raw(project, logstore, shard_id, seq, end_seq,
                                            compress_type)  # fmt: skip
            except (TransportError, ServerBusy) as exc:
                if not self.from_node:
                    raise
                log.info("shard %d: its node failed (%s); pulling through %s", shard_id, exc,
                         self._connection.endpoint)  # fmt: skip
                self._fall_back()
                continue
            if pull.count == 0 or pull.next_seq != seq + pull.count:
                raise InvalidCursor(
                    f"shard {shard_id}: groups [{seq}, {end_seq}) should be readable, but a "
                    f"pull returned {pull.count} ending at {pull.next_seq}"
                )
            yield pull
            seq = pull.next_seq

    def _fall_back(self) -> None:
        self.client.close()
        self.client = self._connection.client_of(RawPullClient)
        self.from_node = False


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
                node_address=shard.node_address,
            )
        )
    return sorted(extents, key=lambda extent: extent.shard_id)
