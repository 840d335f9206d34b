"""A throwaway PostgreSQL cluster for tests.

``running_postgres()`` runs initdb and pg_ctl from the newest ``/usr/lib/postgresql/*/bin``
into a temporary directory, starts the server on a free loopback port with trust auth,
creates a database and yields its SQLAlchemy URL; on exit it stops the server
(``pg_ctl stop -m fast``) and removes the directory. PostgreSQL refuses to run as root, so
as root the directory is given to the ``postgres`` user and the binaries run as that user.
Durability is off (``fsync=off``): the cluster dies with the test session anyway.

``create_schema(url, name)`` makes a schema in that database and returns a URL that uses it,
so tests that need empty tables each get their own without another database or cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

__all__ = ["PostgresNotInstalled", "create_schema", "find_postgres_bin", "running_postgres"]

_start_timeout_s = 60
_stop_timeout_s = 30


class PostgresNotInstalled(Exception):
    pass


def find_postgres_bin() -> Path:
    """The bin directory of the newest PostgreSQL installed from Debian's packages."""
    candidates = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").exists()]
    if not candidates:
        raise PostgresNotInstalled(
            "PostgreSQL binaries not found in /usr/lib/postgresql/*/bin; "
            "run `make system-deps` to install them"
        )
    return max(candidates, key=lambda p: _version_key(p.parent.name))


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def running_postgres(database: str = "loghub") -> Iterator[str]:
    bin_dir = find_postgres_bin()
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    base = Path(tempfile.mkdtemp(prefix="loghub-pg-"))
    data_dir = base / "data"
    postmaster_pid: int | None = None

    def run(*args: str) -> None:
        result = subprocess.run(
            [*prefix, *args], capture_output=True, text=True, timeout=_start_timeout_s
        )
        if result.returncode != 0:
            log = base / "server.log"
            server_log = log.read_text() if log.exists() else ""
            raise RuntimeError(
                f"{args[0]} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n"
                f"{server_log}"
            )

    try:
        if as_root:
            shutil.chown(base, user="postgres", group="postgres")
        run(str(bin_dir / "initdb"), "-D", str(data_dir), "-A", "trust", "-U", "postgres",
            "--no-sync", "-E", "UTF8")  # fmt: skip
        port = _free_port()
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
        run(str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-l", str(base / "server.log"),
            "-w", "-t", str(_start_timeout_s), "-o", options, "start")  # fmt: skip
        postmaster_pid = int((data_dir / "postmaster.pid").read_text().split()[0])
        with psycopg.connect(
            host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/{database}"
    finally:
        if postmaster_pid is not None:
            _stop(bin_dir, prefix, data_dir, postmaster_pid)
        shutil.rmtree(base, ignore_errors=True)


def _stop(bin_dir: Path, prefix: list[str], data_dir: Path, postmaster_pid: int) -> None:
    """Stop the server; if pg_ctl cannot, kill the one postmaster this module started."""
    result = subprocess.run(
        [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-m", "fast", "-w",
         "-t", str(_stop_timeout_s), "stop"],
        capture_output=True,
        timeout=_stop_timeout_s + 5,
    )  # fmt: skip
    if result.returncode != 0:
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster_pid, signal.SIGKILL)


def create_schema(url: str, name: str) -> str:
    """Create schema ``name`` in the database of ``url``; returns a URL whose connections use
    it (``search_path``), so each test gets empty tables. A schema takes milliseconds where a
    new database takes a third of a second."""
    parsed = make_url(url)
    with psycopg.connect(
        host=parsed.host,
        port=parsed.port,
        user=parsed.username,
        dbname=parsed.database,
        autocommit=True,
    ) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    with_path = parsed.update_query_dict({"options": f"-csearch_path={name}"})
    return with_path.render_as_string(hide_password=False)
