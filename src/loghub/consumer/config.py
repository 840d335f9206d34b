"""ConsumerConfig: everything a ConsumerWorker needs, as one frozen, picklable value.

One value rather than a dozen keyword arguments because the same settings travel three ways:
from ``loghub consume`` flags, from Python, and across a process boundary to the children of
``run_processes`` (which is why nothing in here is a callable). ``validate()`` checks the
relations between fields once, at construction, so a worker never starts with settings that
cannot work (a timeout shorter than two heartbeats would fence itself at the first slow one).

Times are milliseconds (names end in ``_ms``), sizes bytes (``_bytes``). Defaults favour the
hosted service's habits (60 s checkpoint flush, as the official SDK) but a faster failover
than the SDK's 40 s: heartbeats every 5 s and a 15 s timeout.

Thread-safety: immutable.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from loghub.errors import ParameterInvalid

__all__ = [
    "ConsumerConfig",
    "CoordinationMode",
    "ProcessErrorPolicy",
    "buffer_bytes_max_default",
    "fetch_log_groups_max_limit",
    "heartbeat_interval_ms_min",
    "pool_threads_max",
    "processes_max",
]

CoordinationMode = Literal["server", "lease"]
ProcessErrorPolicy = Literal["retry", "skip"]

# A pull returns at most this many log groups (the protocol's limit, and the SDK's default).
fetch_log_groups_max_limit = 1000
# Faster heartbeats would mostly measure the network; the server's timeout is in seconds.
heartbeat_interval_ms_min = 100
# The fetched-but-unprocessed bytes one worker may hold (see ``ConsumerConfig.buffer_bytes_max``).
buffer_bytes_max_default = 64 * 1024 * 1024
# Threads beyond this only wait on the GIL; more throughput means more processes.
pool_threads_max = 64
# One machine rarely has more cores than this; a typo (``--processes 1000``) should fail.
processes_max = 256


@dataclass(frozen=True)
class ConsumerConfig:
    """The settings of one consumer worker.

    ``start_position`` applies only to a shard without a checkpoint: ``"begin"``, ``"end"``, or
    unix seconds (as a string of digits) meaning the first log group received at or after
    that time. ``coordination`` picks how shards are shared: ``"server"`` (the server's
    consumer group, heartbeats, works with the hosted service too) or ``"lease"`` (leases in
    the SQL database at ``lease_url``: ``sqlite:////path/leases.db`` for processes on one
    machine, ``postgresql+psycopg://...`` across machines). ``timeout_ms`` is the group's
    consumer timeout in server mode (rounded up to whole seconds on the server) and the lease
    timeout in lease mode; every worker of a group must use the same value.
    """

    endpoint: str
    project: str
    logstore: str
    group: str
    worker_name: str
    access_key_id: str = ""
    access_key_secret: str = ""
    start_position: str = "begin"
    fetch_interval_ms: int = 500
    fetch_log_groups_max: int = fetch_log_groups_max_limit
    heartbeat_interval_ms: int = 5_000
    timeout_ms: int = 15_000
    ordered: bool = False
    coordination: CoordinationMode = "server"
    lease_url: str = ""
    checkpoint_interval_ms: int = 60_000
    buffer_bytes_max: int = buffer_bytes_max_default
    pool_threads: int = 8
    on_process_error: ProcessErrorPolicy = "retry"
    process_retry_backoff_ms: int = 1_000

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ParameterInvalid`` naming the first setting that cannot work."""
        for name in ("endpoint", "project", "logstore", "group", "worker_name"):
            if not getattr(self, name):
                raise ParameterInvalid(f"{name} is required")
        if self.start_position not in ("begin", "end") and not self.start_position.isdigit():
            raise ParameterInvalid(
                f"start_position must be begin, end or unix seconds, not {self.start_position!r}"
            )
        if not 1 <= self.fetch_log_groups_max <= fetch_log_groups_max_limit:
            raise ParameterInvalid(f"fetch_log_groups_max must be 1..{fetch_log_groups_max_limit}")
        if self.heartbeat_interval_ms < heartbeat_interval_ms_min:
            raise ParameterInvalid(f"heartbeat_interval_ms must be >= {heartbeat_interval_ms_min}")
        if self.timeout_ms < 2 * self.heartbeat_interval_ms:
            # one lost heartbeat must not cost the shards: retries need room inside the timeout
            raise ParameterInvalid("timeout_ms must be at least 2 x heartbeat_interval_ms")
        if self.coordination not in ("server", "lease"):
            raise ParameterInvalid(f"coordination must be server or lease, not {self.coordination}")
        if self.coordination == "lease" and not self.lease_url:
            raise ParameterInvalid(
                "lease coordination needs lease_url (sqlite:// or postgresql://)"
            )
        if self.on_process_error not in ("retry", "skip"):
            raise ParameterInvalid("on_process_error must be retry or skip")
        if not 1 <= self.pool_threads <= pool_threads_max:
            raise ParameterInvalid(f"pool_threads must be 1..{pool_threads_max}")
        for name in ("fetch_interval_ms", "checkpoint_interval_ms", "process_retry_backoff_ms"):
            if getattr(self, name) < 0:
                raise ParameterInvalid(f"{name} must not be negative")
        if self.buffer_bytes_max < 1:
            raise ParameterInvalid("buffer_bytes_max must be positive")

    @property
    def start_cursor_position(self) -> str | int:
        """``start_position`` as ``LogHubClient.get_cursor`` takes it."""
        if self.start_position in ("begin", "end"):
            return self.start_position
        return int(self.start_position)

    @property
    def group_timeout_s(self) -> int:
        """The server-side group timeout: whole seconds, never shorter than ``timeout_ms``, so
        a worker always fences itself before the server gives its shards away."""
        return -(-self.timeout_ms // 1000)

    @property
    def logstore_sig(self) -> str:
        """Names (endpoint, project, logstore) in the lease tables. The endpoint is taken as
        written, minus scheme and trailing slash: every worker must spell it the same way."""
        endpoint = self.endpoint.split("://", 1)[-1].rstrip("/").lower()
        return f"{endpoint}/{self.project}/{self.logstore}"

    def for_worker(self, worker_name: str) -> ConsumerConfig:
        """The same settings under another worker name (the children of ``run_processes``)."""
        return dataclasses.replace(self, worker_name=worker_name)
