"""The access keys of a cluster, kept in etcd so that every node accepts the same ones.

One key, ``/loghub/keys``, holds a keys document: the JSON of a keys file
(``{"id": "secret"}`` or ``{"id": {"secret", "projects", "access"}}``; see
``loghub.server.config``). The first node that starts with keys (``--keys-file`` or the
environment) while etcd has none offers its own, by a create-if-absent transaction; from
then on etcd's document is the cluster's, whatever a node's own file says (a node whose file
differs logs a warning and uses etcd's). ``loghub cluster keys --keys-file F`` replaces the
document, and every node follows it within its watch's delay: this is how keys are added,
rotated and revoked in a cluster, without a restart.

The secrets are stored in etcd as they are in a keys file: protect etcd as you protect that
file (client TLS and etcd's own authentication are set on etcd's side).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from loghub.cluster.etcd_store import Compare, EtcdStore, Put, end_if_cancelled
from loghub.errors import ControlPlaneError, ParameterInvalid

__all__ = ["KEYS_KEY", "resolve_keys", "set_keys", "watch_keys"]

log = logging.getLogger("loghub.cluster")

KEYS_KEY = "/loghub/keys"


async def resolve_keys(store: EtcdStore, offered: dict[str, Any] | None) -> dict[str, Any]:
    """The cluster's keys document; ``offered`` (this node's own keys, if any) becomes it
    when etcd has none yet. An empty document means no keys: the cluster is open, as a
    server without keys is."""
    for _ in range(3):
        entry = await store.get(KEYS_KEY)
        if entry is not None:
            document = json.loads(entry.value)
            if offered is not None and offered != document:
                log.warning(
                    "this node's access keys differ from the cluster's (etcd %s); the"
                    " cluster's are used (`loghub cluster keys` changes them)",
                    KEYS_KEY,
                )
            return dict(document)
        if not offered:
            return {}
        done = await store.transact(
            [Compare(KEYS_KEY, "create", "==", 0)], [Put(KEYS_KEY, _encode(offered))]
        )
        if done:
            log.info("this node's access keys are now the cluster's (etcd %s)", KEYS_KEY)
            return offered
    raise ControlPlaneError(f"could not read or set the cluster's keys at {KEYS_KEY}")


async def watch_keys(store: EtcdStore, apply: Callable[[dict[str, Any]], None]) -> None:
    """Calls ``apply`` with the cluster's keys document each time it changes (and once
    after every broken watch, with what etcd holds then), until cancelled. A document that
    cannot be used is logged and skipped: the keys in force stay."""
    while True:
        try:
            entries, revision = await store.read_prefix(KEYS_KEY)
            for entry in entries:
                if entry.key == KEYS_KEY:
                    _apply(apply, entry.value)
            async for _kind, _key, event in store.watch_prefix(KEYS_KEY, revision + 1):
                if event.key == KEYS_KEY and event.value:
                    _apply(apply, event.value)
        except ControlPlaneError as exc:
            end_if_cancelled()
            log.warning("the watch of the cluster's keys broke (%s); reading again", exc)
        await asyncio.sleep(0.5)


def _apply(apply: Callable[[dict[str, Any]], None], value: bytes) -> None:
    try:
        apply(json.loads(value))
    except (ValueError, LookupError, TypeError) as exc:
        log.error("the cluster's keys (etcd %s) cannot be used: %s", KEYS_KEY, exc)


async def set_keys(url: str, document: dict[str, Any]) -> None:
    """Replaces the cluster's keys document (``loghub cluster keys``). An empty one is
    refused: it would open every node to anyone (nodes also ignore one)."""
    if not document:
        raise ParameterInvalid("the cluster's keys cannot be empty (that would turn auth off)")
    async with EtcdStore(url) as store:
        await store.put(KEYS_KEY, _encode(document))


def _encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True).encode()
