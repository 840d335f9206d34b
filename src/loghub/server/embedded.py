"""A server in a background thread of the current process, for demos and tests.

`loghub serve` is the way to run LogHub; this is the same application on a uvicorn server
whose loop runs in a thread, started on a free loopback port and stopped on exit.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

from loghub._httpx import httpx
from loghub.server.app import build_app
from loghub.server.config import ServerConfig
from loghub.server.main import uvicorn_server

__all__ = ["EmbeddedServer", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EmbeddedServer:
    def __init__(self, config: ServerConfig, start_timeout_s: float = 30.0) -> None:
        if config.port == 0:
            config = ServerConfig(**{**config.__dict__, "port": free_port(config.host)})
        self.config = config
        self.app = build_app(config)
        self._server = uvicorn_server(self.app, config)
        self._thread = threading.Thread(target=self._server.run, name="loghub-server", daemon=True)
        self._start_timeout_s = start_timeout_s

    @property
    def endpoint(self) -> str:
        """``host:port``, or ``https://host:port`` when the server speaks TLS."""
        address = f"{self.config.host}:{self.config.port}"
        return f"https://{address}" if self.config.tls_enabled else address

    def start(self) -> EmbeddedServer:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while time.monotonic() < deadline:
            try:
                # never through a proxy from the environment: this server is local. Over TLS
                # the probe does not check the certificate: it only asks whether this
                # process's own loopback port answers, and sends nothing secret.
                url = self.endpoint if "://" in self.endpoint else f"http://{self.endpoint}"
                with httpx.Client(trust_env=False, timeout=1, verify=False) as http:
                    if http.get(f"{url}/health").status_code == 200:
                        return self
            except httpx.HTTPError:
                pass
            if not self._thread.is_alive():
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the embedded server did not start on {self.endpoint}")

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
