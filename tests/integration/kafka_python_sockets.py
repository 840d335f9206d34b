"""kafka-python's leaked sockets, kept to the modules that use it.

kafka-python can drop a connection it retried on a busy machine without closing it (CI saw
its sockets collected inside the client's own selector, and, collected later, inside other
modules' tests, which the strict warning filter then failed for a socket they never had).
A module that runs kafka-python takes ``pytestmark`` (the warning is ignored in its tests;
the module's own sockets are all closed by ``with``) and ``collected_at_module_end`` (what
the client leaked is collected before the next module starts)."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator

import pytest

UNCLOSED_SOCKET = "unclosed <socket.socket"

ignore_unclosed_sockets = pytest.mark.filterwarnings(f"ignore:{UNCLOSED_SOCKET}:ResourceWarning")


@pytest.fixture(scope="module", autouse=True)
def collected_at_module_end() -> Iterator[None]:
    yield
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", UNCLOSED_SOCKET, ResourceWarning)
        gc.collect()
