"""The metadata stores the metadata tests run against: SQLite, PostgreSQL, and etcd.

``metadata_backend`` runs a test on SQLite and on etcd; ``any_metadata_backend`` on
PostgreSQL as well. One real single-member etcd is started per test module, and only when a
test of that module asks for the etcd store; every test gets its own key prefix, so none sees
another's records.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from etcd import running_etcd
from metadata_backends import MetadataBackend


@pytest.fixture(scope="module")
def etcd_url() -> Iterator[str]:
    with running_etcd(1) as cluster:
        yield cluster.url


def _backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MetadataBackend]:
    server_url = ""
    if request.param == "postgres":
        server_url = request.getfixturevalue("postgres_url")
    elif request.param == "etcd":
        server_url = request.getfixturevalue("etcd_url")
    backend = MetadataBackend(request.param, tmp_path_factory, server_url)
    yield backend
    backend.close_all()


@pytest.fixture(params=["sqlite", "etcd"])
def metadata_backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MetadataBackend]:
    yield from _backend(request, tmp_path_factory)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "etcd"])
def any_metadata_backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MetadataBackend]:
    yield from _backend(request, tmp_path_factory)
