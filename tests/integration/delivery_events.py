"""What consumer worker processes report, read back for the checkers: each log they
processed (a ``Delivery``) and the checkpoints they wrote. Shared by the consumer-worker
tests and the chaos checker, which read the same JSON-lines events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Delivery:
    key: str
    n: int
    shard: int
    seq: int
    pid: int
    t: int
    index: int  # position within its batch, to order logs processed together


def deliveries(events: list[dict[str, Any]]) -> list[Delivery]:
    return [
        Delivery(key, n, event["shard"], seq, event["pid"], event["t"], index)
        for event in events
        if event["e"] == "logs"
        for index, (key, n, seq) in enumerate(event["logs"])
    ]


def durable_checkpoint(events: list[dict[str, Any]], shard: int, before_ns: int) -> int:
    """The shard's last checkpoint written durably before ``before_ns`` (0: none)."""
    seqs = [
        e["seq"] for e in events if e["e"] == "ckpt" and e["shard"] == shard and e["t"] < before_ns
    ]
    return seqs[-1] if seqs else 0
