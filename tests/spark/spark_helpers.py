"""Helpers of the Spark tests: writing numbered logs, and reading what Spark delivered."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loghub.client import LogHubClient
from loghub.wire.logs import make_log_group

PROJECT = "spark"


@dataclass
class LogStore:
    client: LogHubClient
    endpoint: str
    name: str

    def options(self, **extra: Any) -> dict[str, str]:
        options = {"endpoint": self.endpoint, "project": PROJECT, "logstore": self.name}
        options.update({k: str(v) for k, v in extra.items()})
        return options

    def put(
        self,
        logs: list[dict[str, str]],
        *,
        shard_id: int | None = None,
        hash_key: str | None = None,
        time_s: int = 1_700_000_000,
        **group: Any,
    ) -> None:
        self.client.put_log_group(
            PROJECT,
            self.name,
            make_log_group([(time_s, log) for log in logs], **group),
            shard_id=shard_id,
            hash_key=hash_key,
        )


def numbered(first: int, count: int, **fields: str) -> list[dict[str, str]]:
    """Logs whose `n` content counts up from `first`."""
    return [{"n": str(first + i), **fields} for i in range(count)]
