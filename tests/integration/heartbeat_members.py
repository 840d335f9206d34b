"""Members of a server-side consumer group, kept alive by a heartbeat thread: what the
console and metrics tests watch "while a group runs", without the consumer library's timing
(each member holds exactly what the server grants it and checkpoints nothing by itself)."""

from __future__ import annotations

import threading

from loghub.client import LogHubClient


class HeartbeatMembers:
    """Heartbeats for each named consumer every ``interval_s`` until stopped."""

    def __init__(
        self,
        endpoint: str,
        project: str,
        logstore: str,
        group: str,
        consumers: list[str],
        interval_s: float = 0.5,
    ) -> None:
        self._client = LogHubClient(endpoint)
        self._where = (project, logstore, group)
        self.held: dict[str, list[int]] = {name: [] for name in consumers}
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)

    def __enter__(self) -> HeartbeatMembers:
        self.beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._client.close()

    def beat(self) -> None:
        with self._lock:
            for name, held in self.held.items():
                self.held[name] = self._client.heartbeat(*self._where, name, held)

    def owners(self) -> dict[int, str]:
        with self._lock:
            return {shard: name for name, shards in self.held.items() for shard in shards}

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.beat()
