"""Running the server: `loghub serve` ends up here.

Without access keys the server answers anyone, so it refuses to listen on anything but a
loopback address; with keys every request must be signed (v1 or v4) with a fresh date.
"""

from __future__ import annotations

import logging

import uvicorn

from loghub.errors import ParameterInvalid
from loghub.server.app import build_app
from loghub.server.config import ServerConfig, is_loopback_host

__all__ = ["check_bind", "serve"]

log = logging.getLogger("loghub.server")


def check_bind(config: ServerConfig) -> None:
    if not config.auth_enabled and not is_loopback_host(config.host):
        raise ParameterInvalid(
            f"refusing to listen on {config.host} without access keys: set "
            "LOGHUB_ACCESS_KEY_ID and LOGHUB_ACCESS_KEY_SECRET (or --keys-file), "
            "or listen on a loopback address"
        )


def serve(config: ServerConfig) -> None:
    """Runs until SIGINT or SIGTERM; then stops accepting, finishes requests and closes."""
    check_bind(config)
    app = build_app(config)
    log.info(
        "LogHub serving %s on http://%s:%d (auth %s, fsync %s)",
        config.data_dir,
        config.host,
        config.port,
        "on" if config.auth_enabled else "off",
        config.fsync_policy,
    )
    uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            loop="uvloop",
            http="httptools",
            lifespan="on",
            access_log=False,
            log_level="warning",
            timeout_keep_alive=120,
            h11_max_incomplete_event_size=1024 * 1024,
        )
    ).run()
