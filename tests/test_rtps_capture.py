"""tools.rtps_capture: RTPS datagrams told apart, and a repeated fragment found (notebook entry 48)."""

import struct

from tools.rtps_capture import Tally, parse_rtps

PREFIX = bytes(range(12))


def _rtps(*submessages: bytes) -> bytes:
    return b"RTPS" + b"\x02\x01\x01\x10" + PREFIX + b"".join(submessages)


def _datafrag(writer: bytes, sn: int, fragment: int, payload: bytes = b"x" * 64) -> bytes:
    body = (struct.pack("<HH", 0, 28) + b"\x00" * 4 + writer + struct.pack("<iI", sn >> 32, sn & 0xFFFFFFFF)
            + struct.pack("<IHHI", fragment, 1, 64000, 1 << 20) + payload)
    return struct.pack("<BBH", 0x16, 0x01, len(body)) + body


def _heartbeat() -> bytes:
    body = b"\x00" * 28
    return struct.pack("<BBH", 0x07, 0x01, len(body)) + body


def _frame(udp_payload: bytes, ipid: int = 1, offset: int = 0, dst=b"\x0a\xe7\x00\x02", port=7411) -> bytes:
    udp = struct.pack(">HHHH", 7410, port, 8 + len(udp_payload), 0) + udp_payload if offset == 0 else udp_payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), ipid, offset, 64, 17, 0, b"\x0a\xe7\x00\x01", dst)
    return b"\x00" * 12 + b"\x08\x00" + ip + udp


def test_parse_tells_data_from_control():
    kind, keys = parse_rtps(_rtps(_datafrag(b"\x00\x00\x1f\x02", 3, 5)))
    assert kind == "datafrag" and keys == [(PREFIX.hex(), "00001f02", 3, 5)]
    assert parse_rtps(_rtps(_heartbeat()))[0] == "heartbeat"
    assert parse_rtps(b"not rtps at all")[0] == "non-rtps"


def test_a_fragment_sent_again_to_the_same_reader_is_a_repair_and_later_ip_fragments_count_to_it():
    clock = iter([0.0, 1.0, 1.2, 1.9, 2.0]).__next__
    tally = Tally(clock=clock)
    first = _frame(_rtps(_datafrag(b"\x00\x00\x1f\x02", 1, 1)), ipid=7)
    tally.frame(first, outgoing=True)
    tally.frame(_frame(b"y" * 1480, ipid=7, offset=185), outgoing=True)            # its second IP fragment
    tally.frame(_frame(_rtps(_datafrag(b"\x00\x00\x1f\x02", 1, 1)), ipid=8, port=7413), outgoing=True)  # another reader
    tally.frame(_frame(_rtps(_datafrag(b"\x00\x00\x1f\x02", 1, 1)), ipid=9), outgoing=True)   # the same: again
    report = tally.report()
    assert report["counts"]["out/datafrag"]["datagrams"] == 2
    assert report["counts"]["out/datafrag"]["bytes"] == 2 * len(first) + len(_frame(b"y" * 1480, offset=185))
    assert report["counts"]["out/datafrag_repeated"]["datagrams"] == 1
    assert report["repairs"] == [{"t": 1.9, "after_s": 0.9, "direction": "out", "to": "10.231.0.2:7411",
                                  "writer": "00001f02", "sn": 1, "fragment": 1}]
