"""What crosses one interface of the testbed, RTPS message by RTPS message (a developer's probe).

    ip netns exec dtm<pid>-m0 python -m tools.rtps_capture eth0 --out m0.json

Runs until SIGTERM/SIGINT or until the interface goes away (the launch removed its machines),
then writes per direction the datagrams and bytes of each kind (the bytes as a Linux shaper counts
them: every IP fragment with its Ethernet header), and every DATA or DATA_FRAG seen again for the
same (writer, sequence number, fragment, destination): a repair.  This is how notebook entry 48
found that geo's extra bytes were repairs of fresh writers' first samples, in the first round only,
and that a push waited 0.4 s for an ACKNACK behind the receiver's own model on its link.

No tcpdump on this box: an AF_PACKET socket, and only the first IP fragment of a datagram is read
(the rest are counted to it).  Its own CPU is a few percent of a core at 20 Mbit/s.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import struct
import time
from collections import defaultdict

# RTPS submessage ids (OMG DDSI-RTPS 2.x, 9.4.5.1.1) that say what a datagram is for.
KINDS = {0x06: "acknack", 0x07: "heartbeat", 0x12: "nackfrag", 0x13: "heartbeat_frag", 0x15: "data",
         0x16: "datafrag"}
PRECEDENCE = ("datafrag", "data", "nackfrag", "acknack", "heartbeat_frag", "heartbeat")
PACKET_OUTGOING = 4   # socket.PACKET_OUTGOING: a frame this host sent


def parse_rtps(payload: bytes) -> tuple[str, list[tuple]]:
    """A UDP payload's kind and the (writer GUID prefix, writer id, sequence number, fragment) of
    each DATA and DATA_FRAG in it ("other" for RTPS with none of KINDS, "non-rtps")."""
    if payload[:4] != b"RTPS":
        return "non-rtps", []
    prefix, i, kinds, keys = payload[8:20], 20, set(), []
    while i + 4 <= len(payload):
        sid, flags = payload[i], payload[i + 1]
        order = "<" if flags & 1 else ">"
        (length,) = struct.unpack(order + "H", payload[i + 2:i + 4])
        body = payload[i + 4:i + 4 + length] if length else payload[i + 4:]
        if sid in KINDS:
            kinds.add(KINDS[sid])
        if sid in (0x15, 0x16) and len(body) >= 20:
            high, low = struct.unpack(order + "iI", body[12:20])
            fragment = struct.unpack(order + "I", body[20:24])[0] if sid == 0x16 and len(body) >= 24 else 0
            keys.append((prefix.hex(), body[8:12].hex(), (high << 32) | low, fragment))
        if not length:
            break
        i += 4 + length
    return next((k for k in PRECEDENCE if k in kinds), "other"), keys


class Tally:
    """Datagrams and bytes per (direction, kind), and the repairs."""

    def __init__(self, clock=time.monotonic):
        self.clock, self.t0 = clock, clock()
        self.counts = defaultdict(lambda: [0, 0])   # (direction, kind) -> [datagrams, bytes]
        self.first_seen: dict[tuple, float] = {}
        self.repairs: list[dict] = []
        self._datagram_kind: dict[tuple, tuple[str, str]] = {}   # an IP datagram's (direction, kind)

    def frame(self, frame: bytes, outgoing: bool) -> None:
        direction = "out" if outgoing else "in"
        if len(frame) < 34 or frame[12:14] != b"\x08\x00":
            self._count(direction, "non-ip", len(frame), new=True)
            return
        ip = frame[14:]
        header = (ip[0] & 15) * 4
        offset = struct.unpack(">H", ip[6:8])[0] & 0x1FFF
        datagram = (ip[12:16], ip[16:20], ip[4:6])
        if offset:   # a later fragment: its datagram's kind
            direction, kind = self._datagram_kind.get(datagram, (direction, "orphan"))
            self._count(direction, kind, len(frame), new=False)
            return
        kind = "non-udp"
        if ip[9] == 17:
            kind, keys = parse_rtps(ip[header + 8:])
            kind = self._note_repairs(kind, keys, direction, socket.inet_ntoa(ip[16:20]) + ":" +
                                      str(struct.unpack(">H", ip[header + 2:header + 4])[0]))
        self._datagram_kind[datagram] = (direction, kind)
        self._count(direction, kind, len(frame), new=True)

    def _note_repairs(self, kind: str, keys: list[tuple], direction: str, to: str) -> str:
        now, repeated = self.clock(), None
        for key in keys:
            key = (*key, to)
            if key in self.first_seen:
                repeated = repeated or key
            else:
                self.first_seen[key] = now
        if repeated is None or kind not in ("data", "datafrag"):
            return kind
        self.repairs.append({"t": round(now - self.t0, 4), "after_s": round(now - self.first_seen[repeated], 4),
                             "direction": direction, "to": to, "writer": repeated[1], "sn": repeated[2],
                             "fragment": repeated[3]})
        return kind + "_repeated"

    def _count(self, direction: str, kind: str, nbytes: int, new: bool) -> None:
        entry = self.counts[(direction, kind)]
        entry[0] += int(new)
        entry[1] += nbytes

    def report(self) -> dict:
        return {"counts": {f"{d}/{k}": {"datagrams": v[0], "bytes": v[1]} for (d, k), v in sorted(self.counts.items())},
                "repairs": self.repairs}


def capture(interface: str, tally: Tally) -> None:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))   # ETH_P_ALL
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    sock.bind((interface, 0))
    sock.settimeout(0.5)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    while not stop:
        try:
            frame, address = sock.recvfrom(1 << 16)
        except (socket.timeout, InterruptedError):
            continue
        except OSError:   # the interface went away with its namespace: the run is over
            break
        tally.frame(frame, address[2] == PACKET_OUTGOING)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.rtps_capture", description=__doc__.split("\n\n")[0])
    p.add_argument("interface")
    p.add_argument("--out", required=True, help="JSON file for the tallies and the repairs")
    args = p.parse_args(argv)
    tally = Tally()
    capture(args.interface, tally)
    with open(args.out, "w") as f:
        json.dump(tally.report(), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
