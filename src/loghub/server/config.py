"""Server configuration: where data lives, who may call, and every limit in one place.

Limits are named with their unit last and each says what happens when it is reached, so an
operator can reason about the server from this page alone (docs/configuration.md repeats it).
"""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from loghub.errors import ParameterInvalid
from loghub.server.quotas import ShardQuota

__all__ = [
    "ClusterConfig",
    "KeyGrant",
    "KeyRing",
    "Limits",
    "ServerConfig",
    "is_loopback_host",
    "keys_document",
    "load_config_file",
    "load_key_grants",
    "load_keys",
    "parse_keys_document",
    "split_keys",
]

_V = TypeVar("_V")

KEYS_ENV_ID = "LOGHUB_ACCESS_KEY_ID"
KEYS_ENV_SECRET = "LOGHUB_ACCESS_KEY_SECRET"


@dataclass(frozen=True)
class KeyGrant:
    """What one access key may touch: projects by name (``*`` for all) and whether it may
    only read or also write (write implies read). A key without a grant may do everything,
    as every key could before grants existed."""

    projects: frozenset[str] = frozenset({"*"})
    access: Literal["read", "write"] = "write"

    def allows(self, project: str, write: bool) -> bool:
        if write and self.access != "write":
            return False
        return "*" in self.projects or project in self.projects

    @property
    def all_projects(self) -> bool:
        return "*" in self.projects


@dataclass(frozen=True)
class Limits:
    # A request body over this is refused with 413 PostBodyTooLarge before it is read. The
    # SDK sends at most 30 MiB raw per PutLogs (its MAX_PUT_LOG_SIZE), uncompressed when asked
    # to, so this is the largest body a client of the protocol can need.
    request_body_bytes_max: int = 30 * 1024 * 1024
    # A decompressed PutLogs body over this is refused (413 PostBodyTooLarge); the SDK's cap.
    raw_body_bytes_max: int = 30 * 1024 * 1024
    # A log group with more logs is refused (413 PostBodyTooLarge); the SDK's own cap.
    logs_per_group_max: int = 512_000
    # PullLogs `count` must be 1..this (400 ParameterInvalid otherwise); the SDK asks for 1000.
    pull_groups_max: int = 1000
    # A pull stops adding groups once this many uncompressed bytes are in the reply (it always
    # returns at least one group); the caller continues from x-log-cursor.
    pull_bytes_max: int = 16 * 1024 * 1024
    # A pull with loghub_wait_ms that reaches the end of a shard waits for new data at most
    # this long (a longer wait asked for is cut to this; the reply's x-loghub-wait-ms says).
    pull_wait_ms_max: int = 30_000
    # Pulls waiting for new data at once; one more is answered at once, empty, with
    # x-loghub-wait-ms: 0 (its client pauses and pulls again, as without long polling).
    pull_waiters_max: int = 512
    # Bytes of read buffers kept between pulls for the next ones (a pull reads its groups
    # into one buffer; a new one each time is faulted in page by page). A buffer given back
    # past this bound is freed; more concurrent pulls allocate their own, as before. A full
    # pull's buffer is a little over pull_bytes_max (headers read beside the payloads), so
    # the default keeps five of them.
    pull_buffer_bytes_kept_max: int = 96 * 1024 * 1024
    # Request dates further than this from the server's clock are refused when auth is on.
    clock_skew_s_max: int = 900

    # -- connections and request memory (the HTTP server's own bounds) ------------------------
    # A connection that has not sent a whole request head (request line and headers) this
    # long after it opened, or after the request's first byte, is closed: slow-header
    # clients hold a socket each, and honest ones send a head in one packet.
    header_timeout_s: float = 10.0
    # A request body that makes no progress for this long is cut (the connection closed).
    # Counted only while the server is reading: time a body waits for room (below) is not
    # the client's fault. 60 s lets a slow link move a 30 MiB body in small steps.
    body_timeout_s: float = 60.0
    # A keep-alive connection with no request for this long is closed. The SDK reuses its
    # connections and reconnects when one was closed, so this only frees idle sockets.
    idle_timeout_s: float = 60.0
    # Open connections beyond this are answered 503 ServerBusy at once and closed, so fds
    # stay for the data; existing connections carry on.
    connections_max: int = 1000
    # Bytes of request bodies handled at once, each counted at the larger of its length and
    # its x-log-bodyrawsize: a body over the bound waits for room (it is not read meanwhile);
    # one body alone is always let in. This bounds the server's memory, since a body is
    # held compressed, raw, framed and parsed while it is checked and written.
    inflight_body_bytes_max: int = 32 * 1024 * 1024
    # How long a body waits for room before it is answered 503 ServerBusy with Retry-After.
    inflight_wait_s: float = 10.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ParameterInvalid(f"limit {name} must be a positive number, not {value!r}")


@dataclass(frozen=True)
class ClusterConfig:
    """``loghub serve --cluster``: this node's place in a cluster (docs/cluster.md)."""

    url: str  # etcd://h1:2379,h2:2379,h3:2379
    node_id: str
    advertise: str  # host:port other nodes forward requests to
    rack: str = ""
    # the node's lease: a node that stops refreshing it is gone this many seconds later
    node_ttl_s: int = 3
    # copies of each shard (docs/replication.md); 1: one copy, moved by hand-overs
    replication_factor: int = 1
    # a write is refused while fewer replicas than this are in sync
    min_insync_replicas: int = 2
    # a follower that has not caught up for this long leaves the in-sync replicas
    replica_lag_ms: int = 3000

    def __post_init__(self) -> None:
        if not 1 <= self.replication_factor <= 7:
            raise ParameterInvalid("--replication-factor must be 1 to 7")
        if self.replication_factor > 1 and not (
            1 <= self.min_insync_replicas <= self.replication_factor
        ):
            raise ParameterInvalid(
                "--min-insync-replicas must be at least 1 and at most --replication-factor"
            )
        if not 100 <= self.replica_lag_ms <= 600_000:
            raise ParameterInvalid("--replica-lag-ms must be 100 to 600000")
        if not self.node_id or not all(c.isalnum() or c in "-_." for c in self.node_id):
            raise ParameterInvalid(
                f"--node-id must be letters, digits, '-', '_' or '.', not {self.node_id!r}"
            )
        host, _, port = self.advertise.rpartition(":")
        if not host or not port.isdigit():
            raise ParameterInvalid(f"--advertise must be host:port, not {self.advertise!r}")
        if not 1 <= self.node_ttl_s <= 60:
            raise ParameterInvalid("the node TTL must be 1 to 60 seconds")


@dataclass(frozen=True)
class ServerConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    # SQLAlchemy URL of the metadata database; default: SQLite inside data_dir.
    database_url: str | None = None
    # access key id -> secret; empty means anonymous (loopback only).
    keys: Mapping[str, str] = field(default_factory=dict)
    # access key id -> what it may touch; a key not listed here may touch everything.
    key_grants: Mapping[str, KeyGrant] = field(default_factory=dict)
    # Host names that carry no project (a request to `<project>.<base>` is for <project>).
    base_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1", "[::1]")
    fsync_policy: Literal["always", "interval"] = "always"
    fsync_interval_ms: int = 1000
    segment_bytes_max: int = 256 * 1024 * 1024
    # Idle log files kept open (an LRU of descriptors); the server takes at most half of its
    # open-files limit for them, so that sockets and the database have the rest.
    open_files_max: int = 512
    retention_interval_s: float = 60.0
    # Threads beside the event loop for decompression, parsing, checksums and disk writes;
    # appends waiting for a group fsync hold one each, so this also caps concurrent appends.
    storage_threads: int = 64
    # Deprecated and ignored: earlier releases checked large PutLogs bodies in this many
    # worker processes, and bodies up to parse_inline_bytes_max in place. The check now runs
    # in the server process (docs/decisions.md); the fields stay so that code written for
    # those releases still builds a config. Asking for workers (a value over 0) warns.
    parse_processes: int = 0
    parse_inline_bytes_max: int = 64 * 1024
    # Auto-split (for logstores with autoSplit on): a shard that writes more than this many
    # bytes a second for auto_split_sustain_ms is split in the middle, up to maxSplitShard.
    auto_split_bytes_per_s: int = 5 * 1024 * 1024
    auto_split_sustain_ms: int = 60_000
    auto_split_check_interval_s: float = 5.0
    limits: Limits = field(default_factory=Limits)
    # TLS: with both files the server speaks only https (uvicorn's ssl_certfile/ssl_keyfile);
    # the key file may also hold the certificate chain's key in PEM. Without them, plain http.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # Bind each v1 signature to the project it was first used for (see server/auth.py). A
    # server reached only over TLS, where requests cannot be captured in transit, may turn it
    # off for v1 clients that send the same call to several projects within one second and
    # do not retry a 503 (the Node.js SDK, the OpenAPI SDKs in v1 mode).
    v1_project_binding: bool = True
    # Quotas: the per-shard rates every logstore gets unless its own JSON overrides them
    # (shardWriteQuotaBytesPerSecond, ...); 0 means none. Over a quota: 403
    # ShardWriteQuotaExceed / ShardReadQuotaExceed.
    shard_quota: ShardQuota = field(default_factory=ShardQuota)
    # Kafka listener (docs/kafka.md): off unless a port is given. Clients connect to what
    # Metadata advertises, so the advertised host must be reachable by them (default: host).
    kafka_port: int | None = None
    kafka_advertised_host: str | None = None
    # host:port Kafka clients are told to connect to (Metadata, FindCoordinator) and, in a
    # cluster, the address other nodes publish for this one; default: the host above (or
    # --host) and kafka_port, as --advertise defaults to --host:--port
    kafka_advertise: str | None = None
    kafka_topic_separator: str = "."
    kafka_initial_rebalance_delay_ms: int = 500
    # None: the single-node server (metadata in SQL); else a node of a cluster on etcd
    cluster: ClusterConfig | None = None

    def __post_init__(self) -> None:
        if self.parse_processes > 0:
            warnings.warn(
                "ServerConfig.parse_processes is ignored: PutLogs bodies are checked in the "
                "server process",
                DeprecationWarning,
                stacklevel=3,
            )

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def auth_enabled(self) -> bool:
        return bool(self.keys)

    def kafka_address(self) -> tuple[str, int] | None:
        """(host, port) Kafka clients connect to; None without a Kafka listener.
        ParameterInvalid for a ``kafka_advertise`` that is not host:port."""
        if self.kafka_port is None:
            return None
        if self.kafka_advertise is None:
            return self.kafka_advertised_host or self.host, self.kafka_port
        host, _, port = self.kafka_advertise.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ParameterInvalid(
                f"--kafka-advertise must be host:port, not {self.kafka_advertise!r}"
            )
        return host, int(port)

    def metadata_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'meta.db').resolve()}"


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_keys(keys_file: Path | None, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Access keys (id -> secret) from a JSON file and/or the environment.

    The environment pair is the quick way for one key; the file is for several. The file is
    an object of key id to either its secret (``{"ak": "sk"}``, a key that may do
    everything) or an object ``{"secret": ..., "projects": [...], "access": "read"|"write"}``
    (see ``load_key_grants``). Error messages name the file and the key id, never a secret.
    """
    keys: dict[str, str] = {}
    if keys_file is not None:
        for key_id, (secret, _grant) in _read_keys_file(keys_file).items():
            keys[key_id] = secret
    key_id = environ.get(KEYS_ENV_ID, "")
    secret = environ.get(KEYS_ENV_SECRET, "")
    if key_id and secret:
        keys[key_id] = secret
    elif key_id or secret:
        raise ParameterInvalid(f"set both {KEYS_ENV_ID} and {KEYS_ENV_SECRET}, or neither")
    return keys


def load_key_grants(keys_file: Path | None) -> dict[str, KeyGrant]:
    """The grants of the keys file's keys that are limited (to some projects, or to read);
    keys given by their secret alone, and the environment's key, are not limited."""
    if keys_file is None:
        return {}
    return {
        key_id: grant
        for key_id, (_secret, grant) in _read_keys_file(keys_file).items()
        if grant is not None
    }


def _read_keys_file(keys_file: Path) -> dict[str, tuple[str, KeyGrant | None]]:
    try:
        loaded = json.loads(keys_file.read_text())
    except (OSError, ValueError) as exc:
        # the parser's message gives a position, never the file's text
        raise ParameterInvalid(f"cannot read keys file {keys_file}: {exc}") from exc
    return parse_keys_document(loaded, f"keys file {keys_file}")


def parse_keys_document(loaded: object, where: str) -> dict[str, tuple[str, KeyGrant | None]]:
    """The keys of a keys document (the JSON of a keys file, or of a cluster's keys in
    etcd): key id -> (secret, grant or None). ``where`` names it in error messages."""
    if not isinstance(loaded, dict):
        raise ParameterInvalid(f"{where} must be a JSON object of key id: secret")
    entries: dict[str, tuple[str, KeyGrant | None]] = {}
    for key_id, entry in loaded.items():
        if not key_id:
            raise ParameterInvalid(f"{where}: a key id is empty")
        if isinstance(entry, str) and entry:
            entries[key_id] = (entry, None)
        elif isinstance(entry, dict):
            entries[key_id] = _read_key_entry(where, key_id, entry)
        else:
            raise ParameterInvalid(
                f"{where}: key {key_id!r} must map to a non-empty secret or to"
                ' {"secret", "projects", "access"}'
            )
    return entries


def split_keys(
    entries: Mapping[str, tuple[str, KeyGrant | None]],
) -> tuple[dict[str, str], dict[str, KeyGrant]]:
    """``parse_keys_document``'s entries as the two mappings a server takes: key id ->
    secret, and key id -> grant for the keys that are limited."""
    keys = {key_id: secret for key_id, (secret, _grant) in entries.items()}
    grants = {key_id: grant for key_id, (_secret, grant) in entries.items() if grant is not None}
    return keys, grants


def keys_document(
    keys: Mapping[str, str], grants: Mapping[str, KeyGrant]
) -> dict[str, str | dict[str, object]]:
    """The keys document of ``keys`` and their ``grants`` (``parse_keys_document``'s
    inverse): what a cluster node offers etcd as the cluster's keys."""
    document: dict[str, str | dict[str, object]] = {}
    for key_id, secret in sorted(keys.items()):
        grant = grants.get(key_id)
        if grant is None:
            document[key_id] = secret
        else:
            document[key_id] = {
                "secret": secret, "projects": sorted(grant.projects), "access": grant.access
            }  # fmt: skip
    return document


class KeyRing(Mapping[str, _V]):
    """A mapping whose content is replaced whole while the server runs: the access keys
    (and grants) of a cluster node, which follow the cluster's keys in etcd. Readers see
    the old content or the new one, never a mix (one attribute swap)."""

    def __init__(self, content: Mapping[str, _V]) -> None:
        self._content = dict(content)

    def replace(self, content: Mapping[str, _V]) -> None:
        self._content = dict(content)

    def __getitem__(self, key: str) -> _V:
        return self._content[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._content)

    def __len__(self) -> int:
        return len(self._content)


def _read_key_entry(document: str, key_id: str, entry: dict[str, object]) -> tuple[str, KeyGrant]:
    where = f"{document}: key {key_id!r}"
    unknown = set(entry) - {"secret", "projects", "access"}
    if unknown:
        raise ParameterInvalid(f"{where} has unknown fields {sorted(unknown)}")
    secret = entry.get("secret")
    projects = entry.get("projects", ["*"])
    access = entry.get("access", "write")
    if not isinstance(secret, str) or not secret:
        raise ParameterInvalid(f"{where} needs a non-empty secret")
    if not isinstance(projects, list) or not all(isinstance(p, str) and p for p in projects):
        raise ParameterInvalid(f'{where}: projects must be a list of names (or "*")')
    if access not in ("read", "write"):
        raise ParameterInvalid(f'{where}: access must be "read" or "write"')
    # project names are lowercase (validate_project_name), as Host routing reads them
    names = frozenset(p.lower() for p in projects)
    return secret, KeyGrant(names, "read" if access == "read" else "write")


def load_config_file(path: Path) -> dict[str, object]:
    """The settings in a `loghub serve --config` file: TOML (``.toml``) or JSON, one flat
    table whose keys are the flags' names (``port = 8080``, ``idle-timeout-s = 30``).

    Flat, so that a file and a command line read the same; names are returned with
    underscores. The caller checks the names and types against the flags it has.
    """
    try:
        text = path.read_text()
        loaded = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as exc:  # TOMLDecodeError is a ValueError
        raise ParameterInvalid(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ParameterInvalid(f"config file {path} must hold one table of settings")
    return {str(key).replace("-", "_"): value for key, value in loaded.items()}
