"""Userspace TCP proxies whose forwarding can be cut, one way or both: network partitions
without root (no iptables, no namespaces) on loopback.

    python tests/nemesis/proxy.py '{"n0": 40123, "n0-e0": 2379, "n1": null, ...}'

starts one listener per name on a free loopback port, forwarding to the given upstream port
(``null``: set later), prints ``{"name": listen_port, ...}`` on one line, then obeys one JSON
command per line on stdin and answers ``ok`` to each:

    {"cmd": "upstream", "name": "n1", "port": 40125, "pid": 4242}
    {"cmd": "cut", "names": ["n0-e0"], "direction": "both" | "up" | "down"}
    {"cmd": "cut", "names": ["n0"], "direction": "both", "sources": ["n1", "n2"]}
    {"cmd": "heal"}                       (every name)   {"cmd": "heal", "names": [...]}

Sources: an ``upstream`` with a ``pid`` names that process as the source ``name`` (a node
and the name of its own proxy). Each accepted connection is tagged with the source whose
process holds its client end (found in /proc/net/tcp and /proc/<pid>/fd, loopback IPv4,
Linux), or with none (a client of the harness). A cut with ``sources`` holds only the
connections of those sources on those names: node 1 cut from node 0 while clients (and node
2) still reach node 0 through the same proxy. ``heal`` lifts both kinds.

A cut *holds* bytes rather than dropping them, as an iptables DROP does to TCP: the sender's
kernel keeps them and they arrive after the heal, unless the sender gave up first (its
timeout, gRPC's keepalive). ``up`` holds what the connecting side sends (requests), ``down``
what the upstream answers. A connection opened during any cut is accepted but reaches the
upstream only once both directions are open again (a SYN or its SYN-ACK would have been
dropped), so the connecting side sees no answer, not a refusal.

A separate process, so that the harness's own work (clients, the checker) never delays the
nodes' lease refreshes to etcd. The harness stops it by PID.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from dataclasses import dataclass, field

CHUNK_BYTES = 65536


@dataclass
class Gate:
    """Whether bytes may pass each way."""

    up_open: asyncio.Event = field(default_factory=asyncio.Event)
    down_open: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.up_open.set()
        self.down_open.set()

    def cut(self, direction: str) -> None:
        assert direction in ("both", "up", "down"), direction
        if direction in ("both", "up"):
            self.up_open.clear()
        if direction in ("both", "down"):
            self.down_open.clear()

    def heal(self) -> None:
        self.up_open.set()
        self.down_open.set()


@dataclass
class Route:
    name: str
    upstream_port: int | None
    listen_port: int = 0
    gate: Gate = field(default_factory=Gate)  # every connection
    by_source: dict[str, Gate] = field(default_factory=dict)  # one source's connections

    def source_gate(self, source: str | None) -> Gate | None:
        if source is None:
            return None
        return self.by_source.setdefault(source, Gate())

    def cut(self, direction: str, sources: list[str] | None = None) -> None:
        if sources:
            for source in sources:
                self.by_source.setdefault(source, Gate()).cut(direction)
        else:
            self.gate.cut(direction)

    def heal(self) -> None:
        self.gate.heal()
        for gate in self.by_source.values():
            gate.heal()


SOURCES: dict[int, str] = {}  # pid -> source name


def _hex_endpoint(port: int) -> str:
    return f"0100007F:{port:04X}"  # 127.0.0.1 as /proc/net/tcp writes it


def source_of(client_port: int, listen_port: int) -> str | None:
    """The registered source whose process holds the client end of a loopback connection
    from ``client_port`` to ``listen_port``; None when none does (or it cannot be told)."""
    if not SOURCES:
        return None
    local, remote = _hex_endpoint(client_port), _hex_endpoint(listen_port)
    inode = None
    try:
        with open("/proc/net/tcp") as table:
            for line in table:
                fields = line.split()
                if len(fields) > 9 and fields[1] == local and fields[2] == remote:
                    inode = fields[9]
                    break
    except OSError:
        return None
    if inode is None or inode == "0":
        return None
    wanted = f"socket:[{inode}]"
    for pid, name in list(SOURCES.items()):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == wanted:
                        return name
                except OSError:
                    continue
        except OSError:
            continue
    return None


async def _wait_all(events: list[asyncio.Event]) -> None:
    while not all(event.is_set() for event in events):
        for event in events:
            await event.wait()


async def _pump(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, open_: list[asyncio.Event]
) -> None:
    try:
        while True:
            await _wait_all(open_)
            data = await source.read(CHUNK_BYTES)
            if not data:
                return
            await _wait_all(open_)  # cut after the read: the bytes wait for the heal
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        return


async def _serve(route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    upstream_writer = None
    try:
        peer = writer.get_extra_info("peername")
        gates = [route.gate]
        source_gate = route.source_gate(source_of(peer[1], route.listen_port) if peer else None)
        if source_gate is not None:
            gates.append(source_gate)
        up_open = [g.up_open for g in gates]
        down_open = [g.down_open for g in gates]
        await _wait_all(up_open + down_open)
        if route.upstream_port is None:
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", route.upstream_port
            )
        except OSError:
            return  # upstream down: the client sees the connection closed
        up = asyncio.ensure_future(_pump(reader, upstream_writer, up_open))
        down = asyncio.ensure_future(_pump(upstream_reader, writer, down_open))
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        up.cancel()
        down.cancel()
    finally:
        for w in (writer, upstream_writer):
            if w is not None:
                w.close()


async def main(upstreams: dict[str, int | None]) -> None:
    routes = {name: Route(name, port) for name, port in upstreams.items()}
    ports = {}
    servers = []
    for name, route in routes.items():
        server = await asyncio.start_server(functools.partial(_serve, route), "127.0.0.1", 0)
        servers.append(server)
        ports[name] = route.listen_port = server.sockets[0].getsockname()[1]
    print(json.dumps(ports), flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := await stdin.readline():
        command = json.loads(line)
        names = command.get("names") or list(routes)
        if command["cmd"] == "upstream":
            routes[command["name"]].upstream_port = command["port"]
            if command.get("pid"):
                for pid in [p for p, n in SOURCES.items() if n == command["name"]]:
                    del SOURCES[pid]  # the node's previous process
                SOURCES[command["pid"]] = command["name"]
        elif command["cmd"] == "cut":
            for name in names:
                routes[name].cut(command["direction"], command.get("sources"))
        elif command["cmd"] == "heal":
            for name in names:
                routes[name].heal()
        else:
            raise ValueError(f"unknown command {command!r}")
        print("ok", flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
