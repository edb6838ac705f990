"""The Frame fast path must produce exactly the stock cyclonedds serialization.

If a cyclonedds upgrade changes the CDR it writes for ``real.wire.Frame``, the
byte-for-byte comparisons below fail: fix ``real.wire.encode_frame`` /
``decode_frame`` before using the new version.
"""

import os
import time

import pytest

pytest.importorskip("cyclonedds")

from cyclonedds.idl._support import Endianness  # noqa: E402

from dtemu.real.wire import Frame, Hello, WireError, decode_frame, encode_frame  # noqa: E402

SIZES = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4093]
STRINGS = ["", "a", "ab", "abc", "abcd", "abcde", "client12", "train/model_blob", "n\u00f8de-\u00e9\u6f22"]
ENDIAN = [Endianness.Little, Endianness.Big]


def _frame(n: int, s: str = "node", **kw) -> Frame:
    rnd = os.urandom(n)
    args = dict(src=s, dst=s[::-1], topic="coll/" + s, msg_id=0x0102030405060708 + n, part=n % 7,
                parts=7, total=1 << 40 | n, payload=rnd)
    args.update(kw)
    return Frame(**args)


def _stock_ser(f: Frame, **kw) -> bytes:
    return Frame.__idl__.serialize(f, **kw)


def test_stock_default_is_xcdr1_little_endian_header():
    b = _stock_ser(_frame(3))
    assert b[:4] == bytes([0, 1, 0, 0])  # CDR_LE: what DataWriter.write sends on x86


@pytest.mark.parametrize("n", SIZES)
def test_fast_serialize_equals_stock_default(n):
    for s in STRINGS:
        f = _frame(n, s)
        assert f.serialize() == _stock_ser(f), (n, s)


@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("endian", ENDIAN, ids=["le", "be"])
def test_fast_serialize_equals_stock_all_encodings(v2, endian):
    for n in SIZES:
        for s in STRINGS:
            f = _frame(n, s)
            fast = f.serialize(endianness=endian, use_version_2=v2)
            stock = _stock_ser(f, endianness=endian, use_version_2=v2)
            assert fast == stock, (n, s, v2, endian)


@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("endian", ENDIAN, ids=["le", "be"])
def test_round_trip_both_ways(v2, endian):
    for n in SIZES:
        for s in STRINGS:
            f = _frame(n, s)
            stock_bytes = _stock_ser(f, endianness=endian, use_version_2=v2)
            fast_bytes = f.serialize(endianness=endian, use_version_2=v2)
            # stock bytes -> fast decoder
            g = Frame.deserialize(stock_bytes)
            assert g == f and isinstance(g.payload, bytes)
            # fast bytes -> stock decoder (which returns the payload as a list of ints)
            h = Frame.__idl__.deserialize(fast_bytes)
            assert (h.src, h.dst, h.topic, h.msg_id, h.part, h.parts, h.total) == \
                   (f.src, f.dst, f.topic, f.msg_id, f.part, f.parts, f.total)
            assert bytes(h.payload) == f.payload
            # and the stock decoder's output (list payload) serializes the same again
            assert h.serialize(endianness=endian, use_version_2=v2) == stock_bytes


def test_extreme_integers_and_payload_types():
    f = Frame(src="s", dst="", topic="t", msg_id=2**64 - 1, part=2**32 - 2, parts=2**32 - 1,
              total=2**64 - 1, payload=b"xyz")
    assert f.serialize() == _stock_ser(f)
    assert Frame.deserialize(f.serialize()) == f
    for p in (bytearray(b"abcde"), memoryview(b"abcde"), [97, 98, 99, 100, 101]):
        g = Frame(src="s", topic="t", total=5, payload=p)
        assert g.serialize() == _stock_ser(Frame(src="s", topic="t", total=5, payload=b"abcde"))


def test_zero_copy_decode_and_writer_padding():
    f = _frame(1001)
    b = f.serialize()
    padded = b + b"\0" * ((-len(b)) % 4)  # DataWriter.write pads samples to a multiple of 4
    g = decode_frame(padded, copy=False)
    assert isinstance(g.payload, memoryview) and g.payload.obj is not None
    assert bytes(g.payload) == f.payload and g.msg_id == f.msg_id


@pytest.mark.parametrize("n", SIZES)
def test_pad4_is_the_writer_padding(n):
    for s in STRINGS[:6]:
        f = _frame(n, s)
        stock = _stock_ser(f)
        padded = encode_frame(f, pad4=True)
        assert len(padded) % 4 == 0 and padded == stock.ljust((len(stock) + 3) & ~3, b"\0")


def test_malformed_bytes_raise_wire_error():
    b = _frame(10, "abc").serialize()
    bad = [
        b"",
        b"\x00\x01\x00",
        b"\x00\x03\x00\x00" + b[4:],      # PL_CDR (mutable) header: not our layout
        b"\x01\x01\x00\x00" + b[4:],      # first header byte must be 0
        b[:10],                            # truncated inside a string
        b[:-5],                            # payload runs past the end
        b[:4] + (10**6).to_bytes(4, "little") + b[8:],  # huge string length
        b[:4] + (0).to_bytes(4, "little") + b[8:],      # string length 0 (no NUL)
    ]
    nul = bytearray(b)
    nul[4 + 4 + 3] = ord("x")  # src "abc\0" -> "abcx": not NUL-terminated
    bad.append(bytes(nul))
    for x in bad:
        with pytest.raises(WireError):
            decode_frame(x)
    # one error class for every malformed input of dtemu: a listener catches DecodeError
    from dtemu.core.errors import DecodeError
    assert issubclass(WireError, DecodeError) and issubclass(WireError, ValueError)


def test_hello_is_stock_and_round_trips():
    h = Hello(node="client3", guid="0110-abc", pid=1234, host="h")
    assert Hello.deserialize(h.serialize()) == h


@pytest.mark.parametrize("size", [1 << 20, 16 << 20])
def test_fast_path_speed_and_integrity(size):
    """1 and 16 MiB both ways, far below the stock serializer (~1.9 s for 16 MiB)."""
    payload = os.urandom(size)
    f = Frame(src="a", topic="t", msg_id=1, total=size, payload=payload)
    t0 = time.perf_counter()
    b = encode_frame(f)
    t_ser = time.perf_counter() - t0
    t0 = time.perf_counter()
    g = decode_frame(b, copy=True)
    t_de = time.perf_counter() - t0
    assert g.payload == payload
    head = _stock_ser(Frame(src="a", topic="t", msg_id=1, total=size, payload=b""))
    assert b[:len(head) - 4] == head[:-4] and b[len(head) - 4:len(head)] == size.to_bytes(4, "little")
    assert len(b) == len(head) + size
    # generous bounds (shared, loaded CI machines): the fast path takes ~15 ms for 16 MiB
    assert t_ser < 1.0 and t_de < 1.0, (t_ser, t_de)


def test_frame_through_cyclonedds_stock_reader_and_writer():
    """Our bytes pass CycloneDDS's own CDR validation (dds_stream_normalize) and the stock
    DataReader.take (which calls Frame.deserialize) gets the frame back."""
    from cyclonedds.core import Policy, Qos
    from cyclonedds.domain import DomainParticipant
    from cyclonedds.pub import DataWriter
    from cyclonedds.sub import DataReader
    from cyclonedds.topic import Topic
    from cyclonedds.util import duration

    from dtemu.real.config import config_xml
    from dtemu.real.dds_support import _acquire_domain, _release_domain

    domain = 1 + (os.getpid() * 13 + 7) % 100
    _acquire_domain(domain, config_xml("loopback"))
    try:
        dp = DomainParticipant(domain)
        qos = Qos(Policy.Reliability.Reliable(duration(seconds=1)), Policy.History.KeepAll)
        tp = Topic(dp, "test/wire", Frame)
        w = DataWriter(dp, tp, qos=qos)
        r = DataReader(dp, tp, qos=qos)
        sent = [_frame(n, s) for n, s in zip(SIZES, STRINGS * 3)]
        for f in sent:
            w.write(f)
        got = []
        deadline = time.monotonic() + 5
        while len(got) < len(sent) and time.monotonic() < deadline:
            got += [s for s in r.take(100) if s.sample_info.valid_data]
            time.sleep(0.005)
        # Frame is keyed on ``part``: take() returns samples grouped by instance, not in write order
        got.sort(key=lambda g: g.msg_id)
        assert [g.payload for g in got] == [f.payload for f in sent]
        assert [(g.src, g.dst, g.topic, g.msg_id, g.part, g.parts, g.total) for g in got] == \
               [(f.src, f.dst, f.topic, f.msg_id, f.part, f.parts, f.total) for f in sent]
        dp.__del__()
    finally:
        _release_domain(domain)


def test_matched_handles_lists_more_endpoints_than_its_first_buffer():
    """_matched_handles (the transport's matching barrier) lists every endpoint matched with a writer
    or a reader, here 20 readers (more than its first buffer of 16), as the stock call does when
    nothing changes meanwhile; the stock call raises IndexError when a peer matches between its
    two C calls, which this one cannot."""
    from cyclonedds.core import Policy, Qos
    from cyclonedds.domain import DomainParticipant
    from cyclonedds.pub import DataWriter
    from cyclonedds.sub import DataReader
    from cyclonedds.topic import Topic
    from cyclonedds.util import duration

    from dtemu.real.config import config_xml
    from dtemu.real.dds_support import _acquire_domain, _matched_handles, _release_domain

    domain = 1 + (os.getpid() * 17 + 11) % 100
    _acquire_domain(domain, config_xml("loopback"))
    try:
        dp = DomainParticipant(domain)
        qos = Qos(Policy.Reliability.Reliable(duration(seconds=1)))
        tp = Topic(dp, "test/matched", Frame)
        w = DataWriter(dp, tp, qos=qos)
        readers = [DataReader(dp, tp, qos=qos) for _ in range(20)]
        deadline = time.monotonic() + 5
        while len(_matched_handles(w)) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(_matched_handles(w)) == sorted(w.get_matched_subscriptions())
        assert len(_matched_handles(w)) == 20
        assert [len(_matched_handles(r)) for r in readers] == [1] * 20
        dp.__del__()
    finally:
        _release_domain(domain)


def test_encode_parts_is_encode_frame_and_its_prefix_cache_is_bounded(monkeypatch):
    """The transport's send path (encode_parts, a cached prefix per (src, dst, topic)) writes the
    same bytes as encode_frame; made-up names cannot grow the cache without end."""
    from dtemu.real import wire

    monkeypatch.setattr(wire, "_MAX_PREFIXES", 4)
    wire._PREFIXES.clear()
    for _ in range(2):
        for n in (0, 1, 7, 100):
            for s in STRINGS:
                f = _frame(n, s)
                assert wire.encode_parts(f.src, f.dst, f.topic, f.msg_id, f.part, f.parts, f.total, f.payload,
                                         pad4=True) == encode_frame(f, pad4=True) == \
                    _stock_ser(f).ljust((len(_stock_ser(f)) + 3) & ~3, b"\0")
                assert len(wire._PREFIXES) <= 4
