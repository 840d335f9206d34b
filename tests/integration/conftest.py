"""Integration fixtures: a real `loghub serve` process, and the official SDK pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_process import ServerProcess

KEYS = {"ak": "sk"}


@pytest.fixture(scope="module")
def signed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that demands signed requests (key id `ak`, secret `sk`)."""
    server = ServerProcess(tmp_path_factory.mktemp("server") / "data", keys=KEYS).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sdk_proxy_env(signed_server: ServerProcess) -> Iterator[None]:
    """Routes the SDK's `<project>.127.0.0.1:PORT` requests to the server through HTTP_PROXY
    (the server accepts absolute-form request targets), with no inherited proxy settings."""
    with pytest.MonkeyPatch.context() as patch:
        proxy = f"http://{signed_server.endpoint}"
        for name in ("HTTP_PROXY", "http_proxy"):
            patch.setenv(name, proxy)
        for name in (
            "NO_PROXY",
            "no_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ):
            patch.delenv(name, raising=False)
        yield
