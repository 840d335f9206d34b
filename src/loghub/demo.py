"""`make run`: the whole path on one machine, with nothing to install or start by hand.

Starts an embedded server on a local data directory, creates a project and a logstore,
produces sample web access logs (seeded, so every run makes the same logs), reads every
shard back, checks that what came back is what went in, prints a short summary, and ends
with the reference access-log pipeline on Spark (local mode) over what is in the logstore.
"""

from __future__ import annotations

import random
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from loghub.client import LogHubClient
from loghub.errors import AlreadyExistsError
from loghub.kafka import start_listener
from loghub.pipelines import SPARK_EXTRA_MISSING, spark_is_missing
from loghub.server.config import ServerConfig
from loghub.server.embedded import EmbeddedServer
from loghub.server.main import bind_listener
from loghub.wire.logs import make_log_group

__all__ = ["access_logs", "run_demo"]

PROJECT = "demo"
LOGSTORE = "access-log"
_HOSTS = ("shop.example.com", "api.example.com", "static.example.com")
_PATHS = ("/", "/cart", "/checkout", "/api/items", "/api/items/42", "/login", "/static/app.js")
_METHODS = ("GET", "GET", "GET", "POST", "PUT")
_STATUSES = (200,) * 40 + (201, 204, 301, 304, 400, 401, 404, 404, 500, 503)


def access_logs(
    count: int, seed: int = 7, start_s: int | None = None
) -> Iterator[tuple[int, dict[str, str]]]:
    """`count` web access logs as (unix seconds, fields), about 20 a second of event time."""
    rng = random.Random(seed)
    base_s = int(time.time()) - count // 20 if start_s is None else start_s
    for i in range(count):
        status = rng.choice(_STATUSES)
        yield (
            base_s + i // 20,
            {
                "host": rng.choice(_HOSTS),
                "method": rng.choice(_METHODS),
                "path": rng.choice(_PATHS),
                "status": str(status),
                "bytes": str(rng.randint(200, 50_000)),
                "latency_ms": f"{rng.lognormvariate(3.0, 0.8):.1f}",
                "client_ip": "10." + ".".join(str(rng.randint(1, 254)) for _ in range(3)),
                "user_agent": rng.choice(("curl/8.5", "Mozilla/5.0", "python-httpx/0.28")),
            },
        )


def _read_through_kafka(server: EmbeddedServer, console: Console, shards: int) -> None:
    """Starts the Kafka listener on the demo's server and reads the first logs of every shard
    back through it with kafka-python (a dev extra; without it, only the address is shown)."""
    sock = bind_listener("127.0.0.1", 0)
    listener = start_listener(server.app.service, sock, server.app.config)
    bootstrap = f"127.0.0.1:{sock.getsockname()[1]}"
    try:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                from kafka import KafkaConsumer, TopicPartition  # type: ignore[import-untyped]
        except ImportError:
            console.print(f"Kafka listener on {bootstrap}: topic {PROJECT}.{LOGSTORE}")
            return
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        consumer.assign([TopicPartition(f"{PROJECT}.{LOGSTORE}", p) for p in range(shards)])
        records = [r for batch in consumer.poll(timeout_ms=5000).values() for r in batch]
        consumer.close()
        console.print(
            f"Kafka listener on {bootstrap}: kafka-python read {len(records)} of those logs "
            f"from topic {PROJECT}.{LOGSTORE}, e.g. {records[0].value[:80]!r}"
            if records
            else f"Kafka listener on {bootstrap}: no records read"
        )
    finally:
        listener.stop()


def run_demo(
    data_dir: Path, log_count: int, console: Console | None = None, with_pipeline: bool = True
) -> dict[str, int]:
    console = console or Console()
    config = ServerConfig(data_dir=data_dir, port=0)
    sent = list(access_logs(log_count))
    with EmbeddedServer(config) as server, LogHubClient(server.endpoint) as client:
        console.print(
            f"[bold]LogHub[/bold] embedded server on {server.endpoint}, data in "
            f"{data_dir.resolve()}"
        )
        try:
            client.create_project(PROJECT, "make run demo")
            client.create_logstore(PROJECT, LOGSTORE, shard_count=4, ttl_days=7)
        except AlreadyExistsError:
            pass
        shards = client.list_shards(PROJECT, LOGSTORE)
        before = {
            s.shard_id: client.get_cursor(PROJECT, LOGSTORE, s.shard_id, "end") for s in shards
        }
        started = time.perf_counter()
        batch_size = 1000
        for i in range(0, len(sent), batch_size):
            group = make_log_group(
                sent[i : i + batch_size], topic="access", source="demo", tags={"env": "demo"}
            )
            client.put_log_group(PROJECT, LOGSTORE, group)
        produce_s = time.perf_counter() - started
        started = time.perf_counter()
        received: list[dict[str, str]] = []
        for shard in shards:
            for result in client.iter_pull(
                PROJECT, LOGSTORE, shard.shard_id, before[shard.shard_id]
            ):
                for group in result.log_groups:
                    received.extend({c.Key: c.Value for c in log.Contents} for log in group.Logs)
        read_s = time.perf_counter() - started
        expected = Counter(tuple(sorted(fields.items())) for _, fields in sent)
        got = Counter(tuple(sorted(fields.items())) for fields in received)
        if expected != got:
            raise SystemExit(f"demo: read back {len(received)} logs, not the {len(sent)} sent")
        _print_summary(console, received, len(shards), produce_s, read_s)
        _read_through_kafka(server, console, len(shards))
        if with_pipeline:
            # Spark starts in a second JVM: the slow part of the demo (about a minute)
            try:
                from loghub.pipelines.access_log import run_demo_pipeline
            except ImportError as exc:
                if not spark_is_missing(exc):
                    raise
                console.print(f"no pipeline: {SPARK_EXTRA_MISSING}", markup=False)
                return {"sent": len(sent), "received": len(received)}
            console.print("[bold]access-log pipeline[/bold] on Spark (local mode) ...")
            run_demo_pipeline(
                server.endpoint, PROJECT, LOGSTORE, data_dir / "pipeline", console=console
            )
    return {"sent": len(sent), "received": len(received)}


def _print_summary(
    console: Console, logs: list[dict[str, str]], shard_count: int, produce_s: float, read_s: float
) -> None:
    statuses = Counter(f"{fields['status'][0]}xx" for fields in logs)
    paths = Counter(fields["path"] for fields in logs)
    total_bytes = sum(int(fields["bytes"]) for fields in logs)
    console.print(
        f"produced {len(logs)} logs in {produce_s:.2f} s, read them back from "
        f"{shard_count} shards in {read_s:.2f} s: all present, none changed"
    )
    table = Table(title="requests by status class")
    table.add_column("status")
    table.add_column("requests", justify="right")
    for status, count in sorted(statuses.items()):
        table.add_row(status, str(count))
    console.print(table)
    top = ", ".join(f"{path} ({count})" for path, count in paths.most_common(3))
    console.print(f"busiest paths: {top}; bytes served: {total_bytes:,}")
