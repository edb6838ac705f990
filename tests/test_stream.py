"""real.stream: large payloads on a TCP stream beside DDS, between two transports of the lan profile.

Everything stays on 127.0.0.1 (DDS's interface and the stream's address).  Each test has its own
domain; waits are bounded.
"""

import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("cyclonedds")
zmq = pytest.importorskip("zmq")

from helpers import new_domain  # noqa: E402
from dtemu.core.wire import frame_auth  # noqa: E402
from dtemu.core.wire.topics import CLIENT_UPDATE, COLL_FRAMES  # noqa: E402
from dtemu.real import stream  # noqa: E402
from dtemu.real.transport import DdsTransport  # noqa: E402
from dtemu.real.wire import Frame  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KEY = b"k" * 32
PID = os.getpid()


@pytest.fixture(autouse=True)
def on_loopback(monkeypatch):
    monkeypatch.setenv("DTEMU_DDS_STREAM", "1")
    monkeypatch.setenv("DTEMU_DDS_INTERFACE", "127.0.0.1")


def pair(domain, key=None, subscribe=(CLIENT_UPDATE,)):
    a = DdsTransport(f"a-{PID}", profile="lan", domain_id=domain, peers="127.0.0.1", key=key)
    b = DdsTransport(f"b-{PID}", profile="lan", domain_id=domain, peers="127.0.0.1", key=key, subscribe=subscribe)
    assert a.wait_matched({t: [b.node] for t in subscribe}, timeout_s=10) == {}
    return a, b


def send_until_streamed(a, b, data, topic=CLIENT_UPDATE, to=None, tries=20):
    """Send until a message went on the stream (its connection opens on the first frames, which go
    inline meanwhile); every message must arrive intact."""
    for _ in range(tries):
        before = a.stats["stream_sent_frames"]
        a.send(topic, data, to=to)
        m = b.recv([topic], timeout_s=10)
        assert m is not None and bytes(m.data) == data
        if a.stats["stream_sent_frames"] > before:
            return m
    raise AssertionError("no frame went on the stream")


# --- pure pieces --------------------------------------------------------------------------------

def test_a_reference_verifies_only_under_its_key_and_header():
    args = ("t", "a", "b", "lbl", 7, 1, 3, 3 << 20)
    ref = stream.reference(KEY, *args, 1 << 20)
    assert stream.read_reference(KEY, *args, ref) == 1 << 20
    assert stream.read_reference(KEY, "t", "a", "b", "lbl", 8, 1, 3, 3 << 20, ref) is None   # another message
    assert stream.read_reference(b"x" * 32, *args, ref) is None                              # another key
    bad = bytearray(ref)
    bad[-1] ^= 1
    assert stream.read_reference(KEY, *args, bytes(bad)) is None                             # another length
    assert stream.read_reference(None, *args, stream.reference(None, *args, 5)) == 5
    assert stream.read_reference(None, *args, b"\0" * 3) is None


def test_the_frame_key_is_the_header_without_the_flag():
    k = stream.frame_key("t", "b", "lbl", 7, 1, 3, 99)
    assert k == stream.frame_key("t", "b", "lbl", 7, 1, 3 | stream.STREAM_FLAG, 99)
    assert k != stream.frame_key("t", "b", "lbl", 7, 2, 3, 99)


@pytest.mark.parametrize("endpoint,ok", [("tcp://10.0.0.2:5555", True), ("tcp://10.0.0.2:0", False),
                                         ("tcp://host:5555", False), ("ipc:///tmp/x", False),
                                         ("tcp://10.0.0.2:5555/x", False), ("tcp://300.0.0.1:5", False)])
def test_only_tcp_endpoints_on_an_ipv4_address_are_dialled(endpoint, ok):
    assert stream.valid_endpoint(endpoint) is ok


def test_the_stream_is_off_by_default_and_never_on_loopback(monkeypatch):
    monkeypatch.delenv("DTEMU_DDS_STREAM")
    assert not stream.enabled("lan")
    monkeypatch.setenv("DTEMU_DDS_STREAM", "1")
    assert stream.enabled("lan") and not stream.enabled("loopback")


# --- two transports -----------------------------------------------------------------------------

@pytest.mark.parametrize("key", [None, KEY], ids=["unsealed", "sealed"])
def test_large_messages_go_on_the_stream_and_arrive_whole(key):
    a, b = pair(new_domain(), key)
    try:
        data = os.urandom(3 * (1 << 20) + 12345)
        send_until_streamed(a, b, data)
        assert b.stats["stream_recv_frames"] >= 3
        assert b.stats["forged_frames"] == b.stats["malformed"] == b.stats["stream_refused"] == 0
        small = b"x" * 100   # under MIN_BYTES: inline
        sent = a.stats["stream_sent_frames"]
        a.send(CLIENT_UPDATE, small)
        assert bytes(b.recv([CLIENT_UPDATE], timeout_s=10).data) == small
        assert a.stats["stream_sent_frames"] == sent
    finally:
        a.close()
        b.close()


def test_a_collective_frame_is_lent_not_copied():
    a, b = pair(new_domain(), subscribe=(COLL_FRAMES,))
    try:
        m = send_until_streamed(a, b, os.urandom(1 << 19), topic=COLL_FRAMES, to=b.node)
        assert isinstance(m.data, memoryview) and m.data.readonly
    finally:
        a.close()
        b.close()


def test_a_connection_without_the_key_gets_nothing_in():
    """A rogue dials b's stream, fails the handshake and pushes bytes under the key of a real frame
    to come: they are refused, and the honest message arrives whole."""
    a, b = pair(new_domain(), KEY)
    rogue = zmq.Context.instance().socket(zmq.DEALER)
    try:
        send_until_streamed(a, b, os.urandom(1 << 20))
        rogue.connect(b._stream_in.endpoint)
        rogue.send_multipart([b"H", a.node.encode(), b.node.encode()])
        assert rogue.poll(5000)
        assert rogue.recv_multipart()[0] == b"C"
        rogue.send_multipart([b"A", b"\0" * frame_auth.TAG_BYTES])   # it has no key
        for msg_id in range(10**6):   # whatever it guesses, its bytes never count
            rogue.send_multipart([b"D", stream.frame_key(CLIENT_UPDATE, "", CLIENT_UPDATE, msg_id, 0, 2, 2 << 20),
                                  b"\0" * 100])
            if msg_id > 50:
                break
        rogue.send_multipart([b"D"])   # malformed
        deadline = time.monotonic() + 5
        while b.stats["stream_refused"] < 53 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b.stats["stream_refused"] >= 53
        data = os.urandom(2 << 20)
        send_until_streamed(a, b, data)
        assert b.stats["forged_frames"] == 0
    finally:
        rogue.close(linger=0)
        a.close()
        b.close()


def test_a_forged_reference_is_refused_at_once_and_holds_nobody_up():
    """Sealed: a reference in a's name without a valid tag is counted as forged and does not make
    a's next frames wait for bytes that will never come."""
    domain = new_domain()
    a, b = pair(domain, KEY)
    rogue = DdsTransport(f"r-{PID}", profile="lan", domain_id=domain, peers="127.0.0.1")
    try:
        send_until_streamed(a, b, os.urandom(1 << 20))
        assert rogue.wait_matched({CLIENT_UPDATE: [b.node]}, timeout_s=10) == {}
        forged = Frame(src=a.node, dst="", topic=CLIENT_UPDATE, msg_id=2**62, part=0,
                       parts=1 | stream.STREAM_FLAG, total=1 << 20, payload=struct.pack("<Q", 1 << 20))
        rogue.write_frame(CLIENT_UPDATE, forged)
        deadline = time.monotonic() + 5
        while b.stats["forged_frames"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b.stats["forged_frames"] == 1 and not b._parked
        t = time.monotonic()
        send_until_streamed(a, b, os.urandom(1 << 20))
        assert time.monotonic() - t < stream.STALL_S
    finally:
        rogue.close()
        a.close()
        b.close()


def test_bytes_that_never_come_are_given_up_and_the_sender_goes_on(monkeypatch):
    """Unsealed: a reference whose bytes never come (its sender died after writing it) holds the
    sender's later frames on that topic until the stream has been silent STALL_S; then it is
    counted as lost and they go on."""
    monkeypatch.setattr(stream, "STALL_S", 0.5)
    domain = new_domain()
    a, b = pair(domain)
    try:
        send_until_streamed(a, b, os.urandom(1 << 20))
        ref = stream.reference(None, CLIENT_UPDATE, a.node, "", CLIENT_UPDATE, 2**62, 0, 1, 1 << 20, 1 << 20)
        a.write_frame(CLIENT_UPDATE, Frame(src=a.node, dst="", topic=CLIENT_UPDATE, msg_id=2**62, part=0,
                                           parts=1 | stream.STREAM_FLAG, total=1 << 20, payload=ref))
        deadline = time.monotonic() + 5
        while not b._parked and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b._parked
        a._msg_ids = iter(range(2**62 + 1, 2**63))   # the sender's next messages are newer
        data = os.urandom(1 << 20)
        a.send(CLIENT_UPDATE, data)
        m = b.recv([CLIENT_UPDATE], timeout_s=10)
        assert m is not None and bytes(m.data) == data
        assert b.stats["stream_lost"] == 1 and not b._parked
    finally:
        a.close()
        b.close()


SENDER = textwrap.dedent("""
    import os, sys
    from dtemu.real.transport import DdsTransport
    from dtemu.core.wire.topics import CLIENT_UPDATE
    t = DdsTransport(sys.argv[1], profile="lan", domain_id=int(sys.argv[2]), peers="127.0.0.1")
    assert t.wait_matched({CLIENT_UPDATE: [sys.argv[3]]}, timeout_s=10) == {}
    data = os.urandom(48 << 20)
    print("ready", flush=True)
    while True:
        t.send(CLIENT_UPDATE, data)
""")


def test_a_peer_killed_in_the_middle_of_a_transfer_leaves_the_receiver_whole():
    """A sender SIGKILLed while its 48 MB messages stream: the receiver's threads live, the message
    it was sending never completes (no partial delivery), and another sender's messages still
    arrive."""
    domain = new_domain()
    b = DdsTransport(f"b-{PID}", profile="lan", domain_id=domain, peers="127.0.0.1", subscribe=[CLIENT_UPDATE],
                     pending_timeout_s=2.0)
    c = DdsTransport(f"c-{PID}", profile="lan", domain_id=domain, peers="127.0.0.1")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SENDER, f"k-{PID}", str(domain), b.node], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        while b.stats["stream_recv_frames"] < 60 and time.monotonic() < deadline:   # inside the 2nd message
            got = b.recv([CLIENT_UPDATE], timeout_s=0.05)                           # (48 frames of 1 MiB)
            assert got is None or len(got.data) == 48 << 20
        assert b.stats["stream_recv_frames"] >= 60
        proc.kill()
        proc.wait(timeout=10)
        while b.recv([CLIENT_UPDATE], timeout_s=0.5) is not None:   # whatever was whole before the kill
            pass
        assert b._stream_in._thread.is_alive() and b._thread.is_alive()
        assert c.wait_matched({CLIENT_UPDATE: [b.node]}, timeout_s=10) == {}
        send_until_streamed(c, b, os.urandom(1 << 20))
        assert b.stats["errors"] == b.stats["stream_errors"] == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        c.close()
        b.close()


# --- one sender's order across destinations (real.stream_out) ------------------------------------

class SlowPeer:
    """A receiver that answers the handshake and acknowledges only when told: a slow link."""

    def __init__(self):
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.ident, self.keys = None, []

    def serve(self, timeout_s=5.0):
        """Answer a hello, and note the keys of the frames that came."""
        while self.sock.poll(int(timeout_s * 1000)):
            parts = self.sock.recv_multipart()
            self.ident = parts[0]
            if parts[1] == b"H":
                self.sock.send_multipart([parts[0], b"C", b"n" * 16])
            elif parts[1] == b"D":
                self.keys.append(parts[2])
            timeout_s = 0.05

    def ack(self, key):
        self.sock.send_multipart([self.ident, b"K", key])


def connected(out, dests, endpoints, slow):
    deadline = time.monotonic() + 10
    while not out.ready(dests, endpoints):
        slow.serve(0.05)
        assert time.monotonic() < deadline, "the handshake did not finish"


def timed_put(out, dest, key, frame, wait_s):
    started = time.monotonic()
    assert out.put([dest], key, frame, wait_s=wait_s)
    return time.monotonic() - started


def held_put(out, dest, key, frame, release):
    """A put that must still wait 0.3 s in, and go once ``release()`` acknowledged enough."""
    result = []
    sender = threading.Thread(target=lambda: result.append(out.put([dest], key, frame, wait_s=10)))
    sender.start()
    sender.join(0.3)
    assert sender.is_alive()
    release()
    sender.join(10)
    assert result == [True]


def test_a_sender_is_paced_by_what_its_peers_have_not_acknowledged(monkeypatch):
    """As DDS's writer: a destination takes the writer history unacknowledged and no more; a frame
    to another destination waits while a message of several frames to the first is unacknowledged
    (the sender's order), where single frames do not; an acknowledgement settles every frame before
    it; a peer that left, or has been silent for STALL_S, holds nobody up."""
    from dtemu.real import stream_out

    stats = dict.fromkeys(stream.STATS, 0)
    slow, fast = SlowPeer(), stream.StreamIn("fast", "127.0.0.1", None, 1 << 21, dict.fromkeys(stream.STATS, 0))
    out = stream_out.StreamOut("src", None, stats, window=2 << 20)
    endpoints = {"slow": slow.endpoint, "fast": fast.endpoint}
    frame = b"x" * (1 << 20)

    def key(dst, msg, part, parts):
        return stream.frame_key("t", dst, "t", msg, part, parts, parts << 20)

    k = [key("slow", 1, i, 4) for i in range(4)]   # a message of four frames to the slow peer
    try:
        connected(out, ["slow"], endpoints, slow)
        assert timed_put(out, "slow", k[0], frame, 5) + timed_put(out, "slow", k[1], frame, 5) < 1.0
        assert timed_put(out, "slow", k[2], frame, 0.3) >= 0.3   # the history is full: goes after its wait
        assert stats["stream_window_timeouts"] == 1
        slow.serve()
        assert slow.keys == k[:3]
        held_put(out, "slow", k[3], frame, lambda: slow.ack(k[1]))   # settles k[0] and k[1] too

        deadline = time.monotonic() + 10
        while not out.ready(["fast"], endpoints):
            assert time.monotonic() < deadline
        assert timed_put(out, "fast", key("fast", 2, 0, 1), frame, 0.3) >= 0.3   # behind the slow peer's message
        assert stats["stream_window_timeouts"] == 2
        held_put(out, "fast", key("fast", 3, 0, 1), frame, lambda: slow.ack(k[3]))   # all of it came: it goes
        while fast.take("src", key("fast", 3, 0, 1)) is None:
            assert time.monotonic() < deadline, "the frame never came"
            time.sleep(0.01)

        single = [key("slow", 4, 0, 1), key("slow", 5, 0, 1)]   # single frames, unacknowledged,
        assert timed_put(out, "slow", single[0], frame, 5) + timed_put(out, "slow", single[1], frame, 5) < 1.0
        assert timed_put(out, "fast", key("fast", 6, 0, 1), frame, 5) < 1.0   # hold nobody up
        slow.ack(single[1])

        assert timed_put(out, "slow", key("slow", 7, 0, 2), frame, 5) < 1.0   # a large message again,
        assert out.ready(["fast"], {"fast": fast.endpoint})                  # and the slow peer leaves
        assert timed_put(out, "fast", key("fast", 8, 0, 1), frame, 5) < 1.0
        monkeypatch.setattr(stream_out, "STALL_S", 0.2)                      # back, but silent since
        assert out.ready(["slow", "fast"], endpoints)
        time.sleep(0.25)
        assert timed_put(out, "fast", key("fast", 9, 0, 1), frame, 5) < 1.0
        assert stats["stream_window_timeouts"] == 2
    finally:
        out.close(timeout_s=1)
        fast.close()
        slow.sock.close()
