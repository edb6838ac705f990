"""What real mode's DDS transport does to a message's time on the wire, for emu's network.

Two pieces, each opt-in by a scenario key (the defaults keep emu's old arithmetic):

``network.framing: rtps`` -- header bytes.  Real mode (``real/transport.py``) cuts a
message into frames of at most ``FRAME_BYTES`` (1 MiB), each one DDS sample with a
CDR header; CycloneDDS cuts a sample into DATA_FRAG submessages of ``FRAGMENT_BYTES``
(``FragmentSize`` in ``real/config/*.xml``), one per RTPS message (a UDP datagram);
IPv4 cuts a datagram into packets of at most ``mtu`` bytes; each packet carries an
IPv4 and an Ethernet header.  ``wire_bytes(n, mtu)`` adds all of them up.  The
header sizes are the protocols' own (RTPS 2.x: header 20, INFO_TS 12, INFO_DST 16,
DATA_FRAG 36; UDP 8; IPv4 20 without options; Ethernet II 14, as a Linux shaper
counts it: a physical link also spends preamble, FCS and gap, 24 bytes per frame,
which no shaper sees).  Left out: heartbeats, ACKNACKs (on the reverse path) and
discovery, a few hundred bytes a second.

``network.send_window_bytes: H`` -- when a send returns.  A DDS write returns once the
sample is in the writer's history; the writer blocks only while more than ``WhcHigh``
(= H) bytes of it are unacknowledged, and then until they are all acknowledged
(``WhcLow`` is 1 kB; CycloneDDS ``throttle_writer``).  So the frames of one message
go out in groups of ``g`` frames (the fewest whose history exceeds H) and the send
returns when the last group has been written, that is once every earlier group got
through: the bytes of the last group are still on the wire.  ``tail_bytes(n, H)`` is
that last group.  The link under the writer is a FIFO (the kernel's queue), so a
later send from the same node starts behind that tail (emu.network, ``fifo``).
Between groups the writer's link idles until the group is acknowledged
(``group_bounds``; emu.tandem): the group's last byte must reach the receiver, and the
receiver's ACKNACK must come back, behind whatever waits in the queues of the way back.
That is a round trip on an idle path, and up to a whole writer history's time on the
link where the receiver is itself sending a large message: on the testbed a site's
5-frame push to the central PS, while the PS sent a model to the other site, stalled
0.42-0.48 s after its second frame (notebook entry 48).
"""

from __future__ import annotations

import functools

FRAME_BYTES = 1 << 20          # real.reassembly.FRAME_BYTES: payload bytes per frame (DDS sample)
FRAME_HEADER_BYTES = 72        # a Frame's CDR: encapsulation, src, dst, topic, msg_id, part, parts, total, length
FRAGMENT_BYTES = 64000         # real/config/*.xml <FragmentSize>: bytes of a sample per DATA_FRAG
RTPS_MESSAGE_HEADER_BYTES = 20 + 12 + 16 + 36   # RTPS header, INFO_TS, INFO_DST, DATA_FRAG submessage
UDP_HEADER_BYTES = 8
IPV4_HEADER_BYTES = 20
ETHERNET_HEADER_BYTES = 14

FRAMINGS = ("payload", "rtps", "stream")

# framing "stream": real mode's TCP stream beside DDS (real.stream; host.stream_choice says when).
# A message of at least STREAM_MIN_BYTES goes as frames of STREAM_FRAME_BYTES, each a ZeroMQ
# message (its frame's header as the key, ~STREAM_ENVELOPE_BYTES with zmq's framing) in TCP
# segments of the MSS (the MTU less IPv4 20, TCP 20 and its timestamp option 12), each with
# TCP, IPv4 and Ethernet headers; DDS carries a small reference per frame (an RTPS sample).
# The peer's ACKs go the other way.  Measured on the testbed: a controller's link carried 4.47%
# over the payload (docs/notebook/, entry 41); the segments' headers alone are 4.56%.
STREAM_FRAME_BYTES = 1 << 20      # host.stream_choice.FRAME_BYTES
STREAM_MIN_BYTES = 64 << 10       # host.stream_choice.MIN_BYTES
STREAM_ENVELOPE_BYTES = 96        # "D", the key (header numbers and names), zmq's frame flags and lengths
STREAM_REFERENCE_BYTES = 8        # the length a reference carries (sealed: and a 16-byte tag)
TCP_HEADER_BYTES = 20 + 12        # with the timestamp option Linux sends by default


@functools.lru_cache(maxsize=4096)
def _sample_wire(sample: int, mtu: int) -> int:
    """Wire bytes of one DDS sample of ``sample`` serialized bytes."""
    packet_data = mtu - IPV4_HEADER_BYTES  # IP payload per packet (1480 at 1500: a multiple of 8)
    if packet_data <= 0:
        raise ValueError(f"mtu {mtu} leaves no room for data after the IPv4 header")
    wire = 0
    full, last = divmod(sample, FRAGMENT_BYTES)
    for size, count in ((FRAGMENT_BYTES, full), (last, 1 if last or not full else 0)):
        if not count:
            continue
        datagram = UDP_HEADER_BYTES + RTPS_MESSAGE_HEADER_BYTES + size
        packets = -(-datagram // packet_data)
        wire += count * (datagram + packets * (IPV4_HEADER_BYTES + ETHERNET_HEADER_BYTES))
    return wire


def _stream_frame_wire(size: int, mtu: int) -> int:
    """Wire bytes of one frame of ``size`` payload bytes on the stream, with its DDS reference."""
    mss = mtu - IPV4_HEADER_BYTES - TCP_HEADER_BYTES
    if mss <= 0:
        raise ValueError(f"mtu {mtu} leaves no room for data after the IPv4 and TCP headers")
    data = size + STREAM_ENVELOPE_BYTES
    segments = -(-data // mss)
    return (data + segments * (TCP_HEADER_BYTES + IPV4_HEADER_BYTES + ETHERNET_HEADER_BYTES)
            + _sample_wire(FRAME_HEADER_BYTES + STREAM_REFERENCE_BYTES, mtu))


def wire_bytes(nbytes: int, mtu: int, framing: str = "rtps") -> int:
    """Bytes a message of ``nbytes`` payload puts on one link (``framing`` "payload": itself)."""
    if framing == "payload":
        return nbytes
    if framing == "stream" and nbytes >= STREAM_MIN_BYTES:
        full, last = divmod(nbytes, STREAM_FRAME_BYTES)
        wire = full * _stream_frame_wire(STREAM_FRAME_BYTES, mtu)
        if last >= STREAM_MIN_BYTES:
            wire += _stream_frame_wire(last, mtu)
        elif last:   # a last frame under the threshold goes inline, in one DDS sample
            wire += _sample_wire(last + FRAME_HEADER_BYTES, mtu)
        return wire
    if framing not in FRAMINGS:
        raise ValueError(f"unknown framing {framing!r} (one of {FRAMINGS})")
    full, last = divmod(nbytes, FRAME_BYTES)
    wire = full * _sample_wire(FRAME_BYTES + FRAME_HEADER_BYTES, mtu) if full else 0
    if last or not full:  # an empty message is still one frame
        wire += _sample_wire(last + FRAME_HEADER_BYTES, mtu)
    return wire


def frames_per_group(window: int) -> int:
    """How many frames a writer takes before more than ``window`` bytes of them are
    unacknowledged (each frame's history entry is its payload and its header)."""
    return window // (FRAME_BYTES + FRAME_HEADER_BYTES) + 1


def group_bounds(nbytes: int, window: int, mtu: int, framing: str = "rtps") -> tuple[int, ...]:
    """Wire bytes of a message at which each group of its frames but the last ends: there its
    writer waits until the group is acknowledged (none without a writer history, or on the
    stream, whose TCP acknowledges as bytes come in)."""
    if window <= 0 or framing == "stream":
        return ()
    frames = max(1, -(-nbytes // FRAME_BYTES))
    per_group = frames_per_group(window)
    frame_wire = FRAME_BYTES if framing == "payload" else _sample_wire(FRAME_BYTES + FRAME_HEADER_BYTES, mtu)
    return tuple(j * per_group * frame_wire for j in range(1, (frames - 1) // per_group + 1))


def tail_bytes(nbytes: int, window: int) -> int:
    """Payload bytes of a message still to go through when its send returns, with a writer
    history of ``window`` bytes (0: none, the send waits for everything)."""
    if window <= 0:
        return 0
    frames = max(1, -(-nbytes // FRAME_BYTES))
    before = (frames - 1) // frames_per_group(window) * frames_per_group(window)  # frames of earlier groups
    return nbytes - before * FRAME_BYTES
