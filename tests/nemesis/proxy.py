"""Userspace TCP proxies whose forwarding can be cut, one way or both: network partitions
without root (no iptables, no namespaces) on loopback.

    python tests/nemesis/proxy.py '{"n0": 40123, "n0-e0": 2379, "n1": null, ...}'

starts one listener per name on a free loopback port, forwarding to the given upstream port
(``null``: set later), prints ``{"name": listen_port, ...}`` on one line, then obeys one JSON
command per line on stdin and answers ``ok`` to each:

    {"cmd": "upstream", "name": "n1", "port": 40125}
    {"cmd": "cut", "names": ["n0-e0"], "direction": "both" | "up" | "down"}
    {"cmd": "heal"}                       (every name)   {"cmd": "heal", "names": [...]}

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
import sys
from dataclasses import dataclass, field

CHUNK_BYTES = 65536


@dataclass
class Route:
    name: str
    upstream_port: int | None
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


async def _pump(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, open_: asyncio.Event
) -> None:
    try:
        while True:
            await open_.wait()
            data = await source.read(CHUNK_BYTES)
            if not data:
                return
            await open_.wait()  # cut after the read: the bytes wait for the heal
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        return


async def _serve(route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    upstream_writer = None
    try:
        await route.up_open.wait()
        await route.down_open.wait()
        if route.upstream_port is None:
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", route.upstream_port
            )
        except OSError:
            return  # upstream down: the client sees the connection closed
        up = asyncio.ensure_future(_pump(reader, upstream_writer, route.up_open))
        down = asyncio.ensure_future(_pump(upstream_reader, writer, route.down_open))
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
        ports[name] = server.sockets[0].getsockname()[1]
    print(json.dumps(ports), flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := await stdin.readline():
        command = json.loads(line)
        names = command.get("names") or list(routes)
        if command["cmd"] == "upstream":
            routes[command["name"]].upstream_port = command["port"]
        elif command["cmd"] == "cut":
            for name in names:
                routes[name].cut(command["direction"])
        elif command["cmd"] == "heal":
            for name in names:
                routes[name].heal()
        else:
            raise ValueError(f"unknown command {command!r}")
        print("ok", flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
