"""A metadata store's back end for tests: where a fresh store lives, and how to open it.

A test asks for a fresh place (``new_place``: a SQLite file, a PostgreSQL schema, or an etcd
key prefix) and opens a store there as often as it likes (``open``), which is how "still there
after reopening" is tested on each back end. Every store opened is closed by ``close_all``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from postgres import create_schema

from loghub._clock import Clock
from loghub.cluster.etcd_metadata import EtcdMetadataStore
from loghub.metadata import MetadataStore

__all__ = ["MetadataBackend"]


@dataclass
class MetadataBackend:
    kind: str
    tmp_path_factory: pytest.TempPathFactory
    server_url: str = ""  # PostgreSQL's or etcd's
    opened: list[Any] = field(default_factory=list)

    def new_place(self) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{self.tmp_path_factory.mktemp('meta') / 'meta.db'}"
        if self.kind == "postgres":
            return create_schema(self.server_url, f"t_{uuid.uuid4().hex[:16]}")
        return f"/loghub-test/{uuid.uuid4().hex[:12]}/meta/"

    def open(self, place: str, clock: Clock) -> Any:
        """A store on ``place``: a ``MetadataStore``, or an ``EtcdMetadataStore``."""
        store: Any
        if self.kind == "etcd":
            store = EtcdMetadataStore.open(self.server_url, clock, prefix=place)
        else:
            store = MetadataStore.open(place, clock)
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self.opened:
            store.close()
