"""A throwaway etcd cluster for tests: real ``etcd`` members (Debian's ``etcd-server``).

``running_etcd(members=3)`` starts the members on free loopback ports (or on free ports of
``host``, an address of this machine: the nemesis's network namespaces reach etcd on their
bridge's address), each with its own data directory, with pre-vote and short election
timings (heartbeat 50 ms, election 500 ms: the settings measured to fail over in under a
second here), waits until the cluster answers, and yields an ``EtcdCluster``. On exit it
stops every member it started, by PID, and removes the directories. Members can be killed
(SIGKILL), paused (SIGSTOP/SIGCONT) and restarted with their data by the tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["EtcdCluster", "EtcdNotInstalled", "find_etcd", "running_etcd"]


class EtcdNotInstalled(Exception):
    pass


def find_etcd() -> str:
    for path in (shutil.which("etcd"), "/usr/bin/etcd"):
        if path and os.access(path, os.X_OK):
            return path
    raise EtcdNotInstalled("etcd is missing: `make system-deps` installs Debian's etcd-server")


def _free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((host, 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"  # the address both its ports listen on

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"


@dataclass
class EtcdCluster:
    members: list[Member]
    base: Path
    binary: str
    initial_cluster: str
    logs: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``etcd://127.0.0.1:p1,127.0.0.1:p2,...`` as LogHub's --cluster takes it."""
        return "etcd://" + ",".join(f"{m.host}:{m.client_port}" for m in self.members)

    def start(self, member: Member, state: str = "new") -> None:
        log_path = self.base / f"{member.name}.log"
        self.logs.append(log_path)
        args = [
            self.binary, "--name", member.name, "--data-dir", str(member.data_dir),
            "--listen-client-urls", member.client_url,
            "--advertise-client-urls", member.client_url,
            "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", state, "--initial-cluster-token", self.base.name,
            "--pre-vote", "--heartbeat-interval", "50", "--election-timeout", "500",
            "--auto-compaction-retention", "1", "--logger", "zap",
            "--log-outputs", str(log_path),
        ]  # fmt: skip
        # setpriv (util-linux) asks the kernel for SIGKILL when the thread that started the
        # member ends, then execs etcd: a killed test run leaves no member behind. Not
        # preexec_fn: Python code between fork and exec can hang in a process with gRPC's
        # threads (the etcd client's).
        member.proc = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def kill(self, member: Member) -> None:
        assert member.proc is not None
        if member.proc.poll() is None:
            os.kill(member.proc.pid, signal.SIGKILL)
            member.proc.wait(timeout=10)

    def restart(self, member: Member) -> None:
        self.kill(member)
        self.start(member, state="existing")

    def leader(self, timeout_s: float = 10.0) -> Member:
        """The member that is the raft leader now (asked of each member's status)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for member in self.members:
                if member.proc is None or member.proc.poll() is not None:
                    continue
                with contextlib.suppress(OSError, ValueError):
                    status = _post(member, "/v3/maintenance/status", {})
                    if status.get("leader") and status["leader"] == status["header"]["member_id"]:
                        return member
            time.sleep(0.05)
        raise RuntimeError(f"no etcd leader within {timeout_s} s")

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            live = [m for m in self.members if m.proc is not None and m.proc.poll() is None]
            with contextlib.suppress(OSError, ValueError):
                if live and all(_health(m) for m in live):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"etcd did not become healthy in {timeout_s} s: {self.tail()}")

    def tail(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-1500:] for p in self.logs if p.exists())

    def stop(self) -> None:
        for member in self.members:
            if member.proc is not None and member.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member.proc.pid, signal.SIGCONT)
                    os.kill(member.proc.pid, signal.SIGKILL)
                member.proc.wait(timeout=10)


def _post(member: Member, path: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        member.client_url + path, data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=1) as reply:
        parsed: dict[str, object] = json.loads(reply.read())
        return parsed


def _health(member: Member) -> bool:
    with urllib.request.urlopen(member.client_url + "/health", timeout=1) as reply:
        return bool(json.loads(reply.read()).get("health") == "true")


@contextlib.contextmanager
def running_etcd(members: int = 3, host: str = "127.0.0.1") -> Iterator[EtcdCluster]:
    binary = find_etcd()
    base = Path(tempfile.mkdtemp(prefix="loghub-etcd-"))
    ports = _free_ports(2 * members, host)
    cluster_members = [
        Member(f"e{i}", ports[2 * i], ports[2 * i + 1], base / f"e{i}", host=host)
        for i in range(members)
    ]
    initial = ",".join(f"{m.name}={m.peer_url}" for m in cluster_members)
    cluster = EtcdCluster(cluster_members, base, binary, initial)
    try:
        for member in cluster_members:
            cluster.start(member)
        cluster.wait_healthy()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
