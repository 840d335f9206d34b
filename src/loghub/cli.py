"""The `loghub` command: run a server, manage projects and logstores, produce and tail logs.

Every client command takes --endpoint and keys from flags or the environment
(LOGHUB_ENDPOINT, LOGHUB_ACCESS_KEY_ID, LOGHUB_ACCESS_KEY_SECRET). An https:// endpoint
speaks TLS; `loghub --ca-cert F ...` (or LOGHUB_CA_CERT) trusts the PEM bundle F instead of
the system's authorities, for a private or self-signed certificate. Errors print as
`error: <Code>: <message>` and exit with status 1, never a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.tree import Tree

from loghub.cli_admin import AsJson, group_app, logstore_describe, print_version, start_position
from loghub.client import LogHubClient, ShardInfo
from loghub.consumer.cli import consume
from loghub.errors import LogHubError, ShardReadOnly
from loghub.metadata.hashing import md5_hash_key, parse_hash_key
from loghub.pipelines.cli import pipeline_app
from loghub.server.config import Limits, ServerConfig, load_config_file
from loghub.server.quotas import ShardQuota, rate_per_s_max
from loghub.wire.logs import make_log_group

__all__ = ["app", "main"]

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
logstore_app.command("describe")(logstore_describe)
app.command()(consume)

err = Console(stderr=True)

Endpoint = Annotated[
    str, typer.Option(envvar="LOGHUB_ENDPOINT", help="host:port or https://host:port")
]
KeyId = Annotated[str, typer.Option(envvar="LOGHUB_ACCESS_KEY_ID", help="access key id")]
KeySecret = Annotated[
    str, typer.Option(envvar="LOGHUB_ACCESS_KEY_SECRET", help="access key secret")
]
Project = Annotated[str, typer.Option("--project", "-p", envvar="LOGHUB_PROJECT")]


# TLS: set once by the top-level --ca-cert option, read by every client command.
_tls: dict[str, Path | None] = {"ca_cert": None}


@app.callback()
def _options(
    ca_cert: Annotated[
        Path | None,
        typer.Option(envvar="LOGHUB_CA_CERT", help="PEM bundle to trust for https endpoints"),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=print_version, help="and exit")
    ] = False,
) -> None:
    _tls["ca_cert"] = ca_cert


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
) -> None:
    """Run a LogHub server."""
    from loghub.server import ServerConfig, load_key_grants, load_keys
    from loghub.server import serve as run_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
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
        # quotas
        shard_quota=_shard_quota(
            shard_write_bytes_per_s, shard_write_requests_per_s, shard_read_bytes_per_s
        ),
        limits=Limits(**given_limits),
    )
    run_server(server_config)


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


def _log_record(line: str, time_field: str) -> tuple[int, dict[str, str]] | None:
    line = line.strip()
    if not line:
        return None
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError("each line must be a JSON object")
    log_time = value.pop(time_field, None)
    when = int(log_time) if isinstance(log_time, int | float) else int(time.time())
    contents = {
        str(k): v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
        for k, v in value.items()
    }
    return when, contents


class _Router:
    """Sends each log to the readwrite shard whose range covers its key, in one group per
    shard; after a split or merge (ShardReadOnly) it refreshes the shard list and re-sends."""

    def __init__(self, client: LogHubClient, project: str, logstore: str) -> None:
        self.client, self.project, self.logstore = client, project, logstore
        self.shards: list[ShardInfo] = []
        self.refresh()

    def refresh(self) -> None:
        self.shards = [
            s for s in self.client.list_shards(self.project, self.logstore) if s.writable
        ]

    def shard_for(self, key: int) -> int:
        for shard in self.shards:
            begin = parse_hash_key(shard.inclusive_begin_key)
            end = parse_hash_key(shard.exclusive_end_key)
            if begin <= key < end or (key == end and end == 2**128 - 1):
                return shard.shard_id
        raise LogHubError(f"no readwrite shard covers key {key:032x}")

    def send(self, records: list[tuple[int, dict[str, str]]], keys: list[int]) -> None:
        pending = list(zip(records, keys, strict=True))
        for _attempt in range(5):
            buckets: dict[int, list[tuple[tuple[int, dict[str, str]], int]]] = {}
            for record, key in pending:
                buckets.setdefault(self.shard_for(key), []).append((record, key))
            pending = []
            for shard_id, bucket in buckets.items():
                group = make_log_group([record for record, _ in bucket])
                try:
                    self.client.put_log_group(self.project, self.logstore, group, shard_id=shard_id)
                except ShardReadOnly:
                    pending.extend(bucket)  # split or merged since: route these again
            if not pending:
                return
            self.refresh()
        raise LogHubError("shards kept changing while sending; giving up")


def _batches(
    lines: Iterator[str], batch_size: int, time_field: str
) -> Iterator[list[tuple[int, dict[str, str]]]]:
    batch: list[tuple[int, dict[str, str]]] = []
    for number, line in enumerate(lines, 1):
        try:
            record = _log_record(line, time_field)
        except ValueError as exc:
            raise LogHubError(f"line {number}: {exc}") from exc
        if record is not None:
            batch.append(record)
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


@app.command()
def produce(
    logstore: str,
    project: Project,
    hash_key_field: Annotated[
        str | None, typer.Option(help="route each log by the MD5 of this field")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="logs per PutLogs")] = 4096,
    time_field: Annotated[str, typer.Option(help="field holding unix seconds")] = "__time__",
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Send JSON lines from stdin to a logstore, in batches."""
    sent = 0
    with (
        _client(endpoint, access_key_id, access_key_secret) as client,
        Progress(
            TextColumn("[bold]produce"),
            BarColumn(),
            TextColumn("{task.completed} logs"),
            TimeElapsedColumn(),
            console=err,
            transient=False,
            disable=not err.is_terminal,
        ) as progress,
    ):
        task = progress.add_task("produce", total=None)
        router = _Router(client, project, logstore) if hash_key_field else None
        for batch in _batches(iter(sys.stdin), batch_size, time_field):
            if router is not None:
                assert hash_key_field is not None
                keys = [md5_hash_key(contents.get(hash_key_field, "")) for _, contents in batch]
                router.send(batch, keys)
            else:
                client.put_log_group(project, logstore, make_log_group(batch))
            sent += len(batch)
            progress.update(task, completed=sent)
    err.print(f"sent {sent} logs")


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


def main() -> None:
    try:
        app()
    except LogHubError as exc:
        err.print(f"error: {exc}")
        raise SystemExit(1) from None
