"""real.transport over CycloneDDS, loopback profile only (nothing leaves 127.0.0.1).

Every test uses its own domain id (derived from the pid) and node names with the
pid in them, so concurrent test runs on the same machine do not talk to each
other.  All waits are bounded.
"""

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("cyclonedds")

from dtemu.host.rundir import RunDir, read_events  # noqa: E402
from helpers import new_domain  # noqa: E402
from dtemu.real.node import real_driver  # noqa: E402
from dtemu.core.wire.topics import CLIENT_UPDATE, COLL_FRAMES, MODEL_BLOB, SS_REPLY, TRAIN_CMD  # noqa: E402
from dtemu.real.reassembly import Message, RejectLimiter  # noqa: E402
from dtemu.real.transport import DdsTransport  # noqa: E402
from dtemu.real.wire import Frame, Hello, encode_frame  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PID = os.getpid()


@pytest.fixture
def domain():
    # 1..100; a different one for every test of this process (one allocator for all test files)
    return new_domain()


def name(s: str) -> str:
    return f"{s}-{PID}"


def recv_n(t: DdsTransport, n: int, topics=None, timeout_s: float = 10.0) -> list[Message]:
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < n:
        m = t.recv(topics, timeout_s=max(0.0, deadline - time.monotonic()))
        if m is None:
            break
        out.append(m)
    return out


def poll(cond, timeout_s: float = 5.0, step: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def test_small_and_large_messages_in_one_process(domain):
    a, b, c = name("a"), name("b"), name("c")
    with DdsTransport(a, domain_id=domain) as ta, \
            DdsTransport(b, domain_id=domain, subscribe=[TRAIN_CMD, MODEL_BLOB]) as tb, \
            DdsTransport(c, domain_id=domain, subscribe=[TRAIN_CMD]) as tc:
        assert ta.wait_matched({TRAIN_CMD: [b, c], MODEL_BLOB: [b]}, timeout_s=5) == {}
        big = os.urandom(5_000_000)
        assert ta.send(TRAIN_CMD, b"hello all")
        assert ta.send(TRAIN_CMD, b"only for b", to=b)
        assert ta.send(MODEL_BLOB, big, ack_timeout_s=5.0)
        assert ta.send(TRAIN_CMD, b"")  # empty message
        got_b = recv_n(tb, 4, timeout_s=10)
        assert [(m.topic, m.data[:20]) for m in got_b if m.topic == TRAIN_CMD] == \
               [(TRAIN_CMD, b"hello all"), (TRAIN_CMD, b"only for b"), (TRAIN_CMD, b"")]
        blob = [m for m in got_b if m.topic == MODEL_BLOB]
        assert len(blob) == 1 and blob[0].data == big and blob[0].src == a
        got_c = recv_n(tc, 2, timeout_s=5)
        assert [m.data for m in got_c] == [b"hello all", b""]
        assert tc.recv(timeout_s=0.2) is None  # the addressed one never reaches c
        assert tc.stats["not_for_me"] >= 1
        m = blob[0]
        assert 0 < m.sent_at <= m.received_at <= time.monotonic() and m.received_at - m.sent_at < 10
        assert m.tag == MODEL_BLOB and m.dst == ""
        for t in (ta, tb, tc):
            assert t.stats["malformed"] == 0 and t.stats["errors"] == 0


def test_own_frames_are_ignored_and_recv_needs_subscription(domain):
    a, b = name("a"), name("b")
    with DdsTransport(a, domain_id=domain, subscribe=[COLL_FRAMES]) as ta, \
            DdsTransport(b, domain_id=domain, subscribe=[COLL_FRAMES]) as tb:
        assert ta.wait_matched({COLL_FRAMES: [b]}, timeout_s=5) == {}
        ta.send(COLL_FRAMES, b"x" * 3000, tag="allreduce/3")
        m = tb.recv(COLL_FRAMES, timeout_s=5)
        assert m is not None and m.data == b"x" * 3000 and m.tag == "allreduce/3"
        assert ta.recv(COLL_FRAMES, timeout_s=0.2) is None
        # DDS does not even hand them back (IgnoreLocal): no copy is made to drop them
        assert ta.stats["own_frames"] == 0
        with pytest.raises(ValueError):
            ta.recv(TRAIN_CMD, timeout_s=0)


def test_interleaved_messages_from_two_senders(domain):
    """Small frames (1000 B) so that messages of two concurrent senders interleave."""
    r, s1, s2 = name("r"), name("s1"), name("s2")
    n_msgs = 6
    with DdsTransport(r, domain_id=domain, subscribe=[CLIENT_UPDATE]) as tr, \
            DdsTransport(s1, domain_id=domain, frame_bytes=1000) as t1, \
            DdsTransport(s2, domain_id=domain, frame_bytes=1000) as t2:
        assert tr.wait_matched({CLIENT_UPDATE: [s1, s2]}, timeout_s=5, role="writers") == {}
        assert t1.wait_matched({CLIENT_UPDATE: [r]}, timeout_s=5) == {}
        assert t2.wait_matched({CLIENT_UPDATE: [r]}, timeout_s=5) == {}
        payloads = {s: [os.urandom(20_000 + 777 * i) for i in range(n_msgs)] for s in (s1, s2)}

        def blast(t, s):
            for p in payloads[s]:
                t.send(CLIENT_UPDATE, p, to=r)

        ths = [threading.Thread(target=blast, args=(t, s)) for t, s in ((t1, s1), (t2, s2))]
        for th in ths:
            th.start()
        got = recv_n(tr, 2 * n_msgs, timeout_s=15)
        for th in ths:
            th.join(timeout=10)
        by_src = {s: [m.data for m in got if m.src == s] for s in (s1, s2)}
        assert by_src[s1] == payloads[s1]  # intact and in order per sender
        assert by_src[s2] == payloads[s2]
        assert tr.stats["malformed"] == 0 and tr.stats["incomplete_dropped"] == 0


def test_interleaved_frames_written_raw(domain):
    """Frames of two messages of two senders, written alternately, reassemble."""
    r, w = name("r"), name("w")
    with DdsTransport(r, domain_id=domain, subscribe=[COLL_FRAMES]) as tr, \
            DdsTransport(w, domain_id=domain) as tw:
        assert tw.wait_matched({COLL_FRAMES: [r]}, timeout_s=5) == {}
        msgs = {"x": (b"A" * 10 + b"B" * 10 + b"C" * 5, 7), "y": (b"1" * 10 + b"2" * 10 + b"3", 9)}
        for part in range(3):
            for src, (data, mid) in msgs.items():
                chunk = data[part * 10:(part + 1) * 10]
                tw.write_frame(COLL_FRAMES, Frame(src=src, dst="", topic=COLL_FRAMES, msg_id=mid, part=part,
                                                  parts=3, total=len(data), payload=chunk))
        got = {m.src: m.data for m in recv_n(tr, 2, timeout_s=5)}
        assert got == {"x": msgs["x"][0], "y": msgs["y"][0]}


def test_late_joiner_gets_latest_model_blob_only(domain):
    srv, late = name("srv"), name("late")
    with DdsTransport(srv, domain_id=domain, frame_bytes=100_000) as ts:
        v1 = os.urandom(250_000)  # 3 frames
        v2 = os.urandom(150_000)  # 2 frames: part 2 of v1 stays in the writer's history
        ts.send(MODEL_BLOB, v1)
        ts.send(MODEL_BLOB, v2)
        with DdsTransport(late, domain_id=domain, subscribe=[MODEL_BLOB]) as tl:
            m = tl.recv(MODEL_BLOB, timeout_s=10)
            assert m is not None and m.src == srv and m.data == v2
            assert tl.recv(MODEL_BLOB, timeout_s=0.3) is None  # not v1
            assert tl.stats["orphan_frames"] >= 1  # v1's part 2, dropped
            v3 = os.urandom(10)
            ts.send(MODEL_BLOB, v3)  # and live updates keep coming
            m = tl.recv(MODEL_BLOB, timeout_s=5)
            assert m is not None and m.data == v3
        # a volatile topic delivers nothing sent before the subscription
        ts.send(TRAIN_CMD, b"early")
        with DdsTransport(late, domain_id=domain, subscribe=[TRAIN_CMD]) as tl2:
            assert ts.wait_matched({TRAIN_CMD: [late]}, timeout_s=5) == {}
            assert tl2.recv(TRAIN_CMD, timeout_s=0.3) is None


def test_malformed_frames_are_counted_and_do_not_stop_delivery(domain):
    r, w = name("r"), name("w")
    with DdsTransport(r, domain_id=domain, subscribe=[TRAIN_CMD], max_message_bytes=1_000_000,
                      max_pending_messages=4) as tr, \
            DdsTransport(w, domain_id=domain) as tw:
        assert tw.wait_matched({TRAIN_CMD: [r]}, timeout_s=5) == {}
        F = lambda **kw: Frame(**{"src": "evil", "dst": "", "topic": TRAIN_CMD, "msg_id": 1, "part": 0,  # noqa: E731
                                  "parts": 1, "total": 3, "payload": b"abc", **kw})
        bad = [
            F(parts=0),                                   # no parts
            F(part=2, parts=2, msg_id=2),                 # part >= parts
            F(total=10**12, parts=2, msg_id=3),           # total above max_message_bytes
            F(total=5, msg_id=4),                         # single frame, size != total
            F(total=2, msg_id=5),                         # payload longer than total
            F(src="", msg_id=6),                          # no sender
            F(total=4, parts=5, payload=b"a", msg_id=7),  # more parts than bytes
        ]
        for f in bad:
            tw.write_frame(TRAIN_CMD, f)
        # a continuation that contradicts its first frame
        tw.write_frame(TRAIN_CMD, F(msg_id=8, parts=2, total=6, payload=b"abc"))
        tw.write_frame(TRAIN_CMD, F(msg_id=8, part=1, parts=2, total=7, payload=b"defg"))
        # incomplete messages beyond max_pending_messages are evicted
        for i in range(10):
            tw.write_frame(TRAIN_CMD, F(src=f"half{i}", msg_id=100 + i, parts=2, total=6, payload=b"abc"))
        tw.send(TRAIN_CMD, b"still alive")
        m = tr.recv(TRAIN_CMD, timeout_s=5)
        assert m is not None and m.data == b"still alive" and m.src == w
        assert poll(lambda: tr.stats["malformed"] >= len(bad) + 1, 2), tr.stats
        assert tr.stats["errors"] == 0
        assert len(tr._pending) <= 4 and tr.stats["incomplete_dropped"] >= 6
        assert tr._thread.is_alive()
        # and messages keep flowing
        tw.send(TRAIN_CMD, os.urandom(300_000))
        m = tr.recv(TRAIN_CMD, timeout_s=5)
        assert m is not None and len(m.data) == 300_000


def test_presence_and_matching_report_missing_peers(domain):
    srv, c1, c2 = name("srv"), name("c1"), name("c2")
    with DdsTransport(srv, domain_id=domain, subscribe=[CLIENT_UPDATE]) as ts:
        with DdsTransport(c1, domain_id=domain, subscribe=[TRAIN_CMD]) as t1:
            t0 = time.monotonic()
            assert ts.wait_peers([c1, c2], timeout_s=0.5) == [c2]
            assert time.monotonic() - t0 < 3
            assert ts.wait_matched({TRAIN_CMD: [c1, c2]}, timeout_s=0.5) == {TRAIN_CMD: [c2]}
            assert ts.wait_matched({TRAIN_CMD: 2}, timeout_s=0.3) == {TRAIN_CMD: 1}
            assert ts.wait_matched([c1], topics=[TRAIN_CMD], timeout_s=2) == {}
            assert ts.wait_matched([c1], topics=[CLIENT_UPDATE], role="writers", timeout_s=2) == {}
            with DdsTransport(c2, domain_id=domain, subscribe=[TRAIN_CMD]):
                assert ts.wait_peers([c1, c2], timeout_s=5) == []
                assert ts.wait_matched({TRAIN_CMD: [c1, c2]}, timeout_s=5) == {}
                mp = ts.matched_peers([TRAIN_CMD, CLIENT_UPDATE])
                assert mp[TRAIN_CMD]["readers"] == sorted([c1, c2])
                assert sorted(mp[CLIENT_UPDATE]["writers"]) == sorted([c1, c2])
                assert set(ts.peers()) >= {c1, c2} and srv not in ts.peers()
            # a node that closes disappears
            assert poll(lambda: c2 not in ts.peers(), 5)
            assert ts.wait_matched({TRAIN_CMD: [c1, c2]}, timeout_s=0.2) == {TRAIN_CMD: [c2]}
            assert t1.peers().get(srv) == ts.guid


CHILD = textwrap.dedent("""
    import sys, time
    from dtemu.real.transport import DdsTransport
    from dtemu.core.wire.topics import TRAIN_CMD, CLIENT_UPDATE, MODEL_BLOB
    dom, me, peer = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    end = time.monotonic() + 60
    with DdsTransport(me, domain_id=dom, subscribe=[TRAIN_CMD, MODEL_BLOB]) as t:
        n = 0
        while n < 3 and time.monotonic() < end:
            m = t.recv(timeout_s=1.0)
            if m is None:
                continue
            n += 1
            # echo reversed, so a wrong echo cannot pass by accident
            t.send(CLIENT_UPDATE, m.data[::-1], to=m.src)
        t.send(CLIENT_UPDATE, b"bye", to=peer, ack_timeout_s=10)
""")


def test_two_processes_exchange_small_and_large(domain):
    me, child = name("parent"), name("child")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(domain), child, me], cwd=ROOT, env=env)
    try:
        with DdsTransport(me, domain_id=domain, subscribe=[CLIENT_UPDATE]) as t:
            assert t.wait_peers([child], timeout_s=20) == []
            assert t.wait_matched({TRAIN_CMD: [child], MODEL_BLOB: [child]}, timeout_s=20) == {}
            assert t.wait_matched({CLIENT_UPDATE: [child]}, timeout_s=20, role="writers") == {}
            small, big = b"ping-123", os.urandom(5_000_000)
            t.send(TRAIN_CMD, small, to=child)
            t.send(MODEL_BLOB, big)
            t.send(TRAIN_CMD, b"x" * 1_500_000, to=child)
            got = recv_n(t, 4, [CLIENT_UPDATE], timeout_s=30)
            # per topic in order; across topics (model_blob vs train_cmd in the child) no order
            assert len(got) == 4 and got[-1].data == b"bye"
            assert sorted(m.data for m in got[:3]) == sorted([small[::-1], big[::-1], b"x" * 1_500_000])
            assert all(m.src == child for m in got)
            assert t.stats["malformed"] == 0 and t.stats["errors"] == 0
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def assert_close_unblocks_recv(t, topic, settle_s: float) -> None:
    """A recv blocked on ``topic`` returns None within 5 s of ``t.close()``."""
    got = []
    th = threading.Thread(target=lambda: got.append(t.recv(topic, timeout_s=30)))
    th.start()
    time.sleep(settle_s)
    t0 = time.monotonic()
    t.close()
    th.join(timeout=5)
    assert not th.is_alive() and got == [None] and time.monotonic() - t0 < 5


def test_close_unblocks_recv_and_is_idempotent(domain):
    t = DdsTransport(name("solo"), domain_id=domain, subscribe=[TRAIN_CMD])
    assert_close_unblocks_recv(t, TRAIN_CMD, 0.05)
    t.close()
    with pytest.raises(RuntimeError):
        t.send(TRAIN_CMD, b"x")
    # the domain can be opened again afterwards
    with DdsTransport(name("again"), domain_id=domain) as t2:
        assert t2.peers() == {}


def test_send_accepts_buffers_like_numpy_arrays(domain):
    np = pytest.importorskip("numpy")
    a, b = name("a"), name("b")
    w = np.arange(300_000, dtype=np.float32).reshape(1000, 300)  # 1.2 MB, 2-D
    with DdsTransport(a, domain_id=domain, frame_bytes=500_000) as ta, \
            DdsTransport(b, domain_id=domain, subscribe=[CLIENT_UPDATE]) as tb:
        assert ta.wait_matched({CLIENT_UPDATE: [b]}, timeout_s=5) == {}
        ta.send(CLIENT_UPDATE, w)
        ta.send(CLIENT_UPDATE, bytearray(b"ba"))
        m = tb.recv(CLIENT_UPDATE, timeout_s=5)
        assert m is not None and np.array_equal(np.frombuffer(m.data, dtype=np.float32).reshape(1000, 300), w)
        assert tb.recv(CLIENT_UPDATE, timeout_s=5).data == b"ba"
        ta.max_message_bytes = 10
        with pytest.raises(ValueError):
            ta.send(CLIENT_UPDATE, b"x" * 11)


def test_config_profiles():
    from dtemu.real.config import config_xml
    lo = config_xml("loopback")
    assert '<NetworkInterface address="127.0.0.1"/>' in lo and '<Peer address="127.0.0.1"/>' in lo
    assert "<AllowMulticast>false</AllowMulticast>" in lo and "${" not in lo
    with pytest.raises(ValueError):
        config_xml("loopback", peers=["10.1.2.3"])
    lan = config_xml("lan", peers="10.1.2.3, hostb")
    assert '<Peer address="10.1.2.3"/>' in lan and '<Peer address="hostb"/>' in lan and "${" not in lan
    with pytest.raises(ValueError):
        config_xml("lan", peers=['a"><x'])
    with pytest.raises(ValueError):
        config_xml("nope")


def test_writer_history_holds_a_whole_gradient_for_ddp_only(monkeypatch):
    """DDP ranks all send at once: a history shorter than a gradient makes writers wait for
    acks queued behind the readers' own gradients (docs/netns.md); others keep 2 MiB."""
    from dtemu.host.writer_history import DEFAULT_WHC_HIGH, whc_high_bytes, writer_history
    from dtemu.real.config import config_xml
    monkeypatch.delenv("DTEMU_DDS_WHC_HIGH", raising=False)
    assert writer_history(False, 10_000_000) == writer_history(False, 1) == writer_history(False, 5) == DEFAULT_WHC_HIGH
    assert writer_history(True, 1_199_882) == "8MiB"          # the 1.2M CNN: 4.8 MB of fp32
    assert writer_history(True, 18_000) == "2MiB"             # never below the default
    assert writer_history(True, 2 * 1024**2) == "8MiB"        # exactly 8 MiB of fp32 fits
    assert writer_history(True, 2 * 1024**2 + 1) == "16MiB"
    assert whc_high_bytes(writer_history(True, 1_199_882)) >= 4 * 1_199_882
    assert "<WhcHigh>8MiB</WhcHigh>" in config_xml("loopback", whc_high=writer_history(True, 1_199_882))
    monkeypatch.setenv("DTEMU_DDS_WHC_HIGH", "4MiB")  # the user's override wins in every mode
    assert writer_history(True, 1_199_882) == writer_history(False, 1) == "4MiB"


# ------------------------------------------------------------------ rejected frames become events

def bad_utf8_frame(msg_id: int) -> bytes:
    """A serialized Frame CycloneDDS accepts (well-formed CDR) but real.wire refuses (bad UTF-8)."""
    good = encode_frame(Frame(src="evil", topic=TRAIN_CMD, msg_id=msg_id, total=3, payload=b"abc"))
    return good.replace(b"evil", b"ev\xffl", 1)


def test_garbage_frames_are_counted_as_rate_limited_events(domain, tmp_path):
    r, w = name("r"), name("w")
    run = RunDir(tmp_path / "run")
    with DdsTransport(r, domain_id=domain, subscribe=[TRAIN_CMD], max_message_bytes=1_000_000) as tr, \
            DdsTransport(w, domain_id=domain) as tw:
        node = real_driver(r, tr, run)
        limiter = tr.on_reject
        assert isinstance(limiter, RejectLimiter)
        limiter.window_s = 60.0  # one window for the whole test: the cap does not depend on timing
        assert tw.wait_matched({TRAIN_CMD: [r]}, timeout_s=5) == {}
        raw = tw._writer(TRAIN_CMD)
        F = lambda **kw: Frame(**{"src": "evil", "dst": "", "topic": TRAIN_CMD, "msg_id": 1, "part": 0,  # noqa: E731
                                  "parts": 1, "total": 3, "payload": b"abc", **kw})
        for i in range(15):
            tw._write(raw, bad_utf8_frame(i))                          # WireError in the receive thread
            tw.write_frame(TRAIN_CMD, F(parts=0, msg_id=100 + i))      # no parts
            tw.write_frame(TRAIN_CMD, F(total=10**12, parts=2, msg_id=200 + i))  # above max_message_bytes
        tw.write_frame(TRAIN_CMD, F(part=1, parts=2, total=6, msg_id=300))      # orphan: no part 0
        tw.write_frame(TRAIN_CMD, F(src="half", parts=2, total=6, msg_id=400))  # half a message ...
        tw.write_frame(TRAIN_CMD, F(src="half", msg_id=401))                    # ... its sender moved on
        tw.send(TRAIN_CMD, b"still alive")
        got = {m.src: m.data for m in recv_n(tr, 2, timeout_s=5)}
        assert got == {w: b"still alive", "half": b"abc"}  # the "half" sender's second message is whole
        assert poll(lambda: tr.stats["malformed"] >= 45, 5), tr.stats
        assert tr.stats["orphan_frames"] == 1 and tr.stats["incomplete_dropped"] == 1
        assert tr.stats["errors"] == 0 and tr._thread.is_alive()
        node.emit("done")
    # close() flushed the limiter: the suppressed rejects are in a summary
    run.close()
    events = read_events(tmp_path / "run")
    rejected = [e for e in events if e["kind"] == "frame_rejected"]
    by_reason = {k: [e for e in rejected if e["reason"] == k] for k in ("malformed", "orphan", "incomplete_dropped")}
    assert len(by_reason["malformed"]) == 5  # the cap per reason and window
    assert len(by_reason["orphan"]) == 1 and len(by_reason["incomplete_dropped"]) == 1
    assert all(e["layer"] == "transport" and e["node"] == r and e["detail"] for e in rejected)
    assert any("utf-8" in e["detail"] for e in by_reason["malformed"])
    summaries = [e for e in events if e["kind"] == "frame_rejected_summary"]
    assert sum(e["suppressed"] for e in summaries if e["reason"] == "malformed") == 45 - 5
    assert max(e["total"] for e in summaries) == 45


def test_reject_limiter_windows_and_summaries():
    now = [0.0]
    got = []
    lim = RejectLimiter(lambda kind, **f: got.append((kind, f)), per_window=3, window_s=1.0, clock=lambda: now[0])
    for _ in range(10):
        lim("malformed", "x")
    lim("orphan", "y")
    assert [g[0] for g in got] == ["frame_rejected"] * 4
    lim.flush(final=False)  # the periodic check: the window is still open, nothing to report yet
    assert len(got) == 4
    lim.flush()  # closing: everything held back is reported
    assert got[-1] == ("frame_rejected_summary",
                       {"layer": "transport", "reason": "malformed", "suppressed": 7, "total": 10})
    lim.flush()  # nothing new to report
    assert len(got) == 5
    now[0] = 1.5  # next window: three more events, the extra one reported when the window after starts
    for _ in range(4):
        lim("malformed", "z")
    now[0] = 3.0
    lim("malformed", "z")
    kinds = [g[0] for g in got[5:]]
    assert kinds == ["frame_rejected"] * 3 + ["frame_rejected_summary", "frame_rejected"]
    assert got[8][1]["suppressed"] == 1 and got[8][1]["total"] == 14


def test_a_failing_reject_callback_does_not_stop_the_receiver(domain):
    r, w = name("r"), name("w")

    def boom(kind, detail):
        raise RuntimeError("callback bug")

    with DdsTransport(r, domain_id=domain, subscribe=[TRAIN_CMD], on_reject=boom) as tr, \
            DdsTransport(w, domain_id=domain) as tw:
        assert tw.wait_matched({TRAIN_CMD: [r]}, timeout_s=5) == {}
        tw.write_frame(TRAIN_CMD, Frame(src="evil", topic=TRAIN_CMD, msg_id=1, parts=0, total=3, payload=b"abc"))
        tw.send(TRAIN_CMD, b"ok")
        m = tr.recv(TRAIN_CMD, timeout_s=5)
        assert m is not None and m.data == b"ok"
        assert poll(lambda: tr.stats["errors"] == 1, 2) and tr.stats["malformed"] == 1
        assert "callback bug" in tr.last_error and tr._thread.is_alive()


def test_a_presence_sample_that_does_not_decode_is_skipped_and_counted(domain):
    """Anyone on the domain can publish on ctl/hello: a name that is not UTF-8 (or not a name)
    must not raise inside peers() / matched_peers(), where every honest peer's sample is read too."""


    a, b = name("a"), name("b")
    with DdsTransport(a, domain_id=domain, subscribe=[TRAIN_CMD]) as ta, DdsTransport(b, domain_id=domain) as tb:
        for guid, bad in (("g1", b"ev\xffl"), ("g2", b"e\x07il")):  # bad UTF-8; not printable
            good = Hello(node="evil", guid=guid, pid=1, host="h").serialize()
            tb._write(tb._hello_writer, good.replace(b"evil", bad, 1))
        assert ta.wait_peers([b], timeout_s=5) == []
        assert poll(lambda: ta.peers().get(b) is not None and ta.stats.get("invalid_hello", 0) == 2, 5), ta.stats
        assert set(ta.peers()) >= {b} and "evil" not in ta.peers()
        assert tb.wait_matched({TRAIN_CMD: [a]}, timeout_s=5) == {}
        assert a in tb.matched_peers([TRAIN_CMD])[TRAIN_CMD]["readers"]


def test_presence_cannot_be_taken_over_and_is_authenticated_in_a_sealed_run(domain):
    """Hello is keyed on the participant, so claiming a node's name adds a participant rather
    than replacing the node's own announcement; with a key, an announcement without a valid
    tag does not count at all."""
    key = bytes(range(32))
    a, b, rogue = name("a"), name("b"), name("rogue")
    with DdsTransport(a, domain_id=domain, key=key) as ta, DdsTransport(b, domain_id=domain, key=key) as tb, \
            DdsTransport(rogue, domain_id=domain) as tr:
        tr._hello_writer.write(Hello(node=b, guid="rogue-guid"))  # its own Hello is the other one
        assert ta.wait_peers([b], timeout_s=5) == []
        assert poll(lambda: ta.stats.get("invalid_hello", 0) == 2, 5), ta.stats  # the rogue's two Hellos
        assert ta.peers() == {b: tb.guid} and ta.participants() == {tb.guid: b}


@pytest.mark.parametrize("sealed", [False, True])
def test_addressed_collective_frames_reach_only_their_addressee(domain, sealed):
    """coll/frames to=X travel on X's own DDS topic once matched: the third node never sees them."""
    a, b, c = name("a"), name("b"), name("c")
    key = b"k" * 32 if sealed else None
    with DdsTransport(a, domain_id=domain, subscribe=[COLL_FRAMES], key=key) as ta, \
            DdsTransport(b, domain_id=domain, subscribe=[COLL_FRAMES], key=key) as tb, \
            DdsTransport(c, domain_id=domain, subscribe=[COLL_FRAMES], key=key) as tc:
        assert ta.wait_peers([b, c], timeout_s=10) == []
        assert ta.wait_matched({COLL_FRAMES: [b, c]}, timeout_s=10) == {}
        big = os.urandom(3_000_000)
        ta.send(COLL_FRAMES, big, to=b)
        ta.send(COLL_FRAMES, b"to everyone")
        got_b = recv_n(tb, 2, [COLL_FRAMES])
        # (two DDS topics: the addressed message and the broadcast may come in either order)
        assert sorted((m.topic, m.src, m.dst, m.data) for m in got_b) == sorted([
            (COLL_FRAMES, a, b, big), (COLL_FRAMES, a, "", b"to everyone")])
        got_c = recv_n(tc, 1, [COLL_FRAMES])
        assert [m.data for m in got_c] == [b"to everyone"]
        assert tc.recv([COLL_FRAMES], timeout_s=0.3) is None
        # c never received b's frames at all (before, DDS shipped them to c, which dropped them)
        assert tc.stats["not_for_me"] == 0 and tc.stats["recv_frames"] == 1
        assert tb.stats["forged_frames"] == tb.stats["malformed"] == 0
        # a send to a node whose reader never matched falls back to the shared topic
        ta.send(COLL_FRAMES, b"for nobody", to=name("ghost"))
        assert poll(lambda: tc.stats["not_for_me"] == 1, 5)


def test_a_model_sent_to_one_client_reaches_only_it_and_late_joiners_still_get_the_broadcast(domain):
    """train/model_blob to=X (FedAsync's model to the client it asks) travels on X's own topic, without
    durability; the shared, durable topic keeps the latest broadcast for a client that joins late."""
    a, b, c, d = name("a"), name("b"), name("c"), name("d")
    with DdsTransport(a, domain_id=domain) as ta, \
            DdsTransport(b, domain_id=domain, subscribe=[MODEL_BLOB]) as tb, \
            DdsTransport(c, domain_id=domain, subscribe=[MODEL_BLOB]) as tc:
        assert ta.wait_matched({MODEL_BLOB: [b, c]}, timeout_s=10) == {}
        ta.send(MODEL_BLOB, b"the broadcast", ack_timeout_s=5.0)
        big = os.urandom(2_000_000)
        ta.send(MODEL_BLOB, big, to=b)
        got_b = recv_n(tb, 2, [MODEL_BLOB])
        assert sorted(m.data[:13] for m in got_b) == sorted([b"the broadcast", big[:13]])
        assert [m.data for m in recv_n(tc, 1, [MODEL_BLOB])] == [b"the broadcast"]
        assert tc.recv([MODEL_BLOB], timeout_s=0.3) is None
        assert tc.stats["not_for_me"] == 0 and tc.stats["recv_frames"] == 1   # c never carried b's model
        with DdsTransport(d, domain_id=domain, subscribe=[MODEL_BLOB]) as td:
            assert [m.data for m in recv_n(td, 1, [MODEL_BLOB], timeout_s=10)] == [b"the broadcast"]
            assert td.recv([MODEL_BLOB], timeout_s=0.3) is None


@pytest.mark.parametrize("sealed", [False, True])
def test_a_caller_takes_its_answers_itself_with_the_same_guarantees(domain, sealed):
    """ps/state_reply (CALLER_TAKES): the thread in recv takes the samples itself, not the receive
    thread; bad input is still counted and dropped, what nobody asks for is still taken (the
    receive thread's tick), a message the receive thread queues on another wanted topic wakes
    the caller, and close() unblocks it."""
    r, w = name("r"), name("w")
    key = b"k" * 32 if sealed else None
    with DdsTransport(r, domain_id=domain, subscribe=[SS_REPLY, TRAIN_CMD], key=key) as tr, \
            DdsTransport(w, domain_id=domain, key=key) as tw:
        assert tw.wait_matched({SS_REPLY: [r], TRAIN_CMD: [r]}, timeout_s=10) == {}
        assert [t for t, _ in tr._caller_readers] == [SS_REPLY, DdsTransport.addressed_topic(SS_REPLY, r)]
        # bad input on the caller's topic: counted (malformed, or forged in a sealed run), dropped
        tw.write_frame(SS_REPLY, Frame(src="evil", topic=SS_REPLY, msg_id=1, parts=0, total=3, payload=b"abc"))
        tw.send(SS_REPLY, b"answer", to=r)
        m = tr.recv([SS_REPLY], timeout_s=5)
        assert m is not None and (m.src, m.dst, m.data, m.topic) == (w, r, b"answer", SS_REPLY)
        assert tr.stats["forged_frames" if sealed else "malformed"] == 1 and tr.stats["errors"] == 0
        # an answer nobody waits for does not stay in DDS: the receive thread takes it within its tick
        tw.send(SS_REPLY, b"unasked", to=r)
        assert poll(lambda: tr.pending_count() == 1, 3)
        assert tr.recv(SS_REPLY, timeout_s=0).data == b"unasked"
        # a recv that does not wait still takes what the reader holds (the tick has not come yet)
        with tr._caller_lock:  # (holding it keeps the receive thread's tick away)
            tw.send(SS_REPLY, b"held", to=r)
            assert tw.flush(timeout_s=5)
        assert tr.recv(SS_REPLY, timeout_s=0).data == b"held"
        # waiting on both: a message of the receive thread's topics wakes the caller at once
        got = []
        th = threading.Thread(target=lambda: got.append(tr.recv([SS_REPLY, TRAIN_CMD], timeout_s=10)))
        th.start()
        time.sleep(0.1)
        t0 = time.monotonic()
        tw.send(TRAIN_CMD, b"cmd", to=r)
        th.join(timeout=10)
        assert got and got[0].data == b"cmd" and time.monotonic() - t0 < 0.5
        # two callers at once: each gets one answer
        got = []
        ths = [threading.Thread(target=lambda: got.append(tr.recv(SS_REPLY, timeout_s=10))) for _ in range(2)]
        for th in ths:
            th.start()
        tw.send(SS_REPLY, b"one", to=r)
        tw.send(SS_REPLY, b"two", to=r)
        for th in ths:
            th.join(timeout=15)
        assert sorted(m.data for m in got if m is not None) == [b"one", b"two"]
        # close() unblocks a caller that is taking
        assert_close_unblocks_recv(tr, SS_REPLY, 0.1)
        assert tr.stats["errors"] == 0


def test_pipelined_allreduce_over_dds_is_the_same_on_every_rank(domain, tmp_path):
    """Three ranks (threads of this process) over DDS: addressed pieces, the float32 rank-order mean."""
    import numpy as np

    from dtemu.core.ddp.collectives import Collective, mean32_in_rank_order
    from dtemu.core.runtime.driver import run_blocking

    names = [name(f"w{r}") for r in range(3)]
    vecs = [np.random.default_rng(r).standard_normal(300_001).astype(np.float32) for r in range(3)]
    results, errors = {}, []

    def role(ctx, rank):
        coll = Collective(ctx, rank, names, piece_bytes=100_000)
        yield from coll.barrier(ctx.now() + 20)
        for step in (1, 2):
            mean, _ = yield from coll.allreduce_mean(step, vecs[rank] * step, ctx.now() + 20, "pipelined")
            results[(rank, step)] = mean
        yield from coll.allgather(3, "bye", b"", ctx.now() + 20)  # nobody leaves while its frames are needed
        return dict(coll.counts)

    def rank_thread(rank, transport):
        run = RunDir(tmp_path / f"r{rank}")
        try:
            node = real_driver(names[rank], transport, run, publishes=[COLL_FRAMES])
            results[rank] = run_blocking(node.run(role(node, rank)))
        except Exception as exc:  # surfaced by the assertion below
            errors.append(repr(exc))
        finally:
            run.close()

    ts = [DdsTransport(n, domain_id=domain, subscribe=[COLL_FRAMES]) for n in names]
    try:
        ths = [threading.Thread(target=rank_thread, args=(r, t)) for r, t in enumerate(ts)]
        for th in ths:
            th.start()
        for th in ths:
            th.join(timeout=60)
        assert not errors
        for step in (1, 2):
            expected = mean32_in_rank_order([v * step for v in vecs])
            assert all(results[(r, step)].tobytes() == expected.tobytes() for r in range(3))
        assert all(results[r] == {"malformed": 0, "stale": 0} for r in range(3))
        assert all(t.stats["not_for_me"] == 0 for t in ts)  # addressed pieces went to their owner only
    finally:
        for t in ts:
            t.close()


def test_launch_domains_keep_their_ports_below_the_ephemeral_range():
    """CycloneDDS's ports for domain d are 7400 + 250 d (+ 10 + 2 i for participant i); Linux hands
    out 32768-60999 to any socket, so a domain there may find its port taken and fail to start."""
    from dtemu.real.launch import MAX_DOMAIN, _domain_id

    assert 7400 + 250 * MAX_DOMAIN + 10 + 2 * 64 < 32768 and 1 <= _domain_id() <= MAX_DOMAIN
    assert all(1 <= new_domain() <= MAX_DOMAIN for _ in range(3))
