"""The `loghub` command: run a server, manage projects and logstores, produce and tail logs.

Every client command takes --endpoint and keys from flags or the environment
(LOGHUB_ENDPOINT, LOGHUB_ACCESS_KEY_ID, LOGHUB_ACCESS_KEY_SECRET). An https:// endpoint
speaks TLS; `loghub --ca-cert F ...` (or LOGHUB_CA_CERT) trusts the PEM bundle F instead of
the system's authorities, for a private or self-signed certificate. Errors print as
`error: <Code>: <message>` and exit with status 1, never a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import re
import select
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from loghub._retry import RetryPolicy
from loghub.cli_admin import (
    AsJson,
    Endpoint,
    KeyId,
    KeySecret,
    Project,
    group_app,
    logstore_describe,
    print_version,
    start_position,
)
from loghub.client import LogHubClient, ShardInfo
from loghub.client.producer import BadLine, ParsedBatch, Sender, parse_lines
from loghub.consumer.cli import consume
from loghub.consumer.cli import set_debug as set_consumer_debug
from loghub.errors import (
    DatabaseError,
    InvalidAccessKeyId,
    LogHubError,
    LogStoreNotExist,
    ProjectNotExist,
    QuotaError,
    RequestTimeTooSkewed,
    ServerBusy,
    ShardReadOnly,
    SignatureNotMatch,
    StorageFull,
    TransportError,
    Unauthorized,
    UnsupportedFormatError,
)
from loghub.metadata.hashing import md5_hash_key, parse_hash_key
from loghub.pipelines.cli import pipeline_app
from loghub.server.config import ClusterConfig, Limits, ServerConfig, load_config_file
from loghub.server.quotas import ShardQuota, rate_per_s_max
from loghub.wire.proto import Log, LogGroup

__all__ = ["app", "error_hint", "main"]

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="LogHub: a self-hosted log hub that speaks the LogHub protocol.",
)
project_app = typer.Typer(no_args_is_help=True, help="Create and list projects.")
logstore_app = typer.Typer(no_args_is_help=True, help="Create, list and delete logstores.")
shard_app = typer.Typer(no_args_is_help=True, help="List, split and merge shards.")
app.add_typer(project_app, name="project")
app.add_typer(logstore_app, name="logstore")
app.add_typer(shard_app, name="shard")
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(group_app, name="group")
cluster_app = typer.Typer(no_args_is_help=True, help="A cluster of nodes on etcd.")
node_app = typer.Typer(no_args_is_help=True, help="Drain a node of a cluster, or undo that.")
app.add_typer(cluster_app, name="cluster")
app.add_typer(node_app, name="node")
ClusterUrl = Annotated[
    str, typer.Option("--cluster", help="the cluster's etcd: etcd://h1:2379,h2:2379,h3:2379")
]
logstore_app.command("describe")(logstore_describe)
app.command()(consume)

err = Console(stderr=True)


# TLS: set once by the top-level --ca-cert option, read by every client command.
_tls: dict[str, Path | None] = {"ca_cert": None}
# --debug: an error shows its traceback instead of one line
_debug = {"on": False}


@app.callback()
def _options(
    ca_cert: Annotated[
        Path | None,
        typer.Option(envvar="LOGHUB_CA_CERT", help="PEM bundle to trust for https endpoints"),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=print_version, help="and exit")
    ] = False,
    debug: Annotated[
        bool, typer.Option(envvar="LOGHUB_DEBUG", help="show the traceback of an error")
    ] = False,
) -> None:
    _tls["ca_cert"] = ca_cert
    _debug["on"] = debug
    set_consumer_debug(debug)


def _client(endpoint: str, key_id: str, key_secret: str) -> LogHubClient:
    return LogHubClient(endpoint, key_id, key_secret, ca_cert=_tls["ca_cert"])


def _read_config_file(ctx: typer.Context, path: Path | None) -> Path | None:
    """Eager callback of --config: the file's settings become the defaults of the other
    flags (click's default_map), so a flag given on the command line overrides the file and
    every value is checked and converted as the flag's own would be."""
    if path is None:
        return None
    settings = load_config_file(path)
    known = {param.name for param in ctx.command.params} - {"config"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise typer.BadParameter(f"{path} sets unknown settings: {', '.join(unknown)}")
    ctx.default_map = {**(ctx.default_map or {}), **settings}
    return path


_DEFAULT_LIMITS = Limits()


def _limit_help(text: str, name: str) -> str:
    return f"{text} (default {getattr(_DEFAULT_LIMITS, name)})"


@app.command()
def serve(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="TOML or JSON file of settings, named as these flags; flags override it",
            is_eager=True,
            callback=_read_config_file,
        ),
    ] = None,
    data_dir: Annotated[Path, typer.Option(help="where logs and metadata are kept")] = Path("data"),
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8080,
    database_url: Annotated[
        str | None, typer.Option(help="metadata database URL (default: SQLite in data dir)")
    ] = None,
    keys_file: Annotated[
        Path | None,
        typer.Option(
            help='JSON file of access keys {"id": "secret"} or'
            ' {"id": {"secret", "projects", "access"}}'
        ),
    ] = None,
    fsync: Annotated[str, typer.Option(help="always (group commit) or interval")] = "always",
    fsync_interval_ms: Annotated[int, typer.Option(help="with --fsync interval")] = 1000,
    public_host: Annotated[
        list[str] | None, typer.Option(help="a host name clients use for this server")
    ] = None,
    auto_split_bytes_per_s: Annotated[
        int, typer.Option(help="auto-split a shard writing faster than this")
    ] = ServerConfig.auto_split_bytes_per_s,
    auto_split_sustain_ms: Annotated[
        int, typer.Option(help="...for at least this long")
    ] = ServerConfig.auto_split_sustain_ms,
    auto_split_check_interval_s: Annotated[
        float, typer.Option(help="how often write rates are checked")
    ] = ServerConfig.auto_split_check_interval_s,
    retention_interval_s: Annotated[
        float, typer.Option(help="how often expired data is deleted")
    ] = ServerConfig.retention_interval_s,
    segment_bytes_max: Annotated[
        int, typer.Option(help="a shard's segment file rolls over at this size", min=1024)
    ] = ServerConfig.segment_bytes_max,
    open_files_max: Annotated[
        int,
        typer.Option(help="idle log files kept open (capped at half the open-files limit)", min=16),
    ] = ServerConfig.open_files_max,
    # TLS
    tls_cert: Annotated[
        Path | None, typer.Option(help="PEM certificate (chain): serve https with --tls-key")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert")] = None,
    v1_project_binding: Annotated[
        bool,
        typer.Option(help="refuse a v1 signature reused for another project (503 SignatureReused)"),
    ] = ServerConfig.v1_project_binding,
    # Kafka listener
    kafka_port: Annotated[
        int | None, typer.Option(help="also speak the Kafka protocol on this port (off unless set)")
    ] = None,
    kafka_advertised_host: Annotated[
        str | None,
        typer.Option(help="host Kafka clients are told to connect to (default: --host)"),
    ] = None,
    kafka_advertise: Annotated[
        str | None,
        typer.Option(
            help="host:port Kafka clients and other nodes reach this node's Kafka listener at"
            " (default: --kafka-advertised-host or --host, and --kafka-port)"
        ),
    ] = None,
    kafka_topic_separator: Annotated[
        str, typer.Option(help="Kafka topic = project<separator>logstore")
    ] = ServerConfig.kafka_topic_separator,
    kafka_initial_rebalance_delay_ms: Annotated[
        int, typer.Option(help="a new Kafka group waits this long for more members", min=0)
    ] = ServerConfig.kafka_initial_rebalance_delay_ms,
    # quotas
    shard_write_bytes_per_s: Annotated[
        int, typer.Option(help="per-shard write quota in raw bytes/s (0: none)", min=0)
    ] = ShardQuota.write_bytes_per_s,
    shard_write_requests_per_s: Annotated[
        int, typer.Option(help="per-shard write quota in requests/s (0: none)", min=0)
    ] = ShardQuota.write_requests_per_s,
    shard_read_bytes_per_s: Annotated[
        int, typer.Option(help="per-shard read quota in raw bytes/s (0: none)", min=0)
    ] = ShardQuota.read_bytes_per_s,
    # -- limits (Limits fields; None: the default there) ---------------------------------------
    request_body_bytes_max: Annotated[
        int | None,
        typer.Option(help=_limit_help("larger bodies get 413", "request_body_bytes_max")),
    ] = None,
    raw_body_bytes_max: Annotated[
        int | None,
        typer.Option(help=_limit_help("larger raw PutLogs bodies get 413", "raw_body_bytes_max")),
    ] = None,
    logs_per_group_max: Annotated[
        int | None,
        typer.Option(help=_limit_help("more logs in a group get 413", "logs_per_group_max")),
    ] = None,
    pull_groups_max: Annotated[
        int | None, typer.Option(help=_limit_help("largest PullLogs count", "pull_groups_max"))
    ] = None,
    pull_bytes_max: Annotated[
        int | None, typer.Option(help=_limit_help("raw bytes per pull reply", "pull_bytes_max"))
    ] = None,
    pull_wait_ms_max: Annotated[
        int | None,
        typer.Option(help=_limit_help("longest long-poll wait of a pull", "pull_wait_ms_max")),
    ] = None,
    pull_waiters_max: Annotated[
        int | None,
        typer.Option(help=_limit_help("pulls waiting for data at once", "pull_waiters_max")),
    ] = None,
    pull_buffer_bytes_kept_max: Annotated[
        int | None,
        typer.Option(
            help=_limit_help("read buffers kept between pulls", "pull_buffer_bytes_kept_max")
        ),
    ] = None,
    clock_skew_s_max: Annotated[
        int | None,
        typer.Option(help=_limit_help("signed request date tolerance", "clock_skew_s_max")),
    ] = None,
    header_timeout_s: Annotated[
        float | None,
        typer.Option(help=_limit_help("time to send a request head", "header_timeout_s")),
    ] = None,
    body_timeout_s: Annotated[
        float | None,
        typer.Option(help=_limit_help("a body stalled this long is cut", "body_timeout_s")),
    ] = None,
    idle_timeout_s: Annotated[
        float | None,
        typer.Option(help=_limit_help("idle keep-alive connections close", "idle_timeout_s")),
    ] = None,
    connections_max: Annotated[
        int | None,
        typer.Option(help=_limit_help("open connections; more get 503", "connections_max")),
    ] = None,
    inflight_body_bytes_max: Annotated[
        int | None,
        typer.Option(
            help=_limit_help("request body bytes handled at once", "inflight_body_bytes_max")
        ),
    ] = None,
    inflight_wait_s: Annotated[
        float | None,
        typer.Option(help=_limit_help("wait for room, then 503", "inflight_wait_s")),
    ] = None,
    # -- cluster -------------------------------------------------------------------------------
    cluster: Annotated[
        str | None,
        typer.Option(help="run as a node of a cluster: etcd://h1:2379,h2:2379,h3:2379"),
    ] = None,
    node_id: Annotated[str | None, typer.Option(help="this node's id in the cluster")] = None,
    rack: Annotated[str, typer.Option(help="this node's rack (shards spread over racks)")] = "",
    advertise: Annotated[
        str | None,
        typer.Option(help="host:port other nodes reach this one at (default: --host:--port)"),
    ] = None,
    node_ttl_s: Annotated[
        int, typer.Option(help="seconds without contact after which a node is gone", min=1)
    ] = 3,
    replication_factor: Annotated[
        int, typer.Option(help="copies of each shard, on that many nodes (same on every node)")
    ] = 1,
    min_insync_replicas: Annotated[
        int, typer.Option(help="writes are refused while fewer replicas are in sync")
    ] = 2,
    replica_lag_ms: Annotated[
        int, typer.Option(help="a follower behind for this long leaves the in-sync replicas")
    ] = 3000,
) -> None:
    """Run a LogHub server (alone, or as a node of a cluster with --cluster)."""
    from loghub.server import ServerConfig, load_key_grants, load_keys
    from loghub.server import serve as run_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # httpx logs every request at INFO: in a cluster that is a line per forward and per
    # follower fetch (hundreds a second), which costs more than the fetch's own work
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if fsync not in ("always", "interval"):
        raise typer.BadParameter("--fsync must be always or interval")
    policy: Literal["always", "interval"] = "always" if fsync == "always" else "interval"
    given_limits = {
        name: ctx.params[name]
        for name in Limits.__dataclass_fields__
        if ctx.params.get(name) is not None
    }
    server_config = ServerConfig(
        data_dir=data_dir,
        host=host,
        port=port,
        database_url=database_url,
        keys=load_keys(keys_file),
        key_grants=load_key_grants(keys_file),
        base_hosts=ServerConfig.base_hosts + tuple(h.lower() for h in public_host or ()),
        fsync_policy=policy,
        fsync_interval_ms=fsync_interval_ms,
        auto_split_bytes_per_s=auto_split_bytes_per_s,
        auto_split_sustain_ms=auto_split_sustain_ms,
        auto_split_check_interval_s=auto_split_check_interval_s,
        retention_interval_s=retention_interval_s,
        segment_bytes_max=segment_bytes_max,
        open_files_max=open_files_max,
        # TLS
        tls_cert_file=tls_cert,
        tls_key_file=tls_key,
        v1_project_binding=v1_project_binding,
        kafka_port=kafka_port,
        kafka_advertised_host=kafka_advertised_host,
        kafka_advertise=kafka_advertise,
        kafka_topic_separator=kafka_topic_separator,
        kafka_initial_rebalance_delay_ms=kafka_initial_rebalance_delay_ms,
        # quotas
        shard_quota=_shard_quota(
            shard_write_bytes_per_s, shard_write_requests_per_s, shard_read_bytes_per_s
        ),
        limits=Limits(**given_limits),
        cluster=_cluster_config(
            cluster,
            node_id,
            advertise or f"{host}:{port}",
            rack,
            node_ttl_s,
            (replication_factor, min_insync_replicas, replica_lag_ms),
        ),
    )
    front_ends = _kafka_front_end(server_config)
    try:
        if front_ends:
            run_server(server_config, front_ends)
        else:
            run_server(server_config)
    except UnsupportedFormatError as exc:  # a data directory of a newer LogHub: not ours
        typer.echo(f"loghub serve: refused: {exc.message}", err=True)
        raise typer.Exit(2) from exc


def _kafka_front_end(config: ServerConfig) -> list[Any]:
    """The Kafka listener as a front end of `loghub serve`, its port bound now so that a port
    in use is an error at start-up."""
    if config.kafka_port is None:
        return []
    from loghub.kafka import start_listener
    from loghub.server.main import bind_listener, check_kafka

    check_kafka(config)
    sock = bind_listener(config.host, config.kafka_port)

    def start(service: Any) -> Any:
        # the service's config: in a cluster it holds the cluster's keys (``serve``)
        return start_listener(service, sock, service.config).stop

    return [start]


def _cluster_config(
    url: str | None,
    node_id: str | None,
    advertise: str,
    rack: str,
    node_ttl_s: int,
    replication: tuple[int, int, int] = (1, 2, 3000),
) -> ClusterConfig | None:
    if url is None:
        if node_id is not None or rack:
            raise typer.BadParameter("--node-id and --rack need --cluster")
        if replication[0] != 1:
            raise typer.BadParameter("--replication-factor needs --cluster")
        return None
    if not node_id:
        raise typer.BadParameter("--cluster needs --node-id")
    try:
        from loghub.cluster.etcd_store import parse_endpoints

        parse_endpoints(url)
        return ClusterConfig(url, node_id, advertise, rack, node_ttl_s, *replication)
    except (ValueError, LogHubError) as exc:
        raise typer.BadParameter(str(exc)) from exc


def _shard_quota(
    write_bytes_per_s: int, write_requests_per_s: int, read_bytes_per_s: int
) -> ShardQuota:
    for rate in (write_bytes_per_s, write_requests_per_s, read_bytes_per_s):
        if rate > rate_per_s_max:
            raise typer.BadParameter(f"a quota rate must be at most {rate_per_s_max}")
    return ShardQuota(write_bytes_per_s, write_requests_per_s, read_bytes_per_s)


@project_app.command("create")
def project_create(
    name: str,
    description: str = "",
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Create a project."""
    with _client(endpoint, access_key_id, access_key_secret) as client:
        client.create_project(name, description)
    print(f"created project {name}")


@project_app.command("list")
def project_list(
    as_json: AsJson = False,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """List projects."""
    with _client(endpoint, access_key_id, access_key_secret) as client:
        projects = client.list_projects()
    if as_json:
        print(json.dumps(projects, indent=2, ensure_ascii=False))
        return
    for project in projects:
        print(project["projectName"])


@logstore_app.command("create")
def logstore_create(
    name: str,
    project: Project,
    shards: Annotated[int, typer.Option(help="number of shards")] = 2,
    ttl: Annotated[int, typer.Option(help="days to keep data")] = 30,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Create a logstore."""
    with _client(endpoint, access_key_id, access_key_secret) as client:
        client.create_logstore(project, name, shard_count=shards, ttl_days=ttl)
    print(f"created logstore {project}/{name} with {shards} shards")


@logstore_app.command("list")
def logstore_list(
    project: Project,
    as_json: AsJson = False,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """List the logstores of a project."""
    with _client(endpoint, access_key_id, access_key_secret) as client:
        names = client.list_logstores(project)
    if as_json:
        print(json.dumps(names, indent=2, ensure_ascii=False))
        return
    for name in names:
        print(name)


@logstore_app.command("delete")
def logstore_delete(
    name: str,
    project: Project,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Delete a logstore and its data."""
    with _client(endpoint, access_key_id, access_key_secret) as client:
        client.delete_logstore(project, name)
    print(f"deleted logstore {project}/{name}")


def _shard_label(shard: ShardInfo) -> str:
    style = "green" if shard.writable else "dim"
    label = (
        f"[{style}]shard {shard.shard_id}[/{style}] {shard.status} "
        f"[{shard.inclusive_begin_key}, {shard.exclusive_end_key})"
    )
    if shard.end_cursor is not None:
        label += f" end {shard.end_cursor}"
    return label


def shard_tree(shards: list[ShardInfo]) -> Tree:
    """The lineage as a tree: original shards at the root, children under their parents (a
    merged shard appears under each of its two parents)."""
    by_id = {s.shard_id: s for s in shards}
    tree = Tree("shards")

    def add(node: Tree, shard: ShardInfo) -> None:
        branch = node.add(_shard_label(shard))
        for child in shard.children:
            if child in by_id:
                add(branch, by_id[child])

    for shard in shards:
        if not any(parent in by_id for parent in shard.parents):
            add(tree, shard)
    return tree


@shard_app.command("list")
def shard_list(
    logstore: str,
    project: Project,
    as_json: AsJson = False,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Show a logstore's shards as a lineage tree."""
    with _client(endpoint, access_key_id, access_key_secret) as client:
        shards = client.list_shards(project, logstore)
    if as_json:
        print(json.dumps([dataclasses.asdict(s) for s in shards], indent=2))
        return
    Console().print(shard_tree(shards))


@cluster_app.command("status")
def cluster_status(cluster: ClusterUrl, as_json: AsJson = False) -> None:
    """Nodes, the controller, shards per node, shards whose node is gone, and replicated
    shards with fewer replicas in sync than they have."""
    import asyncio

    from loghub.cluster.status import cluster_status as read_status

    status = asyncio.run(read_status(cluster))
    if as_json:
        print(json.dumps(status, indent=2))
        return
    console = Console()
    console.print(
        f"controller: {status['controller'] or '(none elected)'}"
        + (f" (epoch {status['controller_epoch']})" if status["controller"] else "")
    )
    table = Table(
        "node", "advertise", "rack", "draining", "shards", "replicas", "kafka (broker id)"
    )
    for node in status["nodes"]:
        kafka = f"{node['kafka']} ({node['kafka_broker_id']})" if node["kafka"] else ""
        table.add_row(node["node"], node["advertise"], node["rack"],
                      "yes" if node["draining"] else "", str(node["shards"]),
                      str(node["replicas"]), kafka)  # fmt: skip
    console.print(table)
    gone = status["unavailable_shards"]
    console.print(f"unavailable shards: {len(gone)}")
    for shard in gone:
        console.print(
            f"  {shard['project']}/{shard['logstore']} shard {shard['shard']} on {shard['node']}"
        )
    lagging = status["under_replicated_shards"]
    console.print(f"under-replicated shards: {len(lagging)}")
    for shard in lagging:
        console.print(
            f"  {shard['project']}/{shard['logstore']} shard {shard['shard']}: leader "
            f"{shard['leader']} (epoch {shard['epoch']}), in sync {', '.join(shard['isr'])} "
            f"of {', '.join(shard['replicas'])}"
        )


@cluster_app.command("keys")
def cluster_keys(
    cluster: ClusterUrl,
    keys_file: Annotated[
        Path,
        typer.Option(help="the cluster's new access keys: a keys file, as `serve --keys-file`"),
    ],
) -> None:
    """Replaces the access keys every node of the cluster accepts (add, rotate, revoke)."""
    import asyncio

    from loghub.cluster.keys import set_keys
    from loghub.server.config import parse_keys_document

    try:
        document = json.loads(keys_file.read_text())
        entries = parse_keys_document(document, f"keys file {keys_file}")
    except (OSError, ValueError, LogHubError) as exc:
        message = exc.message if isinstance(exc, LogHubError) else str(exc)
        raise typer.BadParameter(f"cannot use {keys_file}: {message}") from exc
    asyncio.run(set_keys(cluster, document))
    print(f"the cluster's access keys are now the {len(entries)} of {keys_file}; every node"
          " follows within a second")  # fmt: skip


@cluster_app.command("reassign")
def cluster_reassign(
    project: str,
    logstore: str,
    shard: int,
    replicas: Annotated[str, typer.Option(help="the new replica set, comma-separated node ids")],
    cluster: ClusterUrl,
) -> None:
    """Moves a replicated shard's copies to other nodes: the new ones catch up and join the
    in-sync replicas, then the old ones leave (leadership moves first if its node leaves)."""
    import asyncio

    from loghub.cluster.etcd_store import EtcdStore
    from loghub.cluster.membership import read_nodes
    from loghub.cluster.replicas import reassign

    target = tuple(r.strip() for r in replicas.split(",") if r.strip())
    if not target or len(set(target)) != len(target):
        raise typer.BadParameter("--replicas must name distinct node ids")

    async def run() -> tuple[str, ...]:
        async with EtcdStore(cluster) as store:
            live = await read_nodes(store)
            unknown = [r for r in target if r not in live]
            if unknown:
                raise typer.BadParameter(f"not live nodes of the cluster: {', '.join(unknown)}")
            return (await reassign(store, (project, logstore, shard), target)).replicas

    try:
        full = asyncio.run(run())
    except LookupError as exc:
        raise typer.BadParameter(str(exc)) from exc
    print(
        f"{project}/{logstore} shard {shard}: replicas {', '.join(full)} until "
        f"{', '.join(target)} are in sync; `loghub cluster status` shows the progress"
    )


@node_app.command("drain")
def node_drain(node_id: str, cluster: ClusterUrl) -> None:
    """Moves every writable shard off a node and places none on it (until undrain)."""
    import asyncio

    from loghub.cluster.status import set_drain

    asyncio.run(set_drain(cluster, node_id, True))
    print(f"node {node_id} drains; `loghub cluster status` shows its shards leave")


@node_app.command("undrain")
def node_undrain(node_id: str, cluster: ClusterUrl) -> None:
    """Lets a drained node take shards again."""
    import asyncio

    from loghub.cluster.status import set_drain

    asyncio.run(set_drain(cluster, node_id, False))
    print(f"node {node_id} takes shards again")


@shard_app.command("split")
def shard_split(
    logstore: str,
    shard: int,
    project: Project,
    key: Annotated[str | None, typer.Option(help="split key (default: mid-range)")] = None,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Split a readwrite shard in two (at the middle of its range by default)."""
    with _client(endpoint, access_key_id, access_key_secret) as client:
        parent, left, right = client.split_shard(project, logstore, shard, key)
    print(f"split shard {parent.shard_id} into {left.shard_id} and {right.shard_id}")


@shard_app.command("merge")
def shard_merge(
    logstore: str,
    shard: int,
    project: Project,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Merge a readwrite shard with its right-hand neighbour."""
    with _client(endpoint, access_key_id, access_key_secret) as client:
        merged, left, right = client.merge_shard(project, logstore, shard)
    print(f"merged shards {left.shard_id} and {right.shard_id} into {merged.shard_id}")


class _Router:
    """Sends each log to the readwrite shard whose range covers the MD5 of its key, in one
    group per shard; after a split or merge (ShardReadOnly) it refreshes the shard list and
    re-sends those logs. Runs on the producer's sender thread only."""

    def __init__(self, client: LogHubClient, project: str, logstore: str) -> None:
        self.client, self.project, self.logstore = client, project, logstore
        self.shards: list[tuple[int, int, int]] = []  # (begin, end, shard id)
        self.refresh()

    def refresh(self) -> None:
        self.shards = [
            (parse_hash_key(s.inclusive_begin_key), parse_hash_key(s.exclusive_end_key), s.shard_id)
            for s in self.client.list_shards(self.project, self.logstore)
            if s.writable
        ]

    def shard_for(self, key: int) -> int:
        for begin, end, shard_id in self.shards:
            if begin <= key < end or (key == end and end == 2**128 - 1):
                return shard_id
        raise LogHubError(f"no readwrite shard covers key {key:032x}")

    def send(self, batch: ParsedBatch) -> None:
        keys = map(md5_hash_key, batch.keys)
        pending: list[tuple[Log, int]] = list(zip(batch.group.Logs, keys, strict=True))
        for _attempt in range(5):
            buckets: dict[int, list[tuple[Log, int]]] = {}
            for log, key in pending:
                buckets.setdefault(self.shard_for(key), []).append((log, key))
            pending = []
            for shard_id, bucket in buckets.items():
                group = LogGroup()
                group.Logs.extend(log for log, _ in bucket)
                try:
                    self.client.put_log_group(self.project, self.logstore, group, shard_id=shard_id)
                except ShardReadOnly:
                    pending.extend(bucket)  # split or merged since: route these again
            if not pending:
                return
            self.refresh()
        raise LogHubError("shards kept changing while sending; giving up")


class _LineReader:
    """Whole lines from a file descriptor as they arrive, in large reads: ``read(timeout_s)``
    returns what is there within the timeout (maybe nothing), so a batch can be sent when
    its linger time is up even while the writer of a pipe is quiet.

    Inside ``with``, SIGTERM and SIGINT end the input (``stopped``) instead of the process,
    so what was read is still sent: the signal's wake-up byte ends a waiting ``select``."""

    _read_bytes = 1024 * 1024
    _stop_signals = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.eof = False
        self.stopped = False
        self._partial = b""
        self._wake_read, self._wake_write = os.pipe()
        for wake_fd in (self._wake_read, self._wake_write):
            os.set_blocking(wake_fd, False)
        self._previous_handlers: dict[int, Any] = {}
        self._previous_wakeup_fd = -1

    def __enter__(self) -> _LineReader:
        for signum in self._stop_signals:
            self._previous_handlers[signum] = signal.signal(signum, self._stop)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._wake_write)
        return self

    def __exit__(self, *exc_info: object) -> None:
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _stop(self, signum: int, frame: object) -> None:
        self.stopped = True

    @property
    def done(self) -> bool:
        return self.eof or self.stopped

    def read(self, timeout_s: float | None) -> list[bytes]:
        if self.done:
            return []
        ready, _, _ = select.select([self.fd, self._wake_read], [], [], timeout_s)
        if self._wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_read, 512)
        if self.fd not in ready:
            return []
        chunk = os.read(self.fd, self._read_bytes)
        if not chunk:
            self.eof = True
            rest, self._partial = self._partial, b""
            return [rest] if rest else []
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        return lines


_EXIT_LINES_SKIPPED = 3
_GC_THRESHOLD_OBJECTS = 200_000


def _report_bad_lines(bad: list[BadLine], shown: int) -> int:
    """Prints the first bad lines (a flood of them would hide everything else)."""
    for line in bad:
        if shown < _BAD_LINES_SHOWN_MAX:
            err.print(
                f"line {line.number}: skipped: {line.reason}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        elif shown == _BAD_LINES_SHOWN_MAX:
            err.print("more bad lines: only the count is shown from here", highlight=False)
        shown += 1
    return shown


_BAD_LINES_SHOWN_MAX = 100


@app.command()
def produce(
    logstore: str,
    project: Project,
    hash_key_field: Annotated[
        str | None, typer.Option(help="route each log by the MD5 of this field")
    ] = None,
    batch_size: Annotated[
        int, typer.Option(help="logs per PutLogs: a full batch is sent at once", min=1, max=65536)
    ] = 4096,
    linger_ms: Annotated[
        int, typer.Option(help="send a batch that is not full after this long", min=0)
    ] = 100,
    time_field: Annotated[str, typer.Option(help="field holding unix seconds")] = "__time__",
    retries: Annotated[
        int, typer.Option(help="tries per batch on retryable errors (5xx, busy, quota)", min=1)
    ] = 8,
    progress: Annotated[
        bool | None,
        typer.Option(help="a progress line on stderr (default: when stderr is a terminal)"),
    ] = None,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Send JSON lines from stdin to a logstore, like kafka-console-producer.

    A batch goes out when it holds --batch-size logs or --linger-ms after its first line, so
    `tail -F app.log | loghub produce ...` delivers each line within about the linger time.
    Bad lines (not a JSON object, a time that is not unix seconds) are reported with their
    line numbers and skipped; the exit status is then 3. SIGTERM or SIGINT ends the input:
    what was read is sent, then the command exits."""
    # Every batch makes tens of thousands of short-lived objects and no cycles; the default
    # collector thresholds would scan them again and again (a third of the time).
    gc.set_threshold(_GC_THRESHOLD_OBJECTS)
    policy = RetryPolicy(attempts_max=retries)
    show_progress = err.is_terminal if progress is None else progress
    with _client(endpoint, access_key_id, access_key_secret) as client:
        router = _Router(client, project, logstore) if hash_key_field else None

        def send(batch: ParsedBatch) -> None:
            if router is not None:
                router.send(batch)
            else:
                client.put_log_group(project, logstore, batch.group)

        def on_retry(attempt: int, exc: BaseException, wait_s: float) -> None:
            reason = " ".join(str(exc).split())
            err.print(
                f"retrying in {wait_s:.1f} s (try {attempt + 1} of {retries}): {reason}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

        sender: Sender[ParsedBatch] = Sender(send, policy, on_retry=on_retry)
        ticker = _ProgressLine(sender) if show_progress else None
        try:
            with _LineReader(sys.stdin.fileno()) as reader:
                skipped = _produce_lines(
                    reader,
                    sender,
                    batch_size=batch_size,
                    linger_s=linger_ms / 1000,
                    time_field=time_field,
                    hash_key_field=hash_key_field,
                    ticker=ticker,
                )
        finally:
            sender.close()
            if ticker is not None:
                ticker.done()
    message = f"sent {sender.sent_logs} logs"
    if skipped:
        message += f", skipped {skipped} bad lines"
    err.print(message, highlight=False, soft_wrap=True)
    if skipped:
        raise typer.Exit(_EXIT_LINES_SKIPPED)


def _produce_lines(
    reader: _LineReader,
    sender: Sender[ParsedBatch],
    *,
    batch_size: int,
    linger_s: float,
    time_field: str,
    hash_key_field: str | None,
    ticker: _ProgressLine | None,
) -> int:
    """Reads until end of input, hands each batch to ``sender``; returns the lines skipped."""
    pending: list[bytes] = []
    next_number = 1  # of pending[0]
    deadline = 0.0
    skipped = 0

    def flush(count: int) -> None:
        nonlocal next_number, skipped
        lines = pending[:count]
        del pending[:count]
        batch = parse_lines(lines, next_number, time_field, int(time.time()), hash_key_field)
        next_number += len(lines)
        skipped = _report_bad_lines(batch.bad, skipped)
        if batch.count:
            sender.submit(batch, batch.count)

    while not reader.done:
        timeout_s = None if not pending else max(0.0, deadline - time.monotonic())
        if ticker is not None:
            timeout_s = ticker.interval_s if timeout_s is None else min(timeout_s, 1.0)
        lines = reader.read(timeout_s)
        if lines and not pending:
            deadline = time.monotonic() + linger_s
        pending.extend(lines)
        while len(pending) >= batch_size:
            flush(batch_size)
            deadline = time.monotonic() + linger_s
        if pending and (reader.eof or time.monotonic() >= deadline):
            flush(len(pending))
        if ticker is not None:
            ticker.tick()
    if pending:  # stopped by a signal: what was read is sent all the same
        flush(len(pending))
    return skipped


class _ProgressLine:
    """One stderr line, rewritten in place about once a second: logs sent and the rate."""

    interval_s = 1.0

    def __init__(self, sender: Sender[ParsedBatch]) -> None:
        self.sender = sender
        self.started = self.shown = time.monotonic()

    def tick(self) -> None:
        now = time.monotonic()
        if now - self.shown >= self.interval_s:
            self.shown = now
            self._show(now, "\r")

    def done(self) -> None:
        self._show(time.monotonic(), "\n")

    def _show(self, now: float, end: str) -> None:
        sent = self.sender.sent_logs
        rate = sent / max(now - self.started, 1e-9)
        sys.stderr.write(f"\rproduce: {sent} logs sent, {rate:,.0f} logs/s{end}")
        sys.stderr.flush()


def _log_lines(shard_id: int, cursor: str, result_groups: Any) -> Iterator[str]:
    for group in result_groups:
        tags = {t.Key: t.Value for t in group.LogTags}
        for log_entry in group.Logs:
            yield json.dumps(
                {
                    "shard": shard_id,
                    "cursor": cursor,
                    "time": log_entry.Time,
                    "topic": group.Topic,
                    "source": group.Source,
                    "tags": tags,
                    "contents": {c.Key: c.Value for c in log_entry.Contents},
                },
                ensure_ascii=False,
            )


@app.command()
def tail(
    logstore: str,
    project: Project,
    shard: Annotated[int | None, typer.Option(help="one shard (default: all)")] = None,
    start: Annotated[
        str, typer.Option("--from", help="begin, end, or a time (epoch s, ISO 8601, -15m)")
    ] = "end",
    follow: Annotated[bool, typer.Option(help="keep waiting for new logs")] = True,
    poll_interval_s: Annotated[float, typer.Option(help="wait when caught up")] = 1.0,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Print a logstore's logs as JSON lines (shard, cursor, time, contents)."""
    with _client(endpoint, access_key_id, access_key_secret) as client:

        def all_shards() -> set[int]:
            return {s.shard_id for s in client.list_shards(project, logstore)}

        shard_ids = {shard} if shard is not None else all_shards()
        position = start_position(start)
        cursors = {s: client.get_cursor(project, logstore, s, position) for s in shard_ids}
        while True:
            if shard is None:  # shards made by splits and merges since: from their beginning
                for new_shard in sorted(all_shards() - set(cursors)):
                    cursors[new_shard] = client.get_cursor(project, logstore, new_shard, "begin")
            idle = True
            for shard_id, cursor in cursors.items():
                result = client.pull_logs(project, logstore, shard_id, cursor)
                for line in _log_lines(shard_id, cursor, result.log_groups):
                    print(line, flush=False)
                if result.count:
                    idle = False
                cursors[shard_id] = result.next_cursor
            sys.stdout.flush()
            if idle:
                if not follow:
                    return
                time.sleep(poll_interval_s)


@app.command()
def demo(
    data_dir: Annotated[Path, typer.Option(help="where the embedded server keeps data")] = Path(
        "run-data"
    ),
    logs: Annotated[int, typer.Option(help="sample access logs to produce")] = 20_000,
    pipeline: Annotated[bool, typer.Option(help="end with the Spark pipeline")] = True,
) -> None:
    """Start an embedded server, produce sample web access logs, read them back, summarise,
    and run the access-log pipeline on Spark over them."""
    from loghub.demo import run_demo

    run_demo(data_dir, logs, with_pipeline=pipeline)


_SQLALCHEMY_LINK = re.compile(r"\(Background on this error at: [^)]*\)")


def error_hint(exc: BaseException) -> str:
    """What to do about an expected failure, in a few words (empty when the message says
    it all)."""
    for kind, hint in _HINTS:
        if isinstance(exc, kind):
            return hint
    if isinstance(exc, LogHubError) and exc.status is not None and exc.status >= 500:
        request = f" (request id {exc.request_id})" if exc.request_id else ""
        return f"the server failed{request}: see its log"
    return ""


_HINTS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    (TransportError, "is a LogHub server running there? check --endpoint or LOGHUB_ENDPOINT"),
    (
        (InvalidAccessKeyId, SignatureNotMatch, Unauthorized),
        "check --access-key-id and --access-key-secret"
        " (LOGHUB_ACCESS_KEY_ID, LOGHUB_ACCESS_KEY_SECRET)",
    ),
    (RequestTimeTooSkewed, "set this machine's clock right (or the server's)"),
    (ProjectNotExist, "check --project, or create it: loghub project create NAME"),
    (LogStoreNotExist, "check the name, or create it: loghub logstore create NAME -p PROJECT"),
    (DatabaseError, "check --database-url (or --lease-url) and that the database server is up"),
    ((ServerBusy, QuotaError), "the server is at a limit: try again later or more slowly"),
    (StorageFull, "the server's disk is full: free space there"),
    (PermissionError, "check the file's permissions"),
)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, LogHubError):
        # a code means something only when it came over the wire
        text = str(exc) if exc.status is not None else exc.message
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = _SQLALCHEMY_LINK.sub("", text)
    text = " ".join(text.split())  # one line, whatever the message held
    hint = error_hint(exc)
    return f"error: {text}" + (f"; {hint}" if hint else "")


def main() -> None:
    """The `loghub` command: an expected failure prints one line and exits 1; with --debug
    (or LOGHUB_DEBUG=1) its traceback follows. Anything else is a bug: one line too, and
    --debug shows where."""
    try:
        app()
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as exc:
        if _debug["on"]:
            err.print_exception()
        expected = isinstance(exc, LogHubError | OSError)
        line = _one_line(exc)
        if not expected and not _debug["on"]:
            line += " (an unexpected error: run with --debug for the traceback)"
        err.print(line, markup=False, highlight=False, soft_wrap=True)
        raise SystemExit(1) from None
