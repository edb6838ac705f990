"""The --netns testbed of tools/bench_collectives.py: every rank a "machine" in a network namespace of its own.

tools/netns_fl.py's ``Testbed`` (one veth per rank to a bridge in a switch
namespace, 10.231.0.<rank+1>/24, no route out), unshaped unless asked, removed on
the way out whatever happens; and what a rank's process does first to live in
its namespace (``net_setup``).
"""

from __future__ import annotations

import os
import subprocess

CLONE_NEWNET = 0x40000000


def _enter_netns(name: str) -> None:
    """Move this process (its only thread so far) into the network namespace ``ip netns`` calls
    ``name``: every socket and thread made afterwards lives there (Python 3.11 has no os.setns)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def net_setup(net) -> None:
    """In a rank's process: into its namespace, and the environment of the lan path (``net``:
    None on loopback, else NetSetup.net_of's {"ns", "addr", "iface", "master", "profile", "peers"})."""
    if net is None:
        return
    _enter_netns(net["ns"])
    os.environ["DTEMU_DDS_INTERFACE"] = net["iface"]
    os.environ["GLOO_SOCKET_IFNAME"] = net["iface"]
    os.environ["DTEMU_DDS_SHM"] = "0"   # the lan profile uses no pools anyway: say it
    # c10d warns once per rank that the namespace cannot resolve its peer's host name: harmless.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


class NetSetup:
    """The --netns testbed: tools/netns_fl.py's Testbed, unshaped unless asked, as a context
    manager that removes the namespaces on the way out (SIGTERM and SIGHUP become
    KeyboardInterrupt meanwhile, so that ``finally`` runs)."""

    def __init__(self, nodes: int, mbps: float, delay_ms: float, mtu: int, bridge_nf: bool = False,
                 dds_profile: str = "lan"):
        from dtemu.real.machine_net import tc
        from tools.netns_fl import Testbed

        class BenchBed(Testbed):
            def _shape(self, ns, dev, mbps, link):
                if mbps > 0:                      # tbf (behind netem if delayed), as real.machine_net
                    return super()._shape(ns, dev, mbps, link)
                if self.netem and link.latency_ms:   # delay only
                    tc(ns, "qdisc", "add", "dev", dev, "root", "netem", "delay", f"{link.latency_ms:g}ms",
                       "limit", "100000")

        self.bed = BenchBed(nodes=nodes, mbps=mbps, delay_ms=delay_ms, mtu=mtu, tag=f"dtbc{os.getpid() % 100000}")
        self.bridge_nf = bridge_nf
        self.dds_profile = dds_profile
        self._old: dict = {}

    def __enter__(self):
        import signal

        def on_signal(signum, _frame):
            raise KeyboardInterrupt(f"signal {signum}")

        self._old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
        try:
            self.bed.up()
            if not self.bridge_nf:
                self._switch_without_netfilter()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        import signal

        try:
            self.bed.down()
        finally:
            for s, h in self._old.items():
                signal.signal(s, h)
            self._old = {}

    def _switch_without_netfilter(self) -> None:
        """A switch forwards frames; with br_netfilter loaded the kernel also runs every bridged
        IPv4 packet through the (empty) iptables hooks of the switch namespace, a per-packet cost
        that falls on each 1500-byte fragment of DDS's 64 kB datagrams.  Off, in that namespace
        only (the setting is per namespace)."""
        keys = [k for k in ("iptables", "ip6tables", "arptables")
                if os.path.exists(f"/proc/sys/net/bridge/bridge-nf-call-{k}")]
        if keys:
            from tools.netns_fl import NetnsError

            p = subprocess.run(["ip", "netns", "exec", self.bed.switch, "sysctl", "-qw",
                                *(f"net.bridge.bridge-nf-call-{k}=0" for k in keys)], capture_output=True, text=True)
            if p.returncode != 0:
                raise NetnsError(f"sysctl in {self.bed.switch}: {p.stderr.strip()}")

    def net_of(self, world: int, rank: int, iface: str = "eth0") -> dict:
        addrs = self.bed.addresses[:world]
        return {"ns": self.bed.names[rank], "addr": addrs[rank], "iface": iface, "master": addrs[0],
                "profile": self.dds_profile,
                "peers": [a for j, a in enumerate(addrs) if j != rank]}

    def drops(self) -> dict[str, int]:
        """Datagrams the namespaces' kernels lost, summed over the nodes, by counter."""
        total: dict[str, int] = {}
        for counts in self.bed.drop_counters().values():
            for k, v in counts.items():
                total[k] = total.get(k, 0) + v
        return total

    def describe(self) -> str:
        b = self.bed
        rate = f"{b.mbps:g} Mbit/s (tbf)" if b.mbps > 0 else "unshaped"
        delay = f", delay {b.delay_ms:g} ms per link and direction (netem)" if b.netem else ""
        nf = "bridge netfilter on" if self.bridge_nf else "no bridge netfilter"
        return f"{len(b.names)} namespaces on 10.231.0.0/16 behind one bridge ({nf}), veth MTU {b.mtu}, {rate}{delay}"
