"""The testbed's network: a namespace per machine, each with one veth to a bridge, shaped by tc.

::

    ns <tag>-m0  eth0 10.231.0.1/24 ─┐
    ns <tag>-m1  eth0 10.231.0.2/24 ─┼─ p0,p1,... ── br0   (ns <tag>-sw)
    ...                              ─┘

* Isolation: the switch namespace has no address; a machine's namespace has only the connected
  route of the testbed's subnet (no default route, no NAT, no veth to the root namespace), so no
  packet leaves the testbed.  ``check_isolated`` verifies it before any rank starts.
* A machine's link is shaped both ways: ``tbf`` at its uplink rate on its own side of the veth and
  at its downlink rate on the switch's side.  Latency and loss go in front as ``netem`` where the
  kernel has it; where it has not, they are recorded as not applied (``applied``), never silently
  dropped.
* The queue is deep (16 MB): DDS writes a writer's whole history to a reader in a burst, and a drop
  costs a NACK round, which emu does not model.  The token bucket holds two full frames, so that a
  link idle between messages does not send the next message's first 32 kB at line rate.
* Every name starts with the testbed's tag (``dtm<launcher pid>``): ``stale_namespaces`` finds what
  a killed launcher left, by a pid that no longer runs.
"""

from __future__ import annotations

import json
import re
import subprocess

from dtemu.core.runtime.network_spec import LinkSpec

SUBNET = "10.231"
PREFIX = 16
QUEUE = "16mb"
BURST_BYTES = 2 * 1514
TAG = re.compile(r"^dtm(\d+)-")


class NetError(RuntimeError):
    pass


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise NetError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def address(i: int) -> str:
    return f"{SUBNET}.{i // 250}.{i % 250 + 1}"


class MachineNet:
    """The namespaces, veths, bridge and shaping of ``links`` (one per machine)."""

    def __init__(self, tag: str, links: list[LinkSpec], mtu: int = 1500, labels: list[str] | None = None):
        self.tag = tag
        self.labels = labels or [f"m{i}" for i in range(len(links))]
        self.links = list(links)
        self.mtu = mtu
        self.switch = f"{tag}-sw"
        self.names = [f"{tag}-m{i}" for i in range(len(links))]
        self.addresses = [address(i) for i in range(len(links))]
        self.created: list[str] = []
        self.netem = False

    def __enter__(self) -> "MachineNet":
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> "MachineNet":
        self.netem = _has_netem(self.tag)
        self._add_ns(self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, (ns, addr, link) in enumerate(zip(self.names, self.addresses, self.links)):
            self._add_ns(ns)
            port = f"p{i}"
            _run("ip", "-n", self.switch, "link", "add", port, "mtu", str(self.mtu), "type", "veth",
                 "peer", "name", "eth0", "netns", ns)
            _run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
            _run("ip", "-n", self.switch, "link", "set", port, "up")
            _run("ip", "-n", ns, "link", "set", "eth0", "mtu", str(self.mtu))
            _run("ip", "-n", ns, "addr", "add", f"{addr}/{PREFIX}", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            self._shape(ns, "eth0", link.up_mbps, link)        # uplink: machine -> switch
            self._shape(self.switch, port, link.down_mbps, link)  # downlink: switch -> machine
        self.check_isolated()
        return self

    def down(self) -> None:
        for ns in reversed(self.created):
            _run("ip", "netns", "del", ns, check=False)
        self.created = []

    def _add_ns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self.created.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")
        # IPv4 only: no IPv6 link-local chatter on the shaped links.
        _run("ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
             "net.ipv6.conf.default.disable_ipv6=1", check=False)

    def _shape(self, ns: str, dev: str, mbps: float, link: LinkSpec) -> None:
        tbf = ["tbf", "rate", f"{mbps * 1e6:.0f}bit", "burst", str(BURST_BYTES), "limit", QUEUE]
        if self.netem and (link.latency_ms > 0 or link.loss > 0):
            netem = ["netem", "delay", f"{link.latency_ms:g}ms"] + (["loss", f"{link.loss * 100:g}%"] if link.loss else [])
            tc(ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", *netem, "limit", "100000")
            tc(ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)
        else:
            tc(ns, "qdisc", "add", "dev", dev, "root", *tbf)

    def ports(self) -> list[tuple[str, str, str, float]]:
        """(link name, namespace, device, scenario rate in bit/s) of each shaped direction."""
        out = []
        for i, (ns, link, label) in enumerate(zip(self.names, self.links, self.labels)):
            out.append((f"{label}.up", ns, "eth0", link.up_mbps * 1e6))
            out.append((f"{label}.down", self.switch, f"p{i}", link.down_mbps * 1e6))
        return out

    def applied(self) -> list[dict]:
        """What each link got of its plan: latency and loss need netem."""
        return [{"machine": self.labels[i], "up_mbps": link.up_mbps, "down_mbps": link.down_mbps,
                 "latency_ms": link.latency_ms if self.netem else 0.0, "loss": link.loss if self.netem else 0.0,
                 "not_applied": [] if self.netem else [k for k in ("latency_ms", "loss") if getattr(link, k)]}
                for i, link in enumerate(self.links)]

    def check_isolated(self) -> None:
        for ns in self.names:
            routes = _run("ip", "-n", ns, "-4", "route", "show", "table", "all").stdout.splitlines()
            bad = [r for r in routes if not (r.startswith(f"{SUBNET}.0.0/{PREFIX} ") or r.startswith("local ")
                                             or r.startswith("broadcast ") or " dev lo " in f" {r} ")]
            if bad or any(r.startswith("default") for r in routes):
                raise NetError(f"{ns} has routes beyond {SUBNET}.0.0/{PREFIX}: {bad}")
        if "inet " in _run("ip", "-n", self.switch, "-4", "addr", "show").stdout.replace("inet 127.0.0.1", ""):
            raise NetError(f"the switch namespace {self.switch} has an address")

    def exec_prefix(self, machine: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[machine]]


def tc(ns: str, *args: str) -> None:
    p = subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise NetError(f"tc {' '.join(args)} in {ns}: {p.stderr.strip()}")


def parse_qdiscs(text: str) -> dict[str, dict]:
    """``tc -s -j qdisc show``'s output as each shaped device's {bytes, packets, drops, backlog,
    rate_bps}: its tbf's counters and rate (under a netem where there is one), drops of both."""
    try:
        qdiscs = json.loads(text or "[]")
    except ValueError:
        return {}
    out: dict[str, dict] = {}
    for q in qdiscs:
        dev = q.get("dev")
        if q.get("kind") == "tbf" and dev:
            out[dev] = {"bytes": int(q.get("bytes", 0)), "packets": int(q.get("packets", 0)), "drops": 0,
                        "backlog": int(q.get("backlog", 0)), "rate_bps": _bits((q.get("options") or {}).get("rate"))}
    for q in qdiscs:
        if q.get("dev") in out:
            out[q["dev"]]["drops"] += int(q.get("drops", 0))
    return out


def _bits(rate) -> float | None:
    """tc's JSON rate: bytes per second as a number (iproute2 >= 5.x), or a string such as '100Mbit'."""
    if isinstance(rate, (int, float)):
        return float(rate) * 8
    m = re.fullmatch(r"([\d.]+)([KMG]?)bit", str(rate or ""))
    if not m:
        return None
    return float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]


def _has_netem(tag: str) -> bool:
    name = f"{tag}-probe"
    _run("ip", "netns", "add", name)
    try:
        _run("ip", "-n", name, "link", "add", "vq0", "type", "veth", "peer", "name", "vq1")
        return subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "vq0", "root", "netem",
                               "delay", "1ms"], capture_output=True).returncode == 0
    finally:
        _run("ip", "netns", "del", name, check=False)


def namespaces() -> list[str]:
    p = _run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
