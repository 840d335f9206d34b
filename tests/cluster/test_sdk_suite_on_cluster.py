"""The official SDK's compatibility suite (tests/integration/test_sdk_compat.py), unchanged,
against one node of a 3-node cluster: the logstore's shards are spread over the nodes, so
the node the SDK talks to forwards most requests to the others, signatures included."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from cluster_nodes import running_cluster  # noqa: E402
from server_process import ServerProcess  # noqa: E402
from test_sdk_compat import *  # noqa: E402, F403 (the suite's tests and its client fixture)

KEYS = {"ak": "sk"}


@pytest.fixture(scope="module")
def signed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_cluster(tmp_path_factory.mktemp("sdk-cluster"), 3, KEYS) as cluster:
        cluster.wait_placed()
        yield cluster.nodes[1]


@pytest.fixture(scope="module")
def sdk_proxy_env(signed_server: ServerProcess) -> Iterator[None]:
    """As tests/integration/conftest.py: `<project>.127.0.0.1:PORT` through HTTP_PROXY."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HTTP_PROXY", "http_proxy"):
            patch.setenv(name, f"http://{signed_server.endpoint}")
        for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                     "all_proxy"):  # fmt: skip
            patch.delenv(name, raising=False)
        yield
