"""The LeaseStore on SQLite or PostgreSQL (SQLAlchemy 2 Core).

Tables, as in ``spec/lease-protocol.md`` (created if missing; several groups share them):

    worker      (consumer_group, logstore_sig, worker_name) PK, created_at, heartbeat_at
    shard_lease (consumer_group, logstore_sig, shard_id) PK, lease_counter, lease_owner,
                consumer_owner, checkpoint, updated_at

Empty strings mean "nobody" in the owner columns. Timestamps are UTC without a zone, from the
writer's wall clock: monitoring and counting registered workers only, never whether a lease
has expired.

Every write is one statement, so one round trip and its own transaction:
- a lease write: ``UPDATE shard_lease SET lease_counter = lease_counter + 1, ... WHERE <key>
  AND lease_counter = :seen``; it won when one row changed;
- a checkpoint: ``UPDATE shard_lease SET checkpoint = ... WHERE <key> AND consumer_owner = :me``;
- creating leases: ``INSERT ... ON CONFLICT DO NOTHING``, so workers racing to create the same
  lease all succeed and the first one's row stays.
On PostgreSQL (READ COMMITTED) a concurrent UPDATE of the same row waits, then re-checks its
WHERE on the new row, so exactly one of two racing compare-and-sets wins. On SQLite every
writer takes the database lock (WAL, busy timeout), so they run one after another.

Where it lives: ``sqlite:////abs/path/leases.db`` for processes on one machine (a local file
system: SQLite's locks do not work over NFS), ``postgresql+psycopg://...`` across machines.

Errors: any database failure is raised as ``DatabaseError`` (from the SQLAlchemy error).
Crash: a write either committed or did not happen; the protocol needs nothing else.
Thread-safety: safe to share between threads (the engine's pool hands out connections).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from loghub._clock import Clock
from loghub._sql import create_engine, sqlite_busy_timeout_ms
from loghub.coordination.lease import LeaseRecord, worker_name_length_max
from loghub.errors import DatabaseError, ParameterInvalid

__all__ = ["SqlLeaseStore", "create_lease_engine", "sqlite_busy_timeout_ms"]

# Names of groups and logstore signatures: the width of their columns.
_key_length_max = 256

_meta = sa.MetaData()
worker_table = sa.Table(
    "worker",
    _meta,
    sa.Column("consumer_group", sa.String(_key_length_max), primary_key=True),
    sa.Column("logstore_sig", sa.String(_key_length_max), primary_key=True),
    sa.Column("worker_name", sa.String(worker_name_length_max), primary_key=True),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("heartbeat_at", sa.DateTime, nullable=False),
)
lease_table = sa.Table(
    "shard_lease",
    _meta,
    sa.Column("consumer_group", sa.String(_key_length_max), primary_key=True),
    sa.Column("logstore_sig", sa.String(_key_length_max), primary_key=True),
    sa.Column("shard_id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("lease_counter", sa.BigInteger, nullable=False),
    sa.Column("lease_owner", sa.String(worker_name_length_max), nullable=False),
    sa.Column("consumer_owner", sa.String(worker_name_length_max), nullable=False),
    sa.Column("checkpoint", sa.Text, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
)

_T = TypeVar("_T")


def create_lease_engine(url: str) -> Engine:
    """An engine for ``sqlite:///path`` or ``postgresql+psycopg://`` (see ``loghub._sql``)."""
    return create_engine(url, "lease")


class SqlLeaseStore:
    """The lease tables of one consumer group of one logstore (``logstore_sig`` identifies
    endpoint, project and logstore)."""

    def __init__(
        self, engine: Engine, consumer_group: str, logstore_sig: str, clock: Clock
    ) -> None:
        for name, value in (("consumer group", consumer_group), ("logstore sig", logstore_sig)):
            if not 0 < len(value) <= _key_length_max:
                raise ParameterInvalid(f"{name} must be 1..{_key_length_max} characters")
        self._engine = engine
        self._group = consumer_group
        self._sig = logstore_sig
        self._clock = clock
        self._guarded(self._create_tables)

    @classmethod
    def open(cls, url: str, consumer_group: str, logstore_sig: str, clock: Clock) -> SqlLeaseStore:
        return cls(create_lease_engine(url), consumer_group, logstore_sig, clock)

    def close(self) -> None:
        self._engine.dispose()

    def _create_tables(self) -> None:
        try:
            _meta.create_all(self._engine)
        except SQLAlchemyError:
            # Another process created them between our check and our CREATE: check again.
            _meta.create_all(self._engine)

    # -- workers -------------------------------------------------------------------------------

    def register_worker(self, worker_name: str) -> None:
        now = self._now()
        values = {
            "consumer_group": self._group,
            "logstore_sig": self._sig,
            "worker_name": worker_name,
            "created_at": now,
            "heartbeat_at": now,
        }
        insert = self._insert(worker_table).values(values)
        statement = insert.on_conflict_do_update(
            index_elements=[c.name for c in worker_table.primary_key],
            set_={"heartbeat_at": now},
        )
        self._execute(statement)

    def heartbeat(self, worker_name: str) -> None:
        statement = (
            sa.update(worker_table)
            .where(self._worker_key(worker_name))
            .values(heartbeat_at=self._now())
        )
        self._execute(statement)

    def remove_worker(self, worker_name: str) -> None:
        self._execute(sa.delete(worker_table).where(self._worker_key(worker_name)))

    def recent_workers(self, within_ms: int) -> list[str]:
        oldest = self._now() - timedelta(milliseconds=within_ms)
        statement = (
            sa.select(worker_table.c.worker_name)
            .where(
                worker_table.c.consumer_group == self._group,
                worker_table.c.logstore_sig == self._sig,
                worker_table.c.heartbeat_at >= oldest,
            )
            .order_by(worker_table.c.worker_name)
        )
        return self._guarded(lambda: self._fetch_names(statement))

    # -- leases --------------------------------------------------------------------------------

    def list_leases(self) -> list[LeaseRecord]:
        statement = self._select_leases().order_by(lease_table.c.shard_id)
        return self._guarded(lambda: self._fetch_records(statement))

    def get_lease(self, shard_id: int) -> LeaseRecord | None:
        statement = self._select_leases().where(lease_table.c.shard_id == shard_id)
        records = self._guarded(lambda: self._fetch_records(statement))
        return records[0] if records else None

    def create_leases(self, shard_ids: Collection[int]) -> None:
        if not shard_ids:
            return
        now = self._now()
        rows = [
            {
                "consumer_group": self._group,
                "logstore_sig": self._sig,
                "shard_id": shard_id,
                "lease_counter": 0,
                "lease_owner": "",
                "consumer_owner": "",
                "checkpoint": "",
                "updated_at": now,
            }
            for shard_id in shard_ids
        ]
        statement = self._insert(lease_table).values(rows).on_conflict_do_nothing()
        self._execute(statement)

    def compare_and_set(
        self, shard_id: int, seen_counter: int, lease_owner: str, consumer_owner: str | None
    ) -> bool:
        values: dict[str, Any] = {
            "lease_counter": lease_table.c.lease_counter + 1,
            "lease_owner": lease_owner,
            "updated_at": self._now(),
        }
        if consumer_owner is not None:
            values["consumer_owner"] = consumer_owner
        statement = (
            sa.update(lease_table)
            .where(self._lease_key(shard_id), lease_table.c.lease_counter == seen_counter)
            .values(values)
        )
        return self._execute(statement) == 1

    def write_checkpoint(self, shard_id: int, consumer_owner: str, checkpoint: str) -> bool:
        statement = (
            sa.update(lease_table)
            .where(self._lease_key(shard_id), lease_table.c.consumer_owner == consumer_owner)
            .values(checkpoint=checkpoint, updated_at=self._now())
        )
        return self._execute(statement) == 1

    # -- plumbing ------------------------------------------------------------------------------

    def _insert(self, table: sa.Table) -> Any:
        """The dialect's INSERT, which has ``on_conflict_do_*``."""
        if self._engine.dialect.name == "postgresql":
            return postgresql.insert(table)
        return sqlite.insert(table)

    def _now(self) -> datetime:
        wall_ms = self._clock.wall_ms()
        return datetime.fromtimestamp(wall_ms / 1000, UTC).replace(tzinfo=None)

    def _worker_key(self, worker_name: str) -> sa.ColumnElement[bool]:
        return sa.and_(
            worker_table.c.consumer_group == self._group,
            worker_table.c.logstore_sig == self._sig,
            worker_table.c.worker_name == worker_name,
        )

    def _lease_key(self, shard_id: int) -> sa.ColumnElement[bool]:
        return sa.and_(
            lease_table.c.consumer_group == self._group,
            lease_table.c.logstore_sig == self._sig,
            lease_table.c.shard_id == shard_id,
        )

    def _select_leases(self) -> sa.Select[Any]:
        columns = lease_table.c
        return sa.select(
            columns.shard_id,
            columns.lease_counter,
            columns.lease_owner,
            columns.consumer_owner,
            columns.checkpoint,
        ).where(columns.consumer_group == self._group, columns.logstore_sig == self._sig)

    def _fetch_records(self, statement: sa.Select[Any]) -> list[LeaseRecord]:
        with self._engine.connect() as connection:
            return [LeaseRecord(*row) for row in connection.execute(statement)]

    def _fetch_names(self, statement: sa.Select[Any]) -> list[str]:
        with self._engine.connect() as connection:
            return [row[0] for row in connection.execute(statement)]

    def _execute(self, statement: sa.Executable) -> int:
        """Run one write in its own transaction; the number of rows it changed."""

        def run() -> int:
            with self._engine.begin() as connection:
                result = connection.execute(statement)
                return int(result.rowcount)

        return self._guarded(run)

    def _guarded(self, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except SQLAlchemyError as exc:
            raise DatabaseError(f"lease store: {exc}") from exc
