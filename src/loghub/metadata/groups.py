"""Consumer-group definitions and checkpoints, durable in the metadata database.

A consumer group (``spec/consumer-groups.md``) is a child of a logstore with a name, a
timeout and an ``order`` flag; a checkpoint is, per (group, shard), the cursor to resume from,
who wrote it and when. Both survive a server restart: that is what lets a restarted server
hand shards back out without losing anyone's progress. Who holds which shard is NOT stored:
consumers report it in their heartbeats, and the server rebuilds it from them.

Like the rest of the metadata, everything is loaded on open and served from memory; a write
commits first and then replaces the cached value. Checkpoints are written often (every
consumer flushes every few seconds per shard), one small transaction each.

Thread-safety: safe to share between threads; writes hold the store's write lock, readers
see replaced, never mutated, dictionaries.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from loghub.errors import (
    ConsumerGroupAlreadyExist,
    ConsumerGroupNotExist,
    ParameterInvalid,
)

__all__ = [
    "Checkpoint",
    "ConsumerGroupCatalog",
    "ConsumerGroupDef",
    "consumer_groups_per_logstore_max",
    "group_count",
    "group_timeout_s_max",
    "validate_checkpoint",
    "validate_group",
]

# The hosted service allows 30 groups a logstore; room to spare, and still a bound.
consumer_groups_per_logstore_max = 100
group_timeout_s_max = 86_400
_GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{1,127}")
_CHECKPOINT_CHARS_MAX = 1024

GroupKey = tuple[str, str, str]  # project, logstore, group


@dataclass(frozen=True)
class ConsumerGroupDef:
    name: str
    timeout_s: int
    ordered: bool

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "timeout": self.timeout_s, "order": self.ordered}


@dataclass(frozen=True)
class Checkpoint:
    shard_id: int
    cursor: str
    consumer: str
    update_time_us: int

    def to_json(self) -> dict[str, object]:
        return {
            "shard": self.shard_id,
            "checkpoint": self.cursor,
            "updateTime": self.update_time_us,
            "consumer": self.consumer,
        }


def define_tables(meta: sa.MetaData) -> tuple[sa.Table, sa.Table]:
    groups = sa.Table(
        "consumer_groups",
        meta,
        sa.Column("project", sa.String(63), primary_key=True),
        sa.Column("logstore", sa.String(63), primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("timeout_s", sa.Integer, nullable=False),
        sa.Column("ordered", sa.Boolean, nullable=False),
    )
    checkpoints = sa.Table(
        "checkpoints",
        meta,
        sa.Column("project", sa.String(63), primary_key=True),
        sa.Column("logstore", sa.String(63), primary_key=True),
        sa.Column("group_name", sa.String(128), primary_key=True),
        sa.Column("shard_id", sa.Integer, primary_key=True),
        sa.Column("cursor", sa.String(_CHECKPOINT_CHARS_MAX), nullable=False),
        sa.Column("consumer", sa.String(256), nullable=False),
        sa.Column("update_time_us", sa.BigInteger, nullable=False),
    )
    return groups, checkpoints


def validate_group(name: str, timeout_s: int) -> None:
    if not isinstance(name, str) or _GROUP_NAME.fullmatch(name) is None:
        raise ParameterInvalid(
            f"consumer group name {name!r} must be 2 to 128 characters of letters, digits, "
            "'_', '-' and '.', starting with a letter or digit"
        )
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int):
        raise ParameterInvalid("timeout must be an integer number of seconds")
    if not 1 <= timeout_s <= group_timeout_s_max:
        raise ParameterInvalid(f"timeout must be 1..{group_timeout_s_max} seconds")


def validate_checkpoint(checkpoint: Checkpoint) -> None:
    if len(checkpoint.cursor) > _CHECKPOINT_CHARS_MAX or len(checkpoint.consumer) > 256:
        raise ParameterInvalid("checkpoint or consumer name too long")


def group_count(groups: Iterable[GroupKey], project: str, logstore: str) -> int:
    """How many groups a logstore has: what ``consumer_groups_per_logstore_max`` bounds."""
    return sum(1 for p, ls, _ in groups if (p, ls) == (project, logstore))


class ConsumerGroupCatalog:
    """Groups and checkpoints of every logstore; owned by ``MetadataStore`` (``.groups``),
    which checks that the logstore exists before calling in and shares its write lock."""

    def __init__(
        self, engine: Engine, tables: tuple[sa.Table, sa.Table], write_lock: threading.Lock
    ) -> None:
        self._engine = engine
        self._groups_table, self._checkpoints_table = tables
        self._write_lock = write_lock
        self._groups: dict[GroupKey, ConsumerGroupDef] = {}
        self._checkpoints: dict[GroupKey, dict[int, Checkpoint]] = {}

    def load(self, conn: Connection) -> None:
        for row in conn.execute(sa.select(self._groups_table)).mappings():
            key = (row["project"], row["logstore"], row["name"])
            self._groups[key] = ConsumerGroupDef(row["name"], row["timeout_s"], row["ordered"])
            self._checkpoints[key] = {}
        for row in conn.execute(sa.select(self._checkpoints_table)).mappings():
            key = (row["project"], row["logstore"], row["group_name"])
            if key in self._checkpoints:
                self._checkpoints[key][row["shard_id"]] = Checkpoint(
                    row["shard_id"], row["cursor"], row["consumer"], row["update_time_us"]
                )

    # -- groups -----------------------------------------------------------------------------

    def create(self, project: str, logstore: str, group: ConsumerGroupDef) -> None:
        validate_group(group.name, group.timeout_s)
        key = (project, logstore, group.name)
        with self._write_lock:
            if key in self._groups:
                raise ConsumerGroupAlreadyExist(f"consumer group {group.name} already exists")
            if group_count(self._groups, project, logstore) >= consumer_groups_per_logstore_max:
                raise ParameterInvalid(
                    f"a logstore has at most {consumer_groups_per_logstore_max} consumer groups"
                )
            with self._engine.begin() as conn:
                conn.execute(
                    sa.insert(self._groups_table).values(
                        project=project,
                        logstore=logstore,
                        name=group.name,
                        timeout_s=group.timeout_s,
                        ordered=group.ordered,
                    )
                )
            self._groups = {**self._groups, key: group}
            self._checkpoints = {**self._checkpoints, key: {}}

    def get(self, project: str, logstore: str, name: str) -> ConsumerGroupDef:
        group = self._groups.get((project, logstore, name))
        if group is None:
            raise ConsumerGroupNotExist(f"consumer group {name} does not exist")
        return group

    def list_groups(self, project: str, logstore: str) -> list[ConsumerGroupDef]:
        return [
            group
            for (p, ls, _), group in sorted(self._groups.items())
            if (p, ls) == (project, logstore)
        ]

    def update(
        self,
        project: str,
        logstore: str,
        name: str,
        timeout_s: int | None = None,
        ordered: bool | None = None,
    ) -> ConsumerGroupDef:
        with self._write_lock:
            old = self.get(project, logstore, name)
            new = replace(
                old,
                timeout_s=old.timeout_s if timeout_s is None else timeout_s,
                ordered=old.ordered if ordered is None else ordered,
            )
            validate_group(new.name, new.timeout_s)
            with self._engine.begin() as conn:
                conn.execute(
                    sa.update(self._groups_table)
                    .where(*self._group_where(self._groups_table, project, logstore, name))
                    .values(timeout_s=new.timeout_s, ordered=new.ordered)
                )
            self._groups = {**self._groups, (project, logstore, name): new}
            return new

    def delete(self, project: str, logstore: str, name: str) -> None:
        with self._write_lock:
            self.get(project, logstore, name)
            with self._engine.begin() as conn:
                self._delete_rows(conn, project, logstore, name)
            key = (project, logstore, name)
            self._groups = {k: v for k, v in self._groups.items() if k != key}
            self._checkpoints = {k: v for k, v in self._checkpoints.items() if k != key}

    def drop_logstore(self, conn: Connection, project: str, logstore: str | None) -> None:
        """Deletes the groups of one logstore (or of a whole project) inside the caller's
        transaction; the caller holds the write lock and calls ``forget`` after the commit."""
        for table in (self._groups_table, self._checkpoints_table):
            where = [table.c.project == project]
            if logstore is not None:
                where.append(table.c.logstore == logstore)
            conn.execute(sa.delete(table).where(*where))

    def forget(self, project: str, logstore: str | None) -> None:
        def kept(key: GroupKey) -> bool:
            return key[0] != project or (logstore is not None and key[1] != logstore)

        self._groups = {k: v for k, v in self._groups.items() if kept(k)}
        self._checkpoints = {k: v for k, v in self._checkpoints.items() if kept(k)}

    # -- checkpoints ------------------------------------------------------------------------

    def checkpoints(self, project: str, logstore: str, name: str) -> Mapping[int, Checkpoint]:
        self.get(project, logstore, name)
        return self._checkpoints.get((project, logstore, name), {})

    def save_checkpoint(
        self, project: str, logstore: str, name: str, checkpoint: Checkpoint
    ) -> None:
        validate_checkpoint(checkpoint)
        key = (project, logstore, name)
        with self._write_lock:
            self.get(project, logstore, name)
            table = self._checkpoints_table
            with self._engine.begin() as conn:
                where = [*self._group_where(table, project, logstore, name)]
                where.append(table.c.shard_id == checkpoint.shard_id)
                values = {
                    "cursor": checkpoint.cursor,
                    "consumer": checkpoint.consumer,
                    "update_time_us": checkpoint.update_time_us,
                }
                updated = conn.execute(sa.update(table).where(*where).values(values))
                if updated.rowcount == 0:
                    conn.execute(
                        sa.insert(table).values(
                            project=project,
                            logstore=logstore,
                            group_name=name,
                            shard_id=checkpoint.shard_id,
                            **values,
                        )
                    )
            shard_checkpoints = {**self._checkpoints.get(key, {}), checkpoint.shard_id: checkpoint}
            self._checkpoints = {**self._checkpoints, key: shard_checkpoints}

    # -- internals --------------------------------------------------------------------------

    @staticmethod
    def _group_where(
        table: sa.Table, project: str, logstore: str, name: str
    ) -> list[sa.ColumnElement[bool]]:
        group_column = table.c.name if "name" in table.c else table.c.group_name
        return [table.c.project == project, table.c.logstore == logstore, group_column == name]

    def _delete_rows(self, conn: Connection, project: str, logstore: str, name: str) -> None:
        for table in (self._checkpoints_table, self._groups_table):
            conn.execute(sa.delete(table).where(*self._group_where(table, project, logstore, name)))
