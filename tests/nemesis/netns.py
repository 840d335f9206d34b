"""Network namespaces for the nemesis's nodes, and partitions as nft rules in them (root only).

Each node of a run lives in a network namespace of its own, joined to the root namespace by
a veth pair whose host end is a port of a bridge the run creates:

    root namespace:  bridge lhn<pid>b  10.231.X.1/24   etcd members, clients, the checker
                       ├─ lhn<pid>h0 ══ lhn<pid>p0  10.231.X.10   namespace lhn<pid>n0: node 0
                       ├─ lhn<pid>h1 ══ lhn<pid>p1  10.231.X.11   namespace lhn<pid>n1: node 1
                       └─ ...

All of it is on one /24, so the root namespace reaches the nodes, and the nodes reach it and
each other, over the bridge alone: no forwarding, no route and no sysctl of the machine
changes. X is the first value from the runner's PID on whose /24 the root namespace has no
address and no route (chosen under a lock file, so that runs started together differ).

A fault is a set of rules in one node's namespace, in a table the run made there (``inet
loghub_nemesis``, chains ``input`` and ``output`` that accept by default); healing flushes
the chains. Rules drop packets, as Jepsen's iptables rules do: TCP retransmits what was
sent during the cut and it arrives after the heal, unless the sender gave up first; a
connection attempted during the cut gets no answer, not a refusal. The rules sit in the
node's namespace, never in the root one, so a cut touches that node's traffic and nothing
else of the machine's.

Names carry the runner's PID (``lhn<pid>`` and a letter: at most 15 characters, the limit
of an interface's name), so a run can tell its own interfaces and namespaces, and those of a
runner that died, from anything else on the machine: ``remove_leftovers`` deletes only names
of that pattern whose PID is no longer alive, and ``Namespaces.remove`` deletes what its own
run made, at the end of the run however it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Namespaces",
    "NetnsError",
    "namespaces",
    "remove_leftovers",
    "resolve_network",
    "unusable",
]

PREFIX = "lhn"
# every name a run makes: lhn<pid>, a letter (b bridge, h/p veth ends, n namespace; t, u, v, w
# the probe's namespace, bridge and veth ends), then a node's index or nothing
OURS = re.compile(rf"^{PREFIX}(\d+)[a-z]\d*$")
TABLE = "loghub_nemesis"
SUBNETS = "10.231.{}.0/24"
NODE_HOST_BASE = 10  # node i is .(10 + i); the bridge is .1
LOCK = Path(tempfile.gettempdir()) / "loghub-nemesis-netns.lock"
NETWORKS = ("auto", "netns", "proxy")


class NetnsError(RuntimeError):
    pass


def _run(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(list(args), input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _our_links() -> list[str]:
    """The interfaces of the root namespace whose names follow this module's pattern."""
    links = json.loads(_run("ip", "-j", "link", "show") or "[]")
    return [link["ifname"] for link in links if OURS.match(link.get("ifname", ""))]


def _our_namespaces() -> list[str]:
    names = [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line]
    return [name for name in names if OURS.match(name)]


def remove_leftovers() -> list[str]:
    """Deletes the namespaces and interfaces of earlier runs whose runner is dead (names of
    this module's pattern only; a live runner's are its own business); returns them."""
    removed = []
    for name in _our_links():  # the veths first: deleting one end deletes its pair
        match = OURS.match(name)
        if match and not _pid_alive(int(match[1])) and name[len(PREFIX + match[1])] == "h":
            with contextlib.suppress(NetnsError):
                _run("ip", "link", "del", name)
                removed.append(name)
    for name in _our_namespaces():
        match = OURS.match(name)
        if match and not _pid_alive(int(match[1])):
            with contextlib.suppress(NetnsError):
                _run("ip", "netns", "del", name)
                removed.append(name)
    for name in _our_links():  # bridges, and any veth left
        match = OURS.match(name)
        if match and not _pid_alive(int(match[1])):
            with contextlib.suppress(NetnsError):
                _run("ip", "link", "del", name)
                removed.append(name)
    return removed


def unusable() -> str | None:
    """Why the netns backend cannot run here, or None when it can: it needs root, ``ip``
    and ``nft``, and the kernel's namespaces, veth pairs, bridges and nftables, which only
    trying tells (a container may lack any of them): a throwaway namespace gets a veth pair,
    a bridge and a table, and all three are deleted again."""
    if os.geteuid() != 0:
        return "not root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"no {tool} command"
    ns, bridge, host, peer = (f"{PREFIX}{os.getpid()}{letter}" for letter in "tuvw")
    try:
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", bridge, "type", "bridge")
        _run("ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns)
        _run("ip", "netns", "exec", ns, "nft", "add", "table", "inet", TABLE)
    except NetnsError as exc:
        return str(exc)
    finally:
        for kind, name in (("link", host), ("link", bridge), ("netns", ns)):
            with contextlib.suppress(NetnsError):
                _run("ip", kind, "del", name)
    return None


def resolve_network(choice: str) -> tuple[str, str]:
    """The backend a run uses for ``--network choice``, and why: ``auto`` is netns when it
    can run, else proxy; ``netns`` that cannot run is an error, not a quiet fallback."""
    assert choice in NETWORKS, choice
    if choice == "proxy":
        return "proxy", "asked"
    reason = unusable()
    if choice == "netns":
        if reason is not None:
            raise NetnsError(f"--network netns cannot run here: {reason}")
        return "netns", "asked"
    if reason is None:
        return "netns", "auto: root, and namespaces and nft work"
    return "proxy", f"auto: no network namespaces ({reason})"


def _subnet() -> ipaddress.IPv4Network:
    """A 10.231.X.0/24 the root namespace has no address and no route in (besides the
    default), starting at X = PID mod 256. Call with the lock held."""
    taken = []
    for entry in json.loads(_run("ip", "-j", "-4", "addr", "show") or "[]"):
        for info in entry.get("addr_info", []):
            taken.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", False))
    for route in json.loads(_run("ip", "-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = route.get("dst", "default")
        if dst != "default":
            taken.append(ipaddress.ip_network(dst, strict=False))
    for step in range(256):
        subnet = ipaddress.IPv4Network(SUBNETS.format((os.getpid() + step) % 256))
        if not any(subnet.overlaps(other) for other in taken):
            return subnet
    raise NetnsError("every 10.231.X.0/24 is in use on this machine")


@dataclass
class Namespaces:
    """One run's bridge, namespaces and veth pairs, and the faults as rules in them."""

    count: int
    pid: int = field(default_factory=os.getpid)
    subnet: ipaddress.IPv4Network | None = None
    made: list[tuple[str, str]] = field(default_factory=list)  # ("link"|"netns", name)

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.pid}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}b"

    @property
    def bridge_address(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    def namespace(self, index: int) -> str:
        return f"{self.prefix}n{index}"

    def address(self, index: int) -> str:
        """Node ``index``'s address, in its namespace."""
        assert self.subnet is not None
        return str(self.subnet.network_address + NODE_HOST_BASE + index)

    def exec_prefix(self, index: int) -> tuple[str, ...]:
        """Runs a command in node ``index``'s namespace; ``ip netns exec`` execs it (after
        setns), so the command keeps the PID it was started with: the harness signals the
        server by that PID."""
        return ("ip", "netns", "exec", self.namespace(index))

    def create(self) -> None:
        """The bridge with its address, then per node a namespace (loopback up, the table
        and its chains) and a veth pair into it, with the node's address."""
        with open(LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two runs starting together pick two subnets
            self.subnet = _subnet()
            self._add("link", self.bridge, "ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for index in range(self.count):
            ns = self.namespace(index)
            host, peer = f"{self.prefix}h{index}", f"{self.prefix}p{index}"
            self._add("netns", ns, "ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            chains = [f"add chain inet {TABLE} {hook} {{ type filter hook {hook} priority 0; }}"
                      for hook in ("input", "output")]  # fmt: skip
            self._nft(index, "\n".join([f"add table inet {TABLE}", *chains, ""]))
            self._add("link", host, "ip", "link", "add", host, "type", "veth", "peer", "name",
                      peer, "netns", ns)  # fmt: skip
            _run("ip", "link", "set", host, "master", self.bridge, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(index)}/24", "dev", peer)
            _run("ip", "-n", ns, "link", "set", peer, "up")

    def _add(self, kind: str, name: str, *command: str) -> None:
        _run(*command)
        self.made.append((kind, name))

    def remove(self) -> None:
        """Deletes what ``create`` made, the veths first (each takes its peer end along),
        then the namespaces, then the bridge; what is already gone is skipped."""
        order = {"link": 0, "netns": 1}
        made = sorted(self.made, key=lambda m: (m[1] == self.bridge, order[m[0]]))
        for kind, name in made:
            with contextlib.suppress(NetnsError):
                _run("ip", kind, "del", name)
        self.made.clear()

    def _nft(self, index: int, script: str) -> None:
        _run(*self.exec_prefix(index), "nft", "-f", "-", stdin=script)

    def _rules(self, index: int, input_: list[str], output: list[str]) -> None:
        script = [f"add rule inet {TABLE} input {rule} drop" for rule in input_]
        script += [f"add rule inet {TABLE} output {rule} drop" for rule in output]
        self._nft(index, "\n".join(script) + "\n")

    def cut_etcd(self, index: int, ports: list[int], direction: str = "both") -> None:
        """Drops node ``index``'s packets to the etcd members' client ports (``up``: its
        requests), theirs to it (``down``: their answers), or both."""
        assert direction in ("both", "up", "down"), direction
        members = f"ip saddr {self.bridge_address} tcp sport {{ {', '.join(map(str, ports))} }}"
        to = f"ip daddr {self.bridge_address} tcp dport {{ {', '.join(map(str, ports))} }}"
        self._rules(index, [members] if direction in ("both", "down") else [],
                    [to] if direction in ("both", "up") else [])  # fmt: skip

    def isolate(self, index: int) -> None:
        """Drops every packet of node ``index`` but its loopback's: etcd, clients, peers."""
        self._rules(index, ['iifname != "lo"'], ['oifname != "lo"'])

    def cut_peers(self, index: int) -> None:
        """Drops packets between node ``index`` and the other nodes' addresses, both ways;
        etcd and clients (the bridge's address) still reach it."""
        peers = ", ".join(self.address(i) for i in range(self.count) if i != index)
        self._rules(index, [f"ip saddr {{ {peers} }}"], [f"ip daddr {{ {peers} }}"])

    def heal(self, index: int | None = None) -> None:
        """Deletes the rules of node ``index``'s namespace (every node's: None)."""
        for i in range(self.count) if index is None else [index]:
            self._nft(i, f"flush chain inet {TABLE} input\nflush chain inet {TABLE} output\n")

    def rules(self, index: int) -> str:
        """The table as nft lists it, for a diagnosis."""
        return _run(*self.exec_prefix(index), "nft", "list", "table", "inet", TABLE)


@contextlib.contextmanager
def namespaces(count: int) -> Iterator[Namespaces]:
    """Leftovers of dead runners removed, then a bridge and ``count`` namespaces made; all
    of them deleted at the end, however the run ends."""
    remove_leftovers()
    made = Namespaces(count)
    try:
        made.create()
        yield made
    finally:
        made.remove()
