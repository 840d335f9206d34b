"""Every shard log under one data directory: ``<data_dir>/<logstore_key>/<shard_id>/``.

Byte layout: none of its own; each shard directory is a ``ShardLog`` (see ``shard_log``).
``logstore_key`` is a relative path made by the caller (``"project/logstore-1a2b3c4d"``).

Descriptors: the store's shard logs share one ``FileCache`` of log file descriptors bounded
by ``StorageConfig.open_files_max``, so the descriptors held do not grow with shards or
segments: an idle shard holds none (its indexes are in memory), a busy one holds its active
segment's log file while it is written or read.

After a crash: nothing to do here; each shard log recovers its own tail when first opened.
Before that, ``check_formats`` lets a server refuse at start a directory written by a newer
LogHub (a segment format it does not know), rather than fail on the first request for it.
A ``drop_logstore`` cut short by a crash leaves part of the directory, which the caller
(which owns the key) may drop again.

Thread-safety: thread-safe. One lock guards the cache of open shard logs; a shard log is
opened (and recovered) under it, so two callers never open the same directory twice.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from loghub._clock import Clock
from loghub.errors import StorageClosedError, UnsupportedFormatError
from loghub.storage._files import FileCache, fsync_directory, pread_fully
from loghub.storage.segment import (
    SEGMENT_FORMAT_VERSION,
    SEGMENT_HEADER_BYTES,
    segment_base_sequences,
    segment_file_name,
    segment_format,
)
from loghub.storage.shard_log import ShardLog, StorageConfig

__all__ = ["ShardStore", "ShardStoreStatistics"]


@dataclass(frozen=True)
class ShardStoreStatistics:
    open_shard_count: int  # shard logs opened since start (and not dropped)
    open_file_count: int  # log file descriptors open right now
    lost_range_count: int  # damaged ranges found in those shard logs
    lost_record_count: int  # records in those ranges


class ShardStore:
    """All shard logs under one data directory: <data_dir>/<logstore_key>/<shard_id>/"""

    def __init__(self, data_dir: Path, config: StorageConfig, clock: Clock) -> None:
        self.data_dir = data_dir
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._logs: dict[tuple[str, int], ShardLog] = {}
        self._files = FileCache(config.open_files_max)
        self._closed = False
        # replicated shards (a cluster with --replication-factor above 1): every log is
        # opened with its high watermark kept apart from its end (the leader raises it as
        # the in-sync replicas confirm), so nothing unconfirmed is read
        self.replicated = False

    def shard(self, logstore_key: str, shard_id: int) -> ShardLog:
        """The shard's log, opened (and created) on first use."""
        log = self._logs.get((logstore_key, shard_id))  # the common case, without the lock
        if log is not None and not self._closed:
            return log
        directory = self._logstore_directory(logstore_key) / str(shard_id)
        assert shard_id >= 0
        with self._lock:
            self._check_open()
            log = self._logs.get((logstore_key, shard_id))
            if log is None:
                label = f"shard {shard_id} of logstore {_logstore_name(logstore_key)}"
                log = ShardLog.open(directory, self._config, self._clock, self._files, label)
                if self.replicated:
                    log.set_replicated(0)
                self._logs[(logstore_key, shard_id)] = log
            return log

    def check_formats(self) -> int:
        """Refuses (UnsupportedFormatError, naming the file) a data directory holding a
        segment in a format newer than this code reads, before anything is served from it:
        shard logs open on first use, and a server that started would otherwise fail only
        when a request reached that shard. Reads the first bytes of every segment file
        (``<logstore_key>/<shard_id>/``, the key being ``project/logstore``); returns how
        many it read."""
        checked = 0
        for shard_dir in sorted(self.data_dir.glob("*/*/*")):
            if not shard_dir.name.isdigit() or not shard_dir.is_dir():
                continue
            for base_seq in segment_base_sequences(shard_dir):
                path = shard_dir / segment_file_name(base_seq, ".log")
                with open(path, "rb") as file:
                    found = segment_format(pread_fully(file.fileno(), SEGMENT_HEADER_BYTES, 0))
                checked += 1
                if found is not None and found > SEGMENT_FORMAT_VERSION:
                    raise UnsupportedFormatError(
                        f"{path}: segment format {found} was written by a newer LogHub "
                        f"(this one reads formats up to {SEGMENT_FORMAT_VERSION}); run that "
                        "version on this data directory"
                    )
        return checked

    def drop_logstore(self, logstore_key: str) -> None:
        """Closes the logstore's shard logs and deletes its directory."""
        directory = self._logstore_directory(logstore_key)
        with self._lock:
            self._check_open()
            for key in [key for key in self._logs if key[0] == logstore_key]:
                self._logs.pop(key).close()
            if directory.exists():
                shutil.rmtree(directory)
                fsync_directory(directory.parent)

    def logstore_keys(self) -> list[str]:
        """The keys (``project/<name>-<8 hex>``) of every logstore with a directory here."""
        with self._lock:
            self._check_open()
            if not self.data_dir.is_dir():
                return []
            return sorted(
                f"{project.name}/{logstore.name}"
                for project in self.data_dir.iterdir()
                if project.is_dir()
                for logstore in project.iterdir()
                if logstore.is_dir()
            )

    def apply_retention(
        self, logstore_key: str, shard_ids: Iterable[int], now_ms: int, ttl_ms: int
    ) -> int:
        """Applies the TTL to each shard this store holds; returns the segments deleted in
        all. A shard with no directory here is skipped, not created: in a cluster the list
        names every shard of the logstore and a node holds only some of them."""
        directory = self._logstore_directory(logstore_key)
        return sum(
            self.shard(logstore_key, shard_id).apply_retention(now_ms, ttl_ms)
            for shard_id in shard_ids
            if (logstore_key, shard_id) in self._logs or (directory / str(shard_id)).is_dir()
        )

    def drop_shard(self, logstore_key: str, shard_id: int) -> bool:
        """Closes the shard's log and deletes its directory; False when there was none."""
        directory = self._logstore_directory(logstore_key) / str(shard_id)
        with self._lock:
            self._check_open()
            log = self._logs.pop((logstore_key, shard_id), None)
            if log is not None:
                log.close()
            if not directory.is_dir():
                return False
            shutil.rmtree(directory)
            fsync_directory(directory.parent)
            return True

    def statistics(self) -> ShardStoreStatistics:
        with self._lock:
            logs = list(self._logs.values())
        lost = [log.statistics() for log in logs]
        return ShardStoreStatistics(
            open_shard_count=len(logs),
            open_file_count=self._files.open_count,
            lost_range_count=sum(item.lost_range_count for item in lost),
            lost_record_count=sum(item.lost_record_count for item in lost),
        )

    def close(self) -> None:
        """Closes every open shard log. Idempotent."""
        with self._lock:
            self._closed = True
            logs, self._logs = list(self._logs.values()), {}
        for log in logs:
            log.close()
        self._files.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError(f"shard store {self.data_dir} is closed")

    def _logstore_directory(self, logstore_key: str) -> Path:
        key = PurePosixPath(logstore_key)
        assert logstore_key and not key.is_absolute(), logstore_key
        assert ".." not in key.parts and "." not in logstore_key.split("/"), logstore_key
        return self.data_dir / key


def _logstore_name(logstore_key: str) -> str:
    """The logstore's name in its key ``project/<name>-<8 hex>`` (the key itself if not)."""
    last = PurePosixPath(logstore_key).name
    name, _, suffix = last.rpartition("-")
    return name if name and len(suffix) == 8 else last
