"""The admin commands of `loghub`: consumer groups (list, describe with lag, reset, delete),
`logstore describe`, `--version`, and the one time syntax every admin command accepts.

Kept apart from `cli.py` (serving, producing, tailing) so that what an operator runs to look
at and steer a hub reads as one piece. Every read command takes `--json` and then prints
the server's answer as one JSON document, for scripts; without it, a rich table.

Times (`--to` of `group reset`) are epoch seconds (`1700000000`, `1700000000.5`), ISO 8601
(`2026-11-25T03:00:00Z`; without an offset it is UTC) or relative to now (`-15m`, `-2h`,
`-1d`, `-30s`, `now`).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

import loghub
from loghub import _times
from loghub.client import LogHubClient
from loghub.wire.cursor import decode_cursor, encode_cursor

__all__ = [
    "AsJson",
    "group_app",
    "logstore_describe",
    "parse_time_s",
    "print_version",
    "start_position",
]

group_app = typer.Typer(
    no_args_is_help=True, help="List, describe (with lag), reset and delete consumer groups."
)

Endpoint = Annotated[
    str, typer.Option(envvar="LOGHUB_ENDPOINT", help="host:port or https://host:port")
]
KeyId = Annotated[str, typer.Option(envvar="LOGHUB_ACCESS_KEY_ID", help="access key id")]
KeySecret = Annotated[
    str, typer.Option(envvar="LOGHUB_ACCESS_KEY_SECRET", help="access key secret")
]
Project = Annotated[str, typer.Option("--project", "-p", envvar="LOGHUB_PROJECT")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]

# the consumer name a reset writes its checkpoints under, so `updateTime` readers can tell
_RESET_CONSUMER = "loghub-cli-reset"


def print_version(value: bool) -> None:
    """Eager callback of `loghub --version`."""
    if value:
        print(f"loghub {loghub.__version__}")
        raise typer.Exit()


def parse_time_s(text: str, now_s: float) -> float:
    """Epoch seconds from any accepted spelling (``loghub._times``); a wrong one is a usage
    error naming all three, not a server error later."""
    try:
        return _times.parse_time_s(text, now_s)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def start_position(text: str) -> str:
    """A ``--from`` value for GetCursor: ``begin``, ``end``, or any accepted time spelling."""
    try:
        return _times.start_position(text, time.time())
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _client(ctx: typer.Context, endpoint: str, key_id: str, key_secret: str) -> LogHubClient:
    # `loghub --ca-cert` is an option of the root command; read it from there
    ca_cert = ctx.find_root().params.get("ca_cert")
    return LogHubClient(endpoint, key_id, key_secret, ca_cert=ca_cert)


def _console() -> Console:
    # a pipe gets a wide console, so tables are not squeezed to 80 columns in logs and tests
    return Console() if sys.stdout.isatty() else Console(width=160)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _fail(message: str) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(f"error: {message}", markup=False)
    return typer.Exit(1)


def _lag_s(value: Any) -> str:
    return "?" if value is None else f"{value:.1f}"


def _seq(cursor: str) -> str:
    return str(decode_cursor(cursor)) if cursor else "-"


@group_app.command("create")
def group_create(
    ctx: typer.Context,
    logstore: str,
    group: str,
    project: Project,
    timeout: Annotated[
        int, typer.Option(help="seconds without a heartbeat before a consumer is gone")
    ] = 60,
    ordered: Annotated[
        bool, typer.Option(help="children only after their parents are read")
    ] = False,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Create a consumer group (consumers also create theirs on start)."""
    with _client(ctx, endpoint, access_key_id, access_key_secret) as client:
        client.create_consumer_group(project, logstore, group, timeout, ordered)
    print(f"created consumer group {group} of {project}/{logstore}")


@group_app.command("list")
def group_list(
    ctx: typer.Context,
    logstore: str,
    project: Project,
    as_json: AsJson = False,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """List a logstore's consumer groups with their live consumers and total lag."""
    with _client(ctx, endpoint, access_key_id, access_key_secret) as client:
        names = [str(g["name"]) for g in client.list_consumer_groups(project, logstore)]
        described = [client.describe_consumer_group(project, logstore, n) for n in names]
    if as_json:
        _print_json([{k: v for k, v in d.items() if k != "shards"} for d in described])
        return
    table = Table("group", "timeout s", "ordered", "consumers", "lag groups", "lag s")
    for d in described:
        table.add_row(
            str(d["consumerGroup"]),
            str(d["timeout"]),
            "yes" if d["order"] else "no",
            str(len(d["consumers"])),
            str(d["lagGroups"]),
            _lag_s(d["lagSeconds"]),
        )
    _console().print(table)


@group_app.command("describe")
def group_describe(
    ctx: typer.Context,
    logstore: str,
    group: str,
    project: Project,
    as_json: AsJson = False,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Per shard: state, owner, checkpoint, end and lag (log groups and seconds); the total."""
    with _client(ctx, endpoint, access_key_id, access_key_secret) as client:
        described = client.describe_consumer_group(project, logstore, group)
    if as_json:
        _print_json(described)
        return
    consumers = ", ".join(described["consumers"]) or "none"
    table = Table(
        "shard",
        "status",
        "state",
        "owner",
        "checkpoint",
        "end",
        "lag groups",
        "lag s",
        title=f"group {group} of {project}/{logstore}: live consumers {consumers}",
        show_footer=True,
    )
    for shard in described["shards"]:
        table.add_row(
            str(shard["shard"]),
            str(shard["status"]),
            str(shard["state"]),
            str(shard["owner"]) or "-",
            _seq(str(shard["checkpoint"])),
            str(shard["endSeq"]),
            str(shard["lagGroups"]),
            _lag_s(shard["lagSeconds"]),
        )
    table.columns[0].footer = "total"
    table.columns[6].footer = str(described["lagGroups"])
    table.columns[7].footer = _lag_s(described["lagSeconds"])
    _console().print(table)


def _reset_target(
    client: LogHubClient,
    project: str,
    logstore: str,
    shard: dict[str, Any],
    to: str | None,
    shift: int | None,
    now_s: float,
) -> int:
    """The sequence a shard's checkpoint moves to: the server answers begin, end and times
    (GetCursor); a shift counts log groups from the current checkpoint, kept in range."""
    if shift is not None:
        current = decode_cursor(shard["checkpoint"]) if shard["checkpoint"] else shard["beginSeq"]
        return int(min(max(current + shift, shard["beginSeq"]), shard["endSeq"]))
    assert to is not None
    position: str | int = to if to in ("begin", "end") else int(parse_time_s(to, now_s))
    return decode_cursor(client.get_cursor(project, logstore, int(shard["shard"]), position))


def _reset_plan(
    client: LogHubClient,
    project: str,
    logstore: str,
    shards: list[dict[str, Any]],
    to: str | None,
    shift: int | None,
) -> list[dict[str, Any]]:
    """Per shard: the checkpoint now (``fromSeq``, None if none) and where it moves."""
    now_s = time.time()
    plan = []
    for entry in shards:
        target = _reset_target(client, project, logstore, entry, to, shift, now_s)
        current = decode_cursor(entry["checkpoint"]) if entry["checkpoint"] else None
        plan.append(
            {
                "shard": entry["shard"],
                "fromSeq": current,
                "toSeq": target,
                "to": encode_cursor(target),
            }
        )
    return plan


def _print_plan(group: str, plan: list[dict[str, Any]], execute: bool, live: list[str]) -> None:
    table = Table("shard", "checkpoint now", "new checkpoint", "change")
    for step in plan:
        before = step["fromSeq"]
        change = "" if before is None else f"{int(step['toSeq']) - int(before):+d}"
        table.add_row(
            str(step["shard"]), "-" if before is None else str(before), str(step["toSeq"]), change
        )
    _console().print(table)
    if execute:
        print(f"reset {len(plan)} checkpoints of group {group}")
    else:
        print("dry run: nothing changed; add --execute to apply")
        if live:
            print(f"live consumers: {', '.join(live)} (--execute needs --force while they run)")


@group_app.command("reset")
def group_reset(
    ctx: typer.Context,
    logstore: str,
    group: str,
    project: Project,
    to: Annotated[
        str | None, typer.Option(help="begin, end, or a time (epoch s, ISO 8601, -15m)")
    ] = None,
    shift: Annotated[
        int | None, typer.Option(help="move by this many log groups (negative: back)")
    ] = None,
    shard: Annotated[list[int] | None, typer.Option(help="only this shard (repeatable)")] = None,
    execute: Annotated[bool, typer.Option(help="apply the plan (default: only print it)")] = False,
    force: Annotated[bool, typer.Option(help="apply even while consumers are live")] = False,
    as_json: AsJson = False,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Move checkpoints to begin, end, a time or by a shift: prints the plan, and applies it
    only with --execute (refused while the group has live consumers, unless --force)."""
    if (to is None) == (shift is None):
        raise typer.BadParameter("give exactly one of --to and --shift")
    if to is not None and to not in ("begin", "end"):
        parse_time_s(to, time.time())  # a bad time is a usage error before any request
    with _client(ctx, endpoint, access_key_id, access_key_secret) as client:
        described = client.describe_consumer_group(project, logstore, group)
        chosen = [s for s in described["shards"] if shard is None or s["shard"] in shard]
        unknown = sorted(set(shard or ()) - {int(s["shard"]) for s in chosen})
        if unknown:
            raise _fail(f"logstore {logstore} has no shard {', '.join(map(str, unknown))}")
        plan = _reset_plan(client, project, logstore, chosen, to, shift)
        live = described["consumers"]
        if execute and live and not force:
            raise _fail(
                f"group {group} has live consumers ({', '.join(live)}): stop them first, or "
                "pass --force (they may overwrite the new checkpoints)"
            )
        if execute:
            for step in plan:
                client.update_checkpoint(
                    project,
                    logstore,
                    group,
                    int(step["shard"]),
                    str(step["to"]),
                    consumer=_RESET_CONSUMER,
                    force=True,
                )
    if as_json:
        _print_json({"group": group, "executed": execute, "plan": plan})
    else:
        _print_plan(group, plan, execute, live)


@group_app.command("delete")
def group_delete(
    ctx: typer.Context,
    logstore: str,
    group: str,
    project: Project,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Delete a consumer group and its checkpoints (asks first, unless --yes)."""
    if not yes and not typer.confirm(
        f"delete consumer group {group} of {project}/{logstore} and its checkpoints?"
    ):
        raise _fail("not deleted")
    with _client(ctx, endpoint, access_key_id, access_key_secret) as client:
        client.delete_consumer_group(project, logstore, group)
    print(f"deleted consumer group {group} of {project}/{logstore}")


def logstore_describe(
    ctx: typer.Context,
    name: str,
    project: Project,
    as_json: AsJson = False,
    endpoint: Endpoint = "127.0.0.1:8080",
    access_key_id: KeyId = "",
    access_key_secret: KeySecret = "",
) -> None:
    """Show a logstore's retention, size, write rate, shards and consumer groups."""
    with _client(ctx, endpoint, access_key_id, access_key_secret) as client:
        described = client.describe_logstore(project, name)
        groups = [str(g["name"]) for g in client.list_consumer_groups(project, name)]
    described["consumerGroups"] = groups
    if as_json:
        _print_json(described)
        return
    store = described["logstore"]
    window_s = described["rateWindowSeconds"]
    table = Table(
        "shard", "status", "size bytes", "begin", "end", f"groups/s (last {window_s} s)",
        title=f"logstore {project}/{name}: retention {store['ttl']} days, "
        f"consumer groups: {', '.join(groups) or 'none'}",
        show_footer=True,
    )  # fmt: skip
    for shard in described["shards"]:
        table.add_row(
            str(shard["shard"]), str(shard["status"]), str(shard["sizeBytes"]),
            str(shard["beginSeq"]), str(shard["endSeq"]), f"{shard['groupsPerSecond']:.2f}",
        )  # fmt: skip
    table.columns[0].footer = "total"
    table.columns[2].footer = str(described["sizeBytes"])
    table.columns[5].footer = f"{described['groupsPerSecond']:.2f}"
    _console().print(table)
