"""Small helpers over raw file descriptors, shared by the storage modules, and the bounded
cache of open log files.

No byte layout of its own. Thread-safety: the functions are stateless; ``FileCache`` is
thread-safe (one lock of its own, never held during I/O other than open and close).

Why a cache: a shard holds one log file per segment. Holding every one open costs a
descriptor per segment for ever, and a server with many shards then runs out of
descriptors ("Too many open files") long before it runs out of anything else. The cache
keeps at most ``open_files_max`` descriptors open that nobody is using, closing the least
recently used first; a descriptor in use (pinned by a read or a write) is never closed
under its user.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "FileCache",
    "fsync_directory",
    "pread_fully",
    "raise_open_files_limit",
    "read_whole_file",
    "write_fully",
    "write_whole_file",
    "writev_fully",
]

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


def read_whole_file(path: Path) -> bytes | None:
    """The file's bytes, or None when it does not exist. Holds no descriptor afterwards."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return pread_fully(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)


def write_whole_file(path: Path, data: bytes, *, sync: bool) -> None:
    """Replaces the file's content in place (index files: a torn rewrite fails their
    checksum and is rebuilt from the log, so no rename dance is needed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, _FILE_MODE)
    try:
        write_fully(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def raise_open_files_limit() -> tuple[int, int]:
    """Raises the soft RLIMIT_NOFILE to the hard limit; returns (soft, hard) as now set."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            logger.warning("could not raise the open files limit to %d: %s", target, exc)
    return soft, hard


@dataclass
class _Entry:
    fd: int
    pins: int = 0
    doomed: bool = False  # close at the last release (the file was deleted or closed)


class FileCache:
    """Read-write ``O_APPEND`` descriptors of log files, opened on demand, at most
    ``open_files_max`` of them kept open while unused (least recently used closed first).

    Pinned descriptors are not counted against the bound and never closed under their
    users, so the bound can be passed by as many files as are in use at once.
    """

    def __init__(self, open_files_max: int) -> None:
        assert open_files_max >= 1
        self.open_files_max = open_files_max
        self._lock = threading.Lock()
        self._entries: OrderedDict[Path, _Entry] = OrderedDict()  # least recently used first
        self._idle = 0  # entries with no pin

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._entries)

    def acquire(self, path: Path) -> int:
        """A descriptor of ``path``, pinned until ``release(path)``."""
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None and not entry.doomed:
                if entry.pins == 0:
                    self._idle -= 1
                    self._entries.move_to_end(path)  # recency matters only to idle ones
                entry.pins += 1
                return entry.fd
            assert entry is None, f"{path} is being closed and reopened at once"
            self._evict(self.open_files_max - 1)
        fd = self._open(path)
        with self._lock:
            raced = self._entries.get(path)
            if raced is not None:  # another thread opened it meanwhile: use theirs
                os.close(fd)
                if raced.pins == 0:
                    self._idle -= 1
                raced.pins += 1
                return raced.fd
            self._entries[path] = _Entry(fd, pins=1)
            return fd

    def release(self, path: Path) -> None:
        with self._lock:
            entry = self._entries[path]
            assert entry.pins > 0
            entry.pins -= 1
            if entry.pins:
                return
            if entry.doomed:
                del self._entries[path]
                os.close(entry.fd)
                return
            self._idle += 1
            self._evict(self.open_files_max)

    @contextmanager
    def use(self, path: Path) -> Iterator[int]:
        fd = self.acquire(path)
        try:
            yield fd
        finally:
            self.release(path)

    def forget(self, path: Path) -> None:
        """Closes ``path``'s descriptor now, or at its last release when in use."""
        with self._lock:
            entry = self._entries.get(path)
            if entry is None:
                return
            if entry.pins:
                entry.doomed = True
                return
            del self._entries[path]
            self._idle -= 1
            os.close(entry.fd)

    def _evict(self, idle_max: int) -> None:
        """Closes least recently used idle descriptors until at most ``idle_max`` remain."""
        if self._idle <= idle_max:
            return
        for path in list(self._entries):
            entry = self._entries[path]
            if entry.pins == 0:
                del self._entries[path]
                self._idle -= 1
                os.close(entry.fd)
                if self._idle <= idle_max:
                    return

    def _open(self, path: Path) -> int:
        """Opens ``path``; when the process is out of descriptors, closes every idle one
        and tries once more before giving up."""
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
        try:
            return os.open(path, flags)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            with self._lock:
                logger.warning(
                    "out of descriptors with %d open: closing idle ones", len(self._entries)
                )
                self._evict(0)
            return os.open(path, flags)

    def close(self) -> None:
        """Closes every idle descriptor; pinned ones close at their last release."""
        with self._lock:
            for path in list(self._entries):
                entry = self._entries[path]
                if entry.pins:
                    entry.doomed = True
                else:
                    del self._entries[path]
                    os.close(entry.fd)
            self._idle = 0
