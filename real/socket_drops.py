"""What each machine's UDP sockets refused: the datagrams its kernel dropped because a socket's receive
buffer was full (``RcvbufErrors``), or for any reason (``InErrors``), read from the namespace's own
``/proc/net/snmp`` at a testbed run's start and end.

A rank short of CPU (its machine's share) drains its sockets late; CycloneDDS then asks for what was
lost and the sender sends it again: bytes and time on the link that no qdisc drop shows and that emu
does not model.  So these are recorded in summary.json's ``testbed.sockets``, not judged: a machine
whose share is too small for its traffic is the scenario's machine, not an unfaithful testbed.
"""

from __future__ import annotations

import subprocess

FIELDS = {"InDatagrams": "in_datagrams", "InErrors": "in_errors", "RcvbufErrors": "rcvbuf_errors",
          "SndbufErrors": "sndbuf_errors"}


def parse_udp(snmp: str) -> dict[str, int]:
    """The ``Udp:`` counters of a ``/proc/net/snmp`` text (a header line, then a values line)."""
    rows = [line.split()[1:] for line in snmp.splitlines() if line.startswith("Udp:")]
    if len(rows) < 2 or len(rows[0]) != len(rows[1]):
        return {}
    named = dict(zip(rows[0], rows[1]))
    return {ours: int(named[theirs]) for theirs, ours in FIELDS.items() if named.get(theirs, "").isdigit()}


def read(namespace: str) -> dict[str, int]:
    """``namespace``'s UDP counters now ({} where they cannot be read)."""
    p = subprocess.run(["ip", "netns", "exec", namespace, "cat", "/proc/net/snmp"], capture_output=True, text=True)
    return parse_udp(p.stdout) if p.returncode == 0 else {}


def between(start: dict[str, dict], end: dict[str, dict]) -> dict[str, dict]:
    """Each namespace's counters over the run (end less start), where both were read."""
    return {ns: {k: v - start[ns].get(k, 0) for k, v in end[ns].items()}
            for ns in sorted(end) if ns in start and start[ns] and end[ns]}
