"""Lease stores for tests: ``MemoryLeaseStore`` (the SQL store's semantics, in a dict) and
``FaultyLeaseStore`` (wraps any store and fails or delays chosen calls, like the KCL's
exception-throwing lease refresher).

Faults are injected *before* the wrapped call, so a failed call never changed anything: the
store never leaves a worker unsure whether its write won. (A real database can: a commit that
succeeds while the connection drops. The protocol then sees its next renew lose and stops the
shard; at worst it stops consuming for a while, never consumes twice.)

Thread-safety: ``MemoryLeaseStore`` is safe to share between threads (one lock);
``FaultyLeaseStore`` is as safe as its random generator, i.e. one thread.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import replace

from loghub._clock import Clock
from loghub.coordination.lease import LeaseRecord, LeaseStore
from loghub.errors import DatabaseError

__all__ = ["FaultyLeaseStore", "MemoryLeaseStore"]


class MemoryLeaseStore:
    """One consumer group's ``worker`` and ``shard_lease`` tables, in memory."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._leases: dict[int, LeaseRecord] = {}
        self._heartbeat_at_ms: dict[str, int] = {}

    def register_worker(self, worker_name: str) -> None:
        with self._lock:
            self._heartbeat_at_ms[worker_name] = self._clock.wall_ms()

    def heartbeat(self, worker_name: str) -> None:
        self.register_worker(worker_name)

    def remove_worker(self, worker_name: str) -> None:
        with self._lock:
            self._heartbeat_at_ms.pop(worker_name, None)

    def recent_workers(self, within_ms: int) -> list[str]:
        with self._lock:
            oldest_ms = self._clock.wall_ms() - within_ms
            return sorted(w for w, at_ms in self._heartbeat_at_ms.items() if at_ms >= oldest_ms)

    def list_leases(self) -> list[LeaseRecord]:
        with self._lock:
            return [self._leases[shard_id] for shard_id in sorted(self._leases)]

    def get_lease(self, shard_id: int) -> LeaseRecord | None:
        with self._lock:
            return self._leases.get(shard_id)

    def create_leases(self, shard_ids: Collection[int]) -> None:
        with self._lock:
            for shard_id in shard_ids:
                self._leases.setdefault(shard_id, LeaseRecord(shard_id, 0))

    def compare_and_set(
        self, shard_id: int, seen_counter: int, lease_owner: str, consumer_owner: str | None
    ) -> bool:
        with self._lock:
            record = self._leases.get(shard_id)
            if record is None or record.lease_counter != seen_counter:
                return False
            self._leases[shard_id] = replace(
                record,
                lease_counter=seen_counter + 1,
                lease_owner=lease_owner,
                consumer_owner=record.consumer_owner if consumer_owner is None else consumer_owner,
            )
            return True

    def write_checkpoint(self, shard_id: int, consumer_owner: str, checkpoint: str) -> bool:
        with self._lock:
            record = self._leases.get(shard_id)
            if record is None or record.consumer_owner != consumer_owner:
                return False
            self._leases[shard_id] = replace(record, checkpoint=checkpoint)
            return True


_METHODS = (
    "register_worker",
    "heartbeat",
    "remove_worker",
    "recent_workers",
    "list_leases",
    "get_lease",
    "create_leases",
    "compare_and_set",
    "write_checkpoint",
)


class FaultyLeaseStore:
    """Wraps a store; fails or delays chosen calls with ``DatabaseError``.

    - ``fail_nth_call(method, n)``: the n-th call (1-based, counted from now on) fails.
    - ``set_failure_probability(p, methods)``: each call fails with probability p.
    - ``set_delay(p, delay_ms_max, methods)``: each call is first delayed, with probability p,
      by 1..delay_ms_max ms through ``sleep`` (a simulation passes ``FakeClock.advance``).
    ``calls`` and ``failures`` count per method, ``delays`` in all.
    """

    def __init__(
        self,
        inner: LeaseStore,
        rng: random.Random,
        *,
        sleep: Callable[[int], None] | None = None,
    ) -> None:
        self.inner = inner
        self.rng = rng
        self.sleep = sleep
        self.calls: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.delays = 0
        self._fail_at_call: dict[str, set[int]] = {}
        self._failure_probability: dict[str, float] = {}
        self._delay: dict[str, tuple[float, int]] = {}

    def fail_nth_call(self, method: str, n: int) -> None:
        assert method in _METHODS and n >= 1, (method, n)
        self._fail_at_call.setdefault(method, set()).add(self.calls[method] + n)

    def set_failure_probability(
        self, probability: float, methods: Collection[str] = _METHODS
    ) -> None:
        assert 0.0 <= probability <= 1.0 and set(methods) <= set(_METHODS)
        for method in methods:
            self._failure_probability[method] = probability

    def set_delay(
        self, probability: float, delay_ms_max: int, methods: Collection[str] = _METHODS
    ) -> None:
        assert 0.0 <= probability <= 1.0 and set(methods) <= set(_METHODS)
        assert probability == 0.0 or (delay_ms_max >= 1 and self.sleep is not None)
        for method in methods:
            self._delay[method] = (probability, delay_ms_max)

    def _before(self, method: str) -> None:
        self.calls[method] += 1
        probability, delay_ms_max = self._delay.get(method, (0.0, 0))
        if probability and self.rng.random() < probability:
            assert self.sleep is not None
            self.delays += 1
            self.sleep(self.rng.randint(1, delay_ms_max))
        planned = self.calls[method] in self._fail_at_call.get(method, ())
        chance = self._failure_probability.get(method, 0.0)
        if planned or (chance and self.rng.random() < chance):
            self.failures[method] += 1
            raise DatabaseError(f"injected fault: {method} call {self.calls[method]}")

    def register_worker(self, worker_name: str) -> None:
        self._before("register_worker")
        self.inner.register_worker(worker_name)

    def heartbeat(self, worker_name: str) -> None:
        self._before("heartbeat")
        self.inner.heartbeat(worker_name)

    def remove_worker(self, worker_name: str) -> None:
        self._before("remove_worker")
        self.inner.remove_worker(worker_name)

    def recent_workers(self, within_ms: int) -> list[str]:
        self._before("recent_workers")
        return self.inner.recent_workers(within_ms)

    def list_leases(self) -> list[LeaseRecord]:
        self._before("list_leases")
        return self.inner.list_leases()

    def get_lease(self, shard_id: int) -> LeaseRecord | None:
        self._before("get_lease")
        return self.inner.get_lease(shard_id)

    def create_leases(self, shard_ids: Collection[int]) -> None:
        self._before("create_leases")
        self.inner.create_leases(shard_ids)

    def compare_and_set(
        self, shard_id: int, seen_counter: int, lease_owner: str, consumer_owner: str | None
    ) -> bool:
        self._before("compare_and_set")
        return self.inner.compare_and_set(shard_id, seen_counter, lease_owner, consumer_owner)

    def write_checkpoint(self, shard_id: int, consumer_owner: str, checkpoint: str) -> bool:
        self._before("write_checkpoint")
        return self.inner.write_checkpoint(shard_id, consumer_owner, checkpoint)
