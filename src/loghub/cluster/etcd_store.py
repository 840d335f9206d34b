"""LogHub's interface to its control plane, over etcd 3.4 (the ``aetcd`` gRPC client).

The cluster keeps in etcd only what the nodes must agree on: which nodes are alive (keys
under a lease), who the controller is, and records that change by compare-and-swap. Every
call goes through this module, so the rest of the cluster code speaks LogHub's terms
(``Entry``, ``Lease``, ``ControlPlaneError``, ``FencedError``) and never a client library's;
another client or store (etcd3gw, ZooKeeper) would replace only this file.

Endpoints: several members are given as ``etcd://h1:2379,h2:2379,h3:2379``. gRPC is given all
of them as one target (``ipv4:`` or ``dns:`` list) with its ``round_robin`` policy, so a call
goes to a member whose connection is up and a dead member costs a reconnect, not an outage.
Each call has a deadline (``call_timeout_s``); a call that fails with the connection (member
down, leader election in progress) is retried on the next member until ``retry_budget_s``
runs out, then raises ``ControlPlaneError``. Compare-and-swap outcomes are never retried
blindly: a write that timed out may have been applied, so ``compare_and_swap`` re-reads the
key and reports success only when the stored value is the one it wrote.

Fencing: a write made on behalf of a role (the controller) carries a ``Fence`` (a key and the
create revision the writer saw when it took the role). etcd applies the write only if that
key still exists with that create revision, in the same transaction; a writer that was
paused or partitioned while its lease expired and another took the role fails with
``FencedError``, whatever its clock says.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import aetcd  # type: ignore[import-untyped]
import aetcd.exceptions  # type: ignore[import-untyped]
import aetcd.rpc  # type: ignore[import-untyped]
import aetcd.utils  # type: ignore[import-untyped]

from loghub.errors import ControlPlaneError, FencedError

__all__ = [
    "Compare",
    "Delete",
    "Entry",
    "EtcdStore",
    "Fence",
    "Lease",
    "Put",
    "end_if_cancelled",
    "parse_endpoints",
    "txn_ops_max",
]

# etcd's default --max-txn-ops: a transaction with more operations is refused whole.
txn_ops_max = 128
# Keys per read when a whole prefix is read (a page is one RangeRequest at a fixed revision),
# and the largest reply accepted (gRPC's default, 4 MiB, is less than 64 records of 1 MiB and
# less than the deletion events of a big cascade): pages keep any prefix readable.
read_page_keys = 64
reply_bytes_max = 96 * 1024 * 1024

log = logging.getLogger("loghub.cluster")

_T = TypeVar("_T")

# The errors that mean "this member, or the connection to it, is not answering now".
_TRANSIENT = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.InternalError,
    asyncio.TimeoutError,
)


def end_if_cancelled() -> None:
    """Ends a loop whose task was asked to stop. Call it where a loop catches
    ``ControlPlaneError``: the etcd client may turn the cancellation of a watch into an
    error of its own, which the loop would otherwise take for a broken watch and retry
    forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def parse_endpoints(url: str) -> list[tuple[str, int]]:
    """``etcd://h1:2379,h2:2379`` (or ``h1:2379,h2``) as [(host, port)]; 2379 by default."""
    text = url.removeprefix("etcd://").strip().rstrip("/")
    endpoints = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        split = urlsplit(f"//{part}")
        if split.hostname is None or split.path:
            raise ValueError(f"not an etcd endpoint: {part!r} (expected host:port)")
        endpoints.append((split.hostname, split.port or 2379))
    if not endpoints:
        raise ValueError(f"no etcd endpoint in {url!r}")
    return endpoints


def _grpc_target(endpoints: list[tuple[str, int]]) -> tuple[str, int]:
    """aetcd builds its target as f"{host}:{port}": hand it a gRPC address list whose last
    port is given separately."""
    scheme = "ipv4" if all(host.replace(".", "").isdigit() for host, _ in endpoints) else "dns"
    addresses = [f"{host}:{port}" for host, port in endpoints]
    last_host, last_port = endpoints[-1]
    if scheme == "dns" and len(endpoints) == 1:
        return last_host, last_port
    head = ",".join([*addresses[:-1], last_host])
    return f"{scheme}:{head}", last_port


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class Lease:
    lease_id: int
    ttl_s: int


@dataclass(frozen=True)
class Fence:
    """A role's proof: the role's key and the create revision it had when taken."""

    key: str
    create_revision: int


@dataclass(frozen=True)
class Compare:
    """A condition of a transaction: the ``target`` revision ("mod": last change, "create":
    creation; 0 for a key that does not exist) of ``key`` is ``==`` or ``<`` ``revision``.
    With ``prefix``, every key under ``key`` must pass (and an empty range passes): "no key
    under the prefix changed after revision r" is ``Compare(p, "mod", "<", r + 1, True)``."""

    key: str
    target: Literal["mod", "create"]
    op: Literal["==", "<"]
    revision: int
    prefix: bool = False


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes


@dataclass(frozen=True)
class Delete:
    """Deletes ``key``, or with ``prefix`` every key under it (one operation either way)."""

    key: str
    prefix: bool = False


class EtcdStore:
    """An open connection to the control plane. Use ``async with EtcdStore(url) as store``."""

    def __init__(
        self,
        url: str,
        call_timeout_s: float = 2.0,
        retry_budget_s: float = 6.0,
    ) -> None:
        self.endpoints = parse_endpoints(url)
        self._call_timeout_s = call_timeout_s
        self._retry_budget_s = retry_budget_s
        host, port = _grpc_target(self.endpoints)
        self._client = aetcd.Client(
            host=host,
            port=port,
            timeout=call_timeout_s,
            options={
                "grpc.lb_policy_name": "round_robin",
                # straight to the members: never through an HTTP proxy from the environment
                "grpc.enable_http_proxy": 0,
                "grpc.initial_reconnect_backoff_ms": 100,
                "grpc.max_reconnect_backoff_ms": 1000,
                "grpc.keepalive_time_ms": 2000,
                "grpc.keepalive_timeout_ms": 1000,
                "grpc.max_receive_message_length": reply_bytes_max,
            },
        )

    async def __aenter__(self) -> EtcdStore:
        await self._retrying("connect", self._client.connect)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            # bounded: closing a channel with a watch still open can wait on the server
            await asyncio.wait_for(self._client.close(), self._call_timeout_s)

    async def _retrying(self, what: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """Runs an idempotent call, retrying transient failures within the retry budget."""
        deadline = time.monotonic() + self._retry_budget_s
        delay_s = 0.05
        while True:
            try:
                return await asyncio.wait_for(call(), self._call_timeout_s)
            except _TRANSIENT as exc:
                if time.monotonic() + delay_s >= deadline:
                    raise ControlPlaneError(f"etcd {what} failed: {exc!r}") from exc
                log.debug("etcd %s failed (%r); trying again", what, exc)
            except aetcd.exceptions.ClientError as exc:
                raise ControlPlaneError(f"etcd {what} failed: {exc!r}") from exc
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.5)

    # --- reads ------------------------------------------------------------------------

    async def get(self, key: str) -> Entry | None:
        result = await self._retrying("get", lambda: self._client.get(key.encode()))
        return None if result is None else _entry(result)

    async def get_prefix(self, prefix: str) -> list[Entry]:
        result = await self._retrying(
            "get_prefix", lambda: self._client.get_prefix(prefix.encode())
        )
        return [_entry(kv) for kv in result]

    async def read_prefix(self, prefix: str) -> tuple[list[Entry], int]:
        """Every entry under ``prefix`` and the store's revision they were read at: a watch
        from that revision + 1 misses nothing and repeats nothing. Read in pages of
        ``read_page_keys``, every page at the first page's revision (one consistent view)."""
        start = prefix.encode()
        range_end = aetcd.utils.prefix_range_end(start)
        entries: list[Entry] = []
        revision = 0
        while True:
            reply = await self._retrying(
                "read_prefix",
                functools.partial(self._range_page, start, range_end, revision),
            )
            revision = revision or int(reply.header.revision)
            entries.extend(_entry(kv) for kv in reply.kvs)
            if not reply.more:
                return entries, revision
            start = bytes(reply.kvs[-1].key) + b"\0"

    async def _range_page(self, start: bytes, range_end: bytes, revision: int) -> Any:
        # aetcd's get_prefix sends neither a limit nor a revision: the request is built here.
        request = aetcd.rpc.RangeRequest(
            key=start, range_end=range_end, limit=read_page_keys, revision=revision
        )
        await self._client.connect()
        try:
            return await self._client.kvstub.Range(
                request, timeout=self._call_timeout_s, metadata=self._client.metadata
            )
        except aetcd.rpc.AioRpcError as exc:
            aetcd.exceptions._handle_exception(exc)  # raises the client's own error for it

    # --- leases -----------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> Lease:
        lease = await self._retrying("lease grant", lambda: self._client.lease(ttl_s))
        return Lease(int(lease.id), int(lease.ttl))

    async def refresh_lease(self, lease: Lease) -> int:
        """Keeps the lease alive; returns the TTL etcd granted (0: the lease has expired)."""
        reply = await self._retrying(
            "lease keepalive", lambda: self._client.refresh_lease(lease.lease_id)
        )
        return int(getattr(reply, "TTL", 0))

    async def lease_ttl_left_s(self, lease_id: int) -> int:
        """How long a lease (anyone's) has left: -1 when it has ended or never existed."""
        reply = await self._retrying(
            "lease time-to-live", lambda: self._client.get_lease_info(lease_id)
        )
        return int(getattr(reply, "TTL", -1))

    async def revoke_lease(self, lease: Lease) -> None:
        with contextlib.suppress(aetcd.exceptions.ClientError, *_TRANSIENT):
            await asyncio.wait_for(self._client.revoke_lease(lease.lease_id), self._call_timeout_s)

    # --- writes -----------------------------------------------------------------------

    async def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        """An unconditional write (for a node's own keys); returns its revision."""
        lease_id = lease.lease_id if lease else None
        reply = await self._retrying(
            "put", lambda: self._client.put(key.encode(), value, lease=lease_id)
        )
        return int(reply.header.revision)

    async def create(self, key: str, value: bytes, lease: Lease | None = None) -> Entry | None:
        """Creates ``key`` if it does not exist; the new entry, or None if it existed."""
        txn = self._client.transactions
        ops = [txn.put(key.encode(), value, lease=lease.lease_id if lease else None)]
        succeeded, _ = await self._txn("create", [txn.create(key.encode()) == 0], ops)
        if not succeeded:
            # the create may have been ours, applied before a lost reply: then it holds our
            # value under our lease
            entry = await self.get(key)
            if entry is not None and lease is not None and entry.lease == lease.lease_id:
                return entry
            return None
        return await self.get(key)

    async def compare_and_swap(
        self,
        key: str,
        value: bytes,
        expected_mod_revision: int,
        fence: Fence | None = None,
    ) -> bool:
        """Writes ``value`` if ``key`` was last modified at ``expected_mod_revision`` (0: the
        key must not exist) and, with a fence, the fencing key still has its create revision.
        False when the key moved on; FencedError when the fence no longer holds."""
        return await self.swap_revision(key, value, expected_mod_revision, fence) is not None

    async def swap_revision(
        self,
        key: str,
        value: bytes,
        expected_mod_revision: int,
        fence: Fence | None = None,
    ) -> int | None:
        """``compare_and_swap`` that gives the revision the write made (the key's new mod
        revision), or None when the key moved on: a writer that acts on what it wrote needs
        no second read, in which the store already shows the change to others."""
        txn = self._client.transactions
        compare = [txn.mod(key.encode()) == expected_mod_revision]
        if fence is not None:
            compare.append(txn.create(fence.key.encode()) == fence.create_revision)
        succeeded, responses = await self._txn(
            "compare_and_swap", compare, [txn.put(key.encode(), value)]
        )
        if succeeded:
            return int(responses[0].response_put.header.revision)
        if fence is not None:
            holder = await self.get(fence.key)
            if holder is None or holder.create_revision != fence.create_revision:
                raise FencedError(f"{fence.key} is held by another since {fence} was taken")
        return None

    async def delete(self, key: str, fence: Fence | None = None) -> bool:
        txn = self._client.transactions
        compare = []
        if fence is not None:
            compare.append(txn.create(fence.key.encode()) == fence.create_revision)
        succeeded, _ = await self._txn("delete", compare, [txn.delete(key.encode())])
        if not succeeded:
            raise FencedError(f"{fence.key if fence else key}: fence no longer holds")
        return True

    async def transact(self, compare: Sequence[Compare], ops: Sequence[Put | Delete]) -> int | None:
        """Applies every one of ``ops`` if every condition in ``compare`` holds, atomically;
        the revision of the change, or None when a condition failed.

        A try whose reply was lost may have been applied: when a retried transaction fails
        its conditions, the puts are read back, and a write whose every put holds the value
        written (and whose deleted keys are gone) was ours. Callers make that exact by
        writing values no other writer would (a random token in each)."""
        assert 0 < len(ops) <= txn_ops_max and len(compare) + len(ops) <= txn_ops_max, ops
        txn = self._client.transactions
        conditions = [_condition(txn, c) for c in compare]
        requests = [_operation(txn, op) for op in ops]
        tries = 0

        async def attempt() -> tuple[bool, Any]:
            nonlocal tries
            tries += 1
            return await self._client.transaction(  # type: ignore[no-any-return]
                compare=conditions, success=requests, failure=[]
            )

        succeeded, responses = await self._retrying("transaction", attempt)
        if succeeded:
            first = responses[0]
            return int(getattr(first, first.WhichOneof("response")).header.revision)
        if tries > 1:
            return await self._applied_revision(ops)
        return None

    async def _applied_revision(self, ops: Sequence[Put | Delete]) -> int | None:
        """The revision of ``ops`` if the store shows them applied (see ``transact``)."""
        revision = 0
        for op in ops:
            if isinstance(op, Put):
                entry = await self.get(op.key)
                if entry is None or entry.value != op.value:
                    return None
                revision = max(revision, entry.mod_revision)
            elif not op.prefix and await self.get(op.key) is not None:
                return None
        if revision == 0:  # deletes only: they hold, whoever made them
            _, revision = await self.read_prefix(ops[0].key)
        return revision

    async def _txn(self, what: str, compare: list[Any], success: list[Any]) -> tuple[bool, Any]:
        """One transaction, tried once per member while the connection fails. A transaction
        whose reply was lost may have been applied: callers check by reading back."""
        result = await self._retrying(
            what, lambda: self._client.transaction(compare=compare, success=success, failure=[])
        )
        return bool(result[0]), result[1]

    # --- watching ---------------------------------------------------------------------

    async def watch_prefix(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncIterator[tuple[str, str, Entry]]:
        """(kind "PUT"/"DELETE", key, entry) for every change under ``prefix`` from
        ``start_revision`` on. Ends with ControlPlaneError when the watch breaks: the caller
        re-reads and watches again from the revision it saw."""
        try:
            watch = await self._client.watch_prefix(prefix.encode(), start_revision=start_revision)
            async for event in watch:
                yield str(event.kind), event.kv.key.decode(), _entry(event.kv)
        except (aetcd.exceptions.ClientError, *_TRANSIENT) as exc:
            raise ControlPlaneError(f"etcd watch of {prefix} broke: {exc!r}") from exc


def _condition(txn: Any, compare: Compare) -> Any:
    key = compare.key.encode()
    range_end = aetcd.utils.prefix_range_end(key) if compare.prefix else None
    target = txn.mod if compare.target == "mod" else txn.create
    condition = target(key, range_end=range_end) if range_end else target(key)
    if compare.op == "==":
        return condition == compare.revision
    return condition < compare.revision


def _operation(txn: Any, op: Put | Delete) -> Any:
    key = op.key.encode()
    if isinstance(op, Put):
        return txn.put(key, op.value)
    if op.prefix:
        return txn.delete(key, range_end=aetcd.utils.prefix_range_end(key))
    return txn.delete(key)


def _entry(kv: Any) -> Entry:
    return Entry(
        key=kv.key.decode(),
        value=bytes(kv.value),
        create_revision=int(kv.create_revision),
        mod_revision=int(kv.mod_revision),
        lease=int(kv.lease),
    )
