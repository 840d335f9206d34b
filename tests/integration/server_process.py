"""`loghub serve` as a real child process on a free loopback port, for integration tests.

The test keeps the child's PID and stops exactly that process: SIGTERM for a clean stop,
SIGKILL for a crash.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PortTaken(Exception):
    """Another process answers on the port this server was to use."""


class ServerProcess:
    def __init__(
        self,
        data_dir: Path,
        keys: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
        port: int | None = None,
        ca_cert: Path | None = None,
        host: str = "127.0.0.1",
        command_prefix: tuple[str, ...] = (),
    ) -> None:
        """``ca_cert``: the server speaks https (its --tls-* flags are in ``extra_args``);
        the health check trusts this CA. ``host``: the address it listens on and is reached
        at. ``command_prefix``: a command that execs the server (``ip netns exec NS``, which
        keeps the PID: the health check's PID must be the child's)."""
        self.data_dir = data_dir
        self.host = host
        self.command_prefix = command_prefix
        self.ca_cert = ca_cert
        self.keys = keys or {}
        self.extra_args = extra_args
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-server.log"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 60.0) -> ServerProcess:
        """Starts the server and waits until it answers; if another process grabbed the free
        port first (other tests run on this machine too), tries again on a new port."""
        for _attempt in range(3):
            try:
                return self._start_once(timeout_s)
            except PortTaken:
                self.port = free_port()
        raise RuntimeError("no free port stayed free long enough to start a server")

    def _start_once(self, timeout_s: float) -> ServerProcess:
        args = [
            *self.command_prefix,
            sys.executable,
            "-m",
            "loghub",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.extra_args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHUB_")}
        if self.keys:
            keys_file = self.data_dir.parent / f"{self.data_dir.name}-keys.json"
            keys_file.write_text(json.dumps(self.keys))
            args += ["--keys-file", str(keys_file)]
        log_file = open(self.log_path, "ab")  # noqa: SIM115 (the child owns it)
        self.proc = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        log_file.close()
        scheme = "http" if self.ca_cert is None else "https"
        verify: ssl.SSLContext | bool = (
            True if self.ca_cert is None else ssl.create_default_context(cafile=self.ca_cert)
        )
        deadline = time.monotonic() + timeout_s
        # one client for every try: never through a proxy from the environment (the SDK
        # tests set HTTP_PROXY)
        with httpx.Client(trust_env=False, timeout=1, verify=verify) as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    if "address already in use" in self.log():
                        raise PortTaken(self.port)
                    raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
                try:
                    reply = http.get(f"{scheme}://{self.endpoint}/health")
                except httpx.HTTPError:
                    time.sleep(0.01)
                    continue
                # the pid tells our server from another process that took the same port
                if reply.status_code == 200 and reply.json().get("pid") == self.proc.pid:
                    return self
                if reply.status_code == 200:
                    self.kill()
                    raise PortTaken(self.port)
                time.sleep(0.01)
        self.kill()
        raise RuntimeError(f"server did not become healthy: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)
