"""The LogHub server: the REST API over storage and metadata (``loghub serve``)."""

from loghub.server.app import LogHubApp, build_app
from loghub.server.config import KeyGrant, Limits, ServerConfig, load_key_grants, load_keys
from loghub.server.main import serve
from loghub.server.service import LogHubService

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
