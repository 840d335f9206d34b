"""Small helpers over raw file descriptors, shared by the storage modules.

No byte layout of its own. Thread-safety: the functions are stateless; ``IndexFile`` has one
writer (the shard log's writer role) and is never read concurrently.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["IndexFile", "fsync_directory", "pread_fully", "write_fully"]

logger = logging.getLogger("loghub.storage")

_FILE_MODE = 0o644


def pread_fully(fd: int, size_bytes: int, position: int) -> bytes:
    """Up to ``size_bytes`` from ``position``; shorter only at the end of the file."""
    assert size_bytes >= 0 and position >= 0
    data = os.pread(fd, size_bytes, position)
    if len(data) == size_bytes or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size_bytes:
        more = os.pread(fd, size_bytes - got, position + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def write_fully(fd: int, data: bytes) -> None:
    """One os.write in the common case; loops only if the kernel takes part of it."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        assert written > 0
        view = view[written:]


_IOV_MAX = 1024  # Linux's limit on buffers per writev


def writev_fully(fd: int, parts: Sequence[bytes]) -> None:
    """Writes the parts back to back without joining them first (a batch of large records
    would otherwise be copied once more under the GIL); loops on partial writes."""
    pending = [memoryview(part) for part in parts if part]
    while pending:
        written = os.writev(fd, pending[:_IOV_MAX])
        assert written > 0
        while written:
            head = pending[0]
            if written >= len(head):
                written -= len(head)
                pending.pop(0)
            else:
                pending[0] = head[written:]
                written = 0


def fsync_directory(path: Path) -> None:
    """Makes a file's creation, deletion or rename durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class IndexFile:
    """An append-only index file. Its content is a cache of what the log says, so a failed
    append only marks it stale (logged); ``rewrite`` or ``sync`` put it right."""

    def __init__(self, path: Path, *, create: bool) -> None:
        self.path = path
        self.existed = path.exists() and not create
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        if create:
            flags |= os.O_TRUNC
        self.fd = os.open(path, flags, _FILE_MODE)
        self.stale = False

    def read_all(self) -> bytes:
        return pread_fully(self.fd, os.fstat(self.fd).st_size, 0)

    def append(self, data: bytes) -> None:
        if self.stale:
            return  # rewritten as a whole at the next sync
        try:
            write_fully(self.fd, data)
        except OSError as exc:
            self.stale = True
            logger.warning("index file %s is stale after a failed write: %s", self.path, exc)

    def rewrite(self, data: bytes) -> None:
        os.ftruncate(self.fd, 0)
        write_fully(self.fd, data)
        self.stale = False

    def sync(self, content: Callable[[], bytes]) -> None:
        """Makes the file durable; ``content()`` is the whole index, written if stale."""
        if self.stale:
            self.rewrite(content())
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
