"""One way to open the SQL databases LogHub keeps: the metadata database and the lease store.

Both are SQLAlchemy engines over SQLite (a file on a local disk) or PostgreSQL (psycopg 3),
and both need the same care, so it is written once:

- SQLite: WAL, so readers never wait for the writer; ``synchronous=FULL``, so a commit that
  was acknowledged (a checkpoint, a new shard) survives a power cut; a busy timeout, so
  writers on one file (several processes sharing a lease file) wait for the lock instead of
  failing at once; foreign keys enforced (tables without any are unaffected); the file's
  directory created. The pool hands a connection to one thread at a time, so SQLite's
  same-thread check is off.
- PostgreSQL: ``pool_pre_ping``, so a connection the server closed (a restart, an idle
  timeout) is replaced instead of failing the next request.

Anything else is refused with ``ParameterInvalid`` naming what the URL was for.

Thread-safety: the returned engine may be shared between threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from loghub.errors import ParameterInvalid

__all__ = ["create_engine", "sqlite_busy_timeout_ms"]

# Writers on one SQLite file wait this long for the lock before the call fails.
sqlite_busy_timeout_ms = 5_000


def create_engine(url: str, purpose: str) -> Engine:
    """An engine for ``sqlite:////abs/path.db`` or ``postgresql+psycopg://...``; ``purpose``
    ("metadata", "lease") names the URL in the error for any other."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            parsed,
            connect_args={"timeout": sqlite_busy_timeout_ms / 1000, "check_same_thread": False},
        )
        sa.event.listen(engine, "connect", _sqlite_on_connect)
        return engine
    if parsed.get_backend_name() == "postgresql":
        return sa.create_engine(parsed, pool_pre_ping=True)
    raise ParameterInvalid(f"{purpose} URL must be sqlite:// or postgresql+psycopg://, got {url}")


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={sqlite_busy_timeout_ms}")
    finally:
        cursor.close()
