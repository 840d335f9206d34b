"""The systems LogHub is measured beside, started and stopped by the benchmark itself.

Redis (Debian's ``redis-server``) runs on a loopback port with its data in a temp directory,
either in memory (no persistence) or with ``appendfsync always`` (an fsync before every
reply: the durability LogHub gives an acknowledged write). The benchmark keeps the PID it
started and stops exactly that process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from _common import free_port


def redis_server_binary() -> str:
    path = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.access(path, os.X_OK):
        raise RuntimeError("redis-server is missing: `make system-deps` installs it")
    return path


class RedisServer:
    """``redis-server`` on 127.0.0.1; ``durable=True`` is AOF with ``appendfsync always``."""

    def __init__(self, durable: bool, data_parent: str | None = None) -> None:
        self.durable = durable
        self.port = free_port()
        self.data_dir = Path(tempfile.mkdtemp(prefix="loghub-bench-redis-", dir=data_parent))
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 20.0) -> RedisServer:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.durable
            else ["--appendonly", "no"]
        )
        args = [
            redis_server_binary(), "--bind", "127.0.0.1", "--port", str(self.port),
            "--dir", str(self.data_dir), "--save", "", "--daemonize", "no",
            "--protected-mode", "yes", "--loglevel", "warning", *persistence,
        ]  # fmt: skip
        log_file = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 (closed in stop)
        self._log_file = log_file
        self.proc = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock,
            ):
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer in {timeout_s} s")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)
        with contextlib.suppress(AttributeError, OSError):
            self._log_file.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)
