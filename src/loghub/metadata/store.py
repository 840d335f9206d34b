"""MetadataStore: projects, logstores and shards in SQL, served from memory.

Where it lives: SQLite in the data directory by default (``sqlite:////abs/path/meta.db``,
WAL journal, ``synchronous=FULL`` so a committed change survives a power cut, foreign keys
on, a busy timeout), or PostgreSQL when given a ``postgresql+psycopg://`` URL. SQLAlchemy
Core, no ORM: the tables are few and the queries plain. The tables are created on open, and
a ``schema_version`` row says which layout the database has, for future migrations.

Why a cache: the server asks for a logstore and its shards on every PutLogs and PullLogs.
All metadata is loaded on open and kept in memory, so ``get_project``, ``get_logstore``,
``list_*``, ``get_shard`` and ``shard_for_key`` run no SQL. Every write runs in one SQL
transaction first and updates the cache only after the commit, so the cache never shows a
change the database does not have; if the commit fails, nothing changed.

One server process owns a database. The cache is not told about changes made by another
process, so two servers on one database would each serve stale metadata: not supported yet.

Thread-safety: safe to share between threads. Writes hold one lock (so check-then-write,
e.g. "does this logstore exist", cannot race). Readers take no lock: the cache dictionaries
are replaced, never changed in place, so a reader always sees one consistent snapshot.

Crash: a write either committed (and is loaded on the next open) or did not happen.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from loghub._clock import Clock
from loghub._sql import create_engine
from loghub.errors import (
    DatabaseError,
    LogStoreAlreadyExist,
    ProjectAlreadyExist,
    ProjectNotExist,
)
from loghub.metadata._logstores import (
    CachedLogstore,
    ShardSealer,
    check_updatable,
    close_parents,
    list_page_size_max,
    missing_logstore,
    page,
    plan_merge,
    plan_split,
    reshard,
    seal,
    shard_ids_per_logstore_max,
    spec_of,
    spec_values,
    unseal,
)
from loghub.metadata._validate import (
    validate_description,
    validate_project_name,
    validate_spec,
)
from loghub.metadata.groups import ConsumerGroupCatalog, define_tables
from loghub.metadata.hashing import even_ranges
from loghub.metadata.models import Logstore, LogstoreSpec, Project, Shard, ShardStatus

__all__ = [
    "SCHEMA_VERSION",
    "MetadataStore",
    "ShardSealer",
    "list_page_size_max",
    "shard_ids_per_logstore_max",
]

SCHEMA_VERSION = 1

_meta = sa.MetaData()
_schema_version = sa.Table(
    "schema_version",
    _meta,
    sa.Column("id", sa.Integer, primary_key=True),  # always 1: a one-row table
    sa.Column("version", sa.Integer, nullable=False),
)
_projects = sa.Table(
    "projects",
    _meta,
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("created_at_s", sa.BigInteger, nullable=False),
    sa.Column("modified_at_s", sa.BigInteger, nullable=False),
)
_logstores = sa.Table(
    "logstores",
    _meta,
    sa.Column(
        "project",
        sa.String(63),
        sa.ForeignKey("projects.name", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("ttl_days", sa.Integer, nullable=False),
    sa.Column("auto_split", sa.Boolean, nullable=False),
    sa.Column("max_split_shard", sa.Integer, nullable=False),
    sa.Column("append_meta", sa.Boolean, nullable=False),
    sa.Column("enable_tracking", sa.Boolean, nullable=False),
    sa.Column("telemetry_type", sa.String(63), nullable=False),
    sa.Column("mode", sa.String(63), nullable=False),
    sa.Column("extra", sa.JSON, nullable=False),
    sa.Column("created_at_s", sa.BigInteger, nullable=False),
    sa.Column("modified_at_s", sa.BigInteger, nullable=False),
    sa.Column("storage_key", sa.String(200), nullable=False, unique=True),
)
# Keys are 128-bit, wider than any SQL integer, so they are stored as 33 hex digits
# (2**128 needs the 33rd): fixed width keeps text order equal to numeric order.
_shards = sa.Table(
    "shards",
    _meta,
    sa.Column("project", sa.String(63), primary_key=True),
    sa.Column("logstore", sa.String(63), primary_key=True),
    sa.Column("shard_id", sa.Integer, primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("begin_key", sa.String(33), nullable=False),
    sa.Column("end_key", sa.String(33), nullable=False),
    sa.Column("created_at_s", sa.BigInteger, nullable=False),
    sa.Column("closed_at_s", sa.BigInteger, nullable=True),
    sa.Column("parents", sa.JSON, nullable=False),
    sa.Column("children", sa.JSON, nullable=False),
    sa.Column("end_seq", sa.BigInteger, nullable=True),
    sa.ForeignKeyConstraint(
        ["project", "logstore"],
        ["logstores.project", "logstores.name"],
        ondelete="CASCADE",
    ),
)


_group_tables = define_tables(_meta)


def _key_text(key: int) -> str:
    return f"{key:033x}"


class MetadataStore:
    """Projects, logstores and shards; see the module docstring for caching and threads."""

    def __init__(self, engine: Engine, clock: Clock) -> None:
        """Use ``MetadataStore.open``; this takes an engine already set up."""
        self._engine = engine
        self._clock = clock
        self._write_lock = threading.Lock()
        self._projects: dict[str, Project] = {}
        self._logstores: dict[tuple[str, str], CachedLogstore] = {}
        self._groups = ConsumerGroupCatalog(engine, _group_tables, self._write_lock)
        _meta.create_all(engine)
        with engine.begin() as conn:
            self._check_schema_version(conn)
            self._load(conn)
            self._groups.load(conn)

    @classmethod
    def open(cls, url: str, clock: Clock) -> MetadataStore:
        """Open (creating if needed) the database at ``url``: ``sqlite:////abs/path/meta.db``
        or ``postgresql+psycopg://user@host:port/db``."""
        return cls(create_engine(url, "metadata"), clock)

    def close(self) -> None:
        self._engine.dispose()

    # -- projects ---------------------------------------------------------------------------

    def create_project(self, name: str, description: str = "") -> Project:
        validate_project_name(name)
        validate_description(description)
        with self._write_lock:
            if name in self._projects:
                raise ProjectAlreadyExist(f"project {name} already exists")
            now_s = self._now_s()
            project = Project(name, description, now_s, now_s)
            try:
                with self._engine.begin() as conn:
                    conn.execute(
                        sa.insert(_projects).values(
                            name=name,
                            description=description,
                            created_at_s=now_s,
                            modified_at_s=now_s,
                        )
                    )
            except IntegrityError as exc:
                raise ProjectAlreadyExist(f"project {name} already exists") from exc
            self._projects = {**self._projects, name: project}
            return project

    def get_project(self, name: str) -> Project:
        project = self._projects.get(name)
        if project is None:
            raise ProjectNotExist(f"project {name} does not exist")
        return project

    def list_projects(
        self, offset: int = 0, size: int = 500, name_contains: str = ""
    ) -> tuple[list[Project], int]:
        """A page of projects by name, and how many match in all."""
        projects = self._projects
        names = sorted(n for n in projects if name_contains in n)
        return [projects[n] for n in page(names, offset, size)], len(names)

    def delete_project(self, name: str) -> list[Logstore]:
        """Delete a project with its logstores and shards. Returns the logstores deleted, so
        the caller can remove their data (``storage_key``) after this commit."""
        with self._write_lock:
            self.get_project(name)
            gone = {k: v for k, v in self._logstores.items() if k[0] == name}
            with self._engine.begin() as conn:
                self._groups.drop_logstore(conn, name, None)
                conn.execute(sa.delete(_shards).where(_shards.c.project == name))
                conn.execute(sa.delete(_logstores).where(_logstores.c.project == name))
                conn.execute(sa.delete(_projects).where(_projects.c.name == name))
            self._groups.forget(name, None)
            self._logstores = {k: v for k, v in self._logstores.items() if k not in gone}
            self._projects = {k: v for k, v in self._projects.items() if k != name}
            return [gone[k].logstore for k in sorted(gone)]

    # -- logstores --------------------------------------------------------------------------

    def create_logstore(self, project: str, spec: LogstoreSpec) -> Logstore:
        """Create a logstore with ``spec.shard_count`` read-write shards, ids 0..n-1, that
        split the key space evenly."""
        validate_spec(spec)
        with self._write_lock:
            self.get_project(project)
            if (project, spec.name) in self._logstores:
                raise LogStoreAlreadyExist(f"logstore {spec.name} already exists")
            now_s = self._now_s()
            logstore = Logstore(
                project=project,
                **spec_values(spec),
                created_at_s=now_s,
                modified_at_s=now_s,
                storage_key=f"{project}/{spec.name}-{secrets.token_hex(4)}",
            )
            shards = [
                Shard(shard_id, "readwrite", begin, end, now_s)
                for shard_id, (begin, end) in enumerate(even_ranges(spec.shard_count))
            ]
            try:
                with self._engine.begin() as conn:
                    conn.execute(sa.insert(_logstores).values(_logstore_row(logstore)))
                    conn.execute(sa.insert(_shards), [_shard_row(logstore, s) for s in shards])
            except IntegrityError as exc:
                raise LogStoreAlreadyExist(f"logstore {spec.name} already exists") from exc
            return self._cache(CachedLogstore.build(logstore, shards))

    def get_logstore(self, project: str, name: str) -> Logstore:
        return self._entry(project, name).logstore

    def list_logstores(
        self, project: str, offset: int = 0, size: int = 500, name_contains: str = ""
    ) -> tuple[list[str], int]:
        """A page of logstore names, sorted, and how many match in all."""
        self.get_project(project)
        names = sorted(n for p, n in self._logstores if p == project and name_contains in n)
        return page(names, offset, size), len(names)

    def update_logstore(self, project: str, name: str, changes: Mapping[str, Any]) -> Logstore:
        """Change the fields named in ``changes`` (``LogstoreSpec`` field names, except
        ``name`` and ``shard_count``: the shard count changes only by split and merge)."""
        check_updatable(changes)
        with self._write_lock:
            entry = self._entry(project, name)
            old = entry.logstore
            spec = replace(spec_of(old), **changes)
            validate_spec(spec)
            new = replace(old, **spec_values(spec), modified_at_s=self._now_s())
            with self._engine.begin() as conn:
                conn.execute(
                    sa.update(_logstores)
                    .where(_logstores.c.project == project, _logstores.c.name == name)
                    .values(_logstore_row(new))
                )
            return self._cache(CachedLogstore.build(new, entry.shards))

    def delete_logstore(self, project: str, name: str) -> Logstore:
        """Delete a logstore and its shards; returns it so the caller can remove its data."""
        with self._write_lock:
            entry = self._entry(project, name)
            with self._engine.begin() as conn:
                self._groups.drop_logstore(conn, project, name)
                conn.execute(
                    sa.delete(_shards).where(
                        _shards.c.project == project, _shards.c.logstore == name
                    )
                )
                conn.execute(
                    sa.delete(_logstores).where(
                        _logstores.c.project == project, _logstores.c.name == name
                    )
                )
            self._groups.forget(project, name)
            self._logstores = {k: v for k, v in self._logstores.items() if k != (project, name)}
            return entry.logstore

    # -- shards -----------------------------------------------------------------------------

    def list_shards(self, project: str, logstore: str) -> list[Shard]:
        return list(self._entry(project, logstore).shards)

    def get_shard(self, project: str, logstore: str, shard_id: int) -> Shard:
        return self._entry(project, logstore).shard(shard_id)

    def shard_for_key(self, project: str, logstore: str, key: int) -> Shard:
        """The read-write shard whose range holds ``key`` (see ``hashing.parse_hash_key``)."""
        return self._entry(project, logstore).shard_for_key(key)

    # -- consumer groups ---------------------------------------------------------------------

    def consumer_groups(self, project: str, logstore: str) -> ConsumerGroupCatalog:
        """The groups and checkpoints of a logstore that exists (LogStoreNotExist if not)."""
        self._entry(project, logstore)
        return self._groups

    # -- split and merge ---------------------------------------------------------------------

    def split_shard(
        self, project: str, logstore: str, shard_id: int, split_key: int, sealer: ShardSealer
    ) -> tuple[Shard, Shard, Shard]:
        """Splits a read-write shard at ``split_key`` into two children covering
        [begin, split_key) and [split_key, end); returns (parent now read-only, left, right).

        The parent's log is sealed (``sealer``) before the change commits, so its end never
        moves after it turns read-only; if the commit fails, the seal is undone.
        """
        with self._write_lock:
            entry = self._entry(project, logstore)
            now_s = self._now_s()
            parent, children = plan_split(entry, shard_id, split_key, now_s)
            (closed,) = self._commit_reshard(entry, [parent], children, sealer, now_s)
            return closed, children[0], children[1]

    def merge_shard(
        self, project: str, logstore: str, shard_id: int, sealer: ShardSealer
    ) -> tuple[Shard, Shard, Shard]:
        """Merges a read-write shard with its right-hand read-write neighbour into one new
        shard; returns (new shard, left now read-only, right now read-only)."""
        with self._write_lock:
            entry = self._entry(project, logstore)
            now_s = self._now_s()
            parents, merged = plan_merge(entry, shard_id, now_s)
            closed_left, closed_right = self._commit_reshard(
                entry, parents, [merged], sealer, now_s
            )
            return merged, closed_left, closed_right

    def wait_for_writes(self) -> None:
        """Returns once no write that started before the call is still committing: a writer
        that found a shard sealed by a split uses it to see the split's children."""
        with self._write_lock:
            pass

    def _commit_reshard(
        self,
        entry: CachedLogstore,
        parents: list[Shard],
        children: list[Shard],
        sealer: ShardSealer,
        now_s: int,
    ) -> list[Shard]:
        """Seals the parents, then commits them read-only with their children (lock held)."""
        end_seqs = seal(sealer, parents)
        closed = close_parents(parents, children, end_seqs, now_s)
        try:
            logstore = entry.logstore
            with self._engine.begin() as conn:
                for shard in closed:
                    conn.execute(
                        sa.update(_shards)
                        .where(
                            _shards.c.project == logstore.project,
                            _shards.c.logstore == logstore.name,
                            _shards.c.shard_id == shard.shard_id,
                        )
                        .values(_shard_row(logstore, shard))
                    )
                conn.execute(sa.insert(_shards), [_shard_row(logstore, c) for c in children])
        except BaseException:
            unseal(sealer, parents)
            raise
        self._cache(CachedLogstore.build(entry.logstore, reshard(entry, closed, children)))
        return closed

    # -- internals --------------------------------------------------------------------------

    def _now_s(self) -> int:
        return self._clock.wall_ms() // 1000

    def _entry(self, project: str, name: str) -> CachedLogstore:
        entry = self._logstores.get((project, name))
        if entry is None:
            self.get_project(project)
            raise missing_logstore(name)
        return entry

    def _cache(self, entry: CachedLogstore) -> Logstore:
        key = (entry.logstore.project, entry.logstore.name)
        self._logstores = {**self._logstores, key: entry}
        return entry.logstore

    def _check_schema_version(self, conn: Connection) -> None:
        version = conn.execute(sa.select(_schema_version.c.version)).scalar_one_or_none()
        if version is None:
            conn.execute(sa.insert(_schema_version).values(id=1, version=SCHEMA_VERSION))
        elif version != SCHEMA_VERSION:
            raise DatabaseError(
                f"metadata schema version {version}, this LogHub reads {SCHEMA_VERSION}"
            )

    def _load(self, conn: Connection) -> None:
        for row in conn.execute(sa.select(_projects)).mappings():
            self._projects[row["name"]] = Project(
                row["name"], row["description"], row["created_at_s"], row["modified_at_s"]
            )
        shards: dict[tuple[str, str], list[Shard]] = {}
        for row in conn.execute(sa.select(_shards)).mappings():
            shards.setdefault((row["project"], row["logstore"]), []).append(_shard_of(row))
        for row in conn.execute(sa.select(_logstores)).mappings():
            values = {f.name: row[f.name] for f in fields(Logstore) if f.name != "shard_count"}
            logstore = Logstore(**values, shard_count=0)  # counted by CachedLogstore.build
            key = (logstore.project, logstore.name)
            self._logstores[key] = CachedLogstore.build(logstore, shards.get(key, []))


def _logstore_row(logstore: Logstore) -> dict[str, Any]:
    row = {f.name: getattr(logstore, f.name) for f in fields(Logstore)}
    del row["shard_count"]  # derived from the shards
    row["extra"] = dict(logstore.extra)
    return row


def _shard_row(logstore: Logstore, shard: Shard) -> dict[str, Any]:
    return {
        "project": logstore.project,
        "logstore": logstore.name,
        "shard_id": shard.shard_id,
        "status": shard.status,
        "begin_key": _key_text(shard.begin_key),
        "end_key": _key_text(shard.end_key),
        "created_at_s": shard.created_at_s,
        "closed_at_s": shard.closed_at_s,
        "parents": list(shard.parents),
        "children": list(shard.children),
        "end_seq": shard.end_seq,
    }


def _shard_of(row: sa.RowMapping) -> Shard:
    assert row["status"] in ("readwrite", "readonly"), row
    return Shard(
        shard_id=row["shard_id"],
        status=cast(ShardStatus, row["status"]),
        begin_key=int(row["begin_key"], 16),
        end_key=int(row["end_key"], 16),
        created_at_s=row["created_at_s"],
        closed_at_s=row["closed_at_s"],
        parents=tuple(row["parents"]),
        children=tuple(row["children"]),
        end_seq=row["end_seq"],
    )
