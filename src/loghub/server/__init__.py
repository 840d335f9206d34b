"""The LogHub server: the REST API over storage and metadata (``loghub serve``).

The application and the service are imported on first use: the command line reads the
server's configuration types for every ``loghub`` command, and should not pay the import of
the whole server (storage, metadata, the ASGI stack) to print a table or produce a line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loghub._lazy import imported_on_use
from loghub.server.config import KeyGrant, Limits, ServerConfig, load_key_grants, load_keys

if TYPE_CHECKING:
    from loghub.server.app import LogHubApp, build_app
    from loghub.server.main import serve
    from loghub.server.service import LogHubService

_IMPORTED_ON_USE = {
    "LogHubApp": "loghub.server.app",
    "build_app": "loghub.server.app",
    "serve": "loghub.server.main",
    "LogHubService": "loghub.server.service",
}

__getattr__ = imported_on_use(__name__, _IMPORTED_ON_USE)


__all__ = [
    "KeyGrant",
    "Limits",
    "LogHubApp",
    "LogHubService",
    "ServerConfig",
    "build_app",
    "load_key_grants",
    "load_keys",
    "serve",
]
