"""Emu's model of real mode's transport on the wire (emu/wire_model.py): header bytes, the
writer's history (a send returns early, later sends queue behind its tail), and a receiver's
decoding time.  Virtual times are exact."""

import re
from pathlib import Path

import pytest
import simpy

from dtemu.core.runtime.compute import ComputeTimer
from dtemu.core.runtime.compute_spec import ComputeSpec
from dtemu.emu import wire_model
from dtemu.emu.network import Link, Network
from dtemu.emu.world import EmuNode, World

ROOT = Path(__file__).resolve().parent.parent
MB = 1_000_000
MIB = 1 << 20


def approx(x):
    return pytest.approx(x, rel=1e-9, abs=1e-9)


def _net(framing="payload", window=0, mbps=8.0, latency_s=0.0, nodes=("a", "b", "c")):
    env = simpy.Environment()
    links = {n: Link(mbps * 1e6, mbps * 1e6, latency_s) for n in nodes}
    return env, Network(env, links, framing=framing, send_window=window)


def _send(env, net, t, src, dst, nbytes, log, name):
    def proc():
        yield env.timeout(t)
        yield net.send(src, dst, nbytes, lambda: log.setdefault(name + ".delivered", env.now))
        log[name + ".returned"] = env.now
    env.process(proc())


def test_rtps_framing_of_one_megabyte_by_hand():
    # One frame (1e6 + 72 bytes of CDR): 15 fragments of 64000 and one of 40072; a full
    # fragment is a datagram of 8 + 84 + 64000 bytes in 44 IPv4 packets of 34 header bytes.
    full = (8 + 84 + 64000) + 44 * 34
    last = (8 + 84 + 40072) + 28 * 34
    assert wire_model.wire_bytes(MB, 1500) == 15 * full + last
    assert wire_model.wire_bytes(MB, 1500, "payload") == MB
    # About 2.5% at a 1500-byte MTU; more with a smaller one.
    assert 1.024 < wire_model.wire_bytes(10 * MB, 1500) / (10 * MB) < 1.026
    assert wire_model.wire_bytes(10 * MB, 576) > wire_model.wire_bytes(10 * MB, 1500)
    assert wire_model.wire_bytes(0, 1500) > 0  # an empty message is a frame with its headers


def test_constants_match_real_mode():
    from dtemu.real.reassembly import FRAME_BYTES

    assert wire_model.FRAME_BYTES == FRAME_BYTES
    for profile in ("lan", "loopback"):
        xml = (ROOT / "real" / "config" / f"{profile}.xml").read_text()
        assert int(re.search(r"<FragmentSize>(\d+)B</FragmentSize>", xml).group(1)) == wire_model.FRAGMENT_BYTES


def test_stream_framing_by_hand():
    # A 3 MiB message on the stream (real.stream): three frames of 1 MiB, each its bytes and zmq's
    # envelope in TCP segments of 1448 bytes (MTU 1500 less IPv4 20, TCP 20 and timestamps 12),
    # 66 header bytes each, and a DDS reference (a sample of 72 + 8 bytes).
    data = MIB + wire_model.STREAM_ENVELOPE_BYTES
    segments = -(-data // 1448)
    ref = (8 + 84 + 80) + 34
    assert wire_model.wire_bytes(3 * MIB, 1500, "stream") == 3 * (data + 66 * segments + ref)
    # About 4.6% at 1500 (the testbed's controller link: 4.47%), under 1% with jumbo frames.
    assert 1.045 < wire_model.wire_bytes(44 * MB, 1500, "stream") / (44 * MB) < 1.047
    assert wire_model.wire_bytes(44 * MB, 9000, "stream") / (44 * MB) < 1.01
    # Under 64 KiB a message stays in DDS, as the transport sends it.
    assert wire_model.wire_bytes(1000, 1500, "stream") == wire_model.wire_bytes(1000, 1500, "rtps")


def test_stream_constants_match_real_mode():
    from dtemu.host import stream_choice
    from dtemu.real import stream

    assert wire_model.STREAM_FRAME_BYTES == stream_choice.FRAME_BYTES == stream.FRAME_BYTES
    assert wire_model.STREAM_MIN_BYTES == stream_choice.MIN_BYTES == stream.MIN_BYTES
    key = stream.frame_key("train/client_update", "", "train/client_update", 2**50, 3, 9, 70 << 20)
    assert len(key) + 3 * 9 + 1 <= wire_model.STREAM_ENVELOPE_BYTES   # "D", the key, zmq's 3 frame heads


def test_emu_is_told_the_path_real_mode_takes(monkeypatch):
    from dtemu.emu.costs import transport_sets

    monkeypatch.delenv("DTEMU_DDS_STREAM", raising=False)
    assert "network.framing=rtps" in transport_sets({})
    monkeypatch.setenv("DTEMU_DDS_STREAM", "1")
    assert transport_sets({}, window=2 * MIB)[:2] == ["network.framing=stream", f"network.send_window_bytes={2 * MIB}"]


def test_on_the_stream_a_send_returns_with_its_window_to_go_but_a_broadcast_to_everyone_stays_in_dds():
    # 8 Mbit/s links, a 4 MB message, a writer history of 1 MiB: on the stream a destination takes
    # the window unacknowledged (real.stream_out), so the send returns once its last MiB is on the way.
    log = {}
    env, net = _net(framing="stream", window=MIB)
    _send(env, net, 0.0, "a", "b", 4 * MB, log, "m")
    env.run()
    assert log["m.delivered"] - log["m.returned"] == pytest.approx(log["m.delivered"] * MIB / (4 * MB), rel=0.02)
    assert net.stats["a"].wire_bytes_sent == wire_model.wire_bytes(4 * MB, 1500, "stream")
    inline = {}
    env, net = _net(framing="stream", window=MIB)

    def proc():
        yield net.send("a", "b", 2 * MB, lambda: inline.setdefault("delivered", env.now), inline=True)
        inline["returned"] = env.now
    env.process(proc())
    env.run()
    assert 0 < inline["returned"] < inline["delivered"]
    assert net.stats["a"].wire_bytes_sent == wire_model.wire_bytes(2 * MB, 1500, "rtps")


def test_framing_lengthens_the_flow_not_the_payload_counts():
    env, net = _net(framing="rtps")
    log = {}
    _send(env, net, 0, "a", "b", MB, log, "m")
    env.run()
    wire = wire_model.wire_bytes(MB, 1500)
    assert log["m.returned"] == approx(wire / 1e6)       # 8 Mbit/s = 1e6 bytes/s
    assert net.stats["a"].bytes_sent == MB and net.stats["b"].bytes_received == MB
    assert net.stats["a"].wire_bytes_sent == wire


def test_tail_is_the_last_history_group():
    window = 2 * MIB  # two 1 MiB frames (plus headers) exceed it: groups of two frames
    assert wire_model.frames_per_group(window) == 2
    assert wire_model.tail_bytes(4_800_000, window) == 4_800_000 - 4 * MIB   # frames 1-4 acked, 5 left
    assert wire_model.tail_bytes(4 * MIB, window) == 2 * MIB                  # frames 3 and 4 left
    assert wire_model.tail_bytes(MB, window) == MB                            # one frame: returns at once
    assert wire_model.tail_bytes(4_800_000, 0) == 0


def test_send_with_a_writer_history_returns_before_the_flow_ends():
    n = 4_800_000
    env, net = _net(window=2 * MIB)
    log = {}
    _send(env, net, 0, "a", "b", n, log, "model")
    env.run()
    assert log["model.returned"] == approx(4 * MIB / 1e6)   # the first two groups went through
    assert log["model.delivered"] == approx(n / 1e6)        # delivery is unchanged


def test_a_later_send_waits_behind_the_tail_in_the_senders_fifo():
    n = 4_800_000
    env, net = _net(window=2 * MIB)
    log = {}

    def controller():
        yield net.send("a", "b", n, lambda: log.setdefault("model", env.now))
        log["returned"] = env.now
        yield net.send("a", "b", 100, lambda: log.setdefault("cmd", env.now))

    env.process(controller())
    _send(env, net, 4.5, "c", "b", 100, log, "other")  # another sender is not behind a's queue
    env.run()
    assert log["returned"] == approx(4 * MIB / 1e6)
    # c's message is not behind a's queue: it shares b's downlink with the model's tail (max-min
    # fair, half the rate each), which it delays by its own 100 bytes.
    assert log["other.delivered"] == approx(4.5 + 200 / 1e6)
    # a's command starts when the model's bytes have left a's link (FIFO, at the link's rate: 4.8 s);
    # the model's last 100 bytes, held back at b's downlink by c's, then share it with the command.
    assert log["model"] == approx(n / 1e6 + 200 / 1e6)
    assert log["cmd"] == approx(n / 1e6 + 200 / 1e6)


def test_a_flow_slowed_at_its_receiver_does_not_hold_its_senders_next_message():
    """A ring or pipelined collective with a late member (a straggler): a's message to b shares b's
    downlink with c's, so it arrives at half a's rate; a's next message, to d, goes out once a's link
    has sent the first (1 s), not once b has it all (2 s).  On the testbed the rest waits in b's
    queue and a's link is free: emu held a's next send behind it, and a late member's few
    milliseconds grew to a tenth of a second of every DDP step (notebook entry 35).  Store and
    forward (emu.tandem): the first message's bytes left a's link by 1 s, so the second has all of
    it (notebook entry 36: a fluid over both links kept half of a's link for the first until 2 s)."""
    env, net = _net(window=2 * MIB, nodes=("a", "b", "c", "d"))
    log = {}

    def a():
        yield net.send("a", "b", MB, lambda: log.setdefault("ab", env.now))
        yield net.send("a", "d", MB, lambda: log.setdefault("ad", env.now))

    env.process(a())
    _send(env, net, 0, "c", "b", MB, log, "cb")
    env.run()
    assert log["ab"] == approx(2.0) and log["cb.delivered"] == approx(2.0)   # b's downlink halved
    # a -> d from 1 s at all of a's link: a -> b's second half waits at b's side, not on a's link
    assert log["ad"] == approx(2.0)


def test_one_message_to_two_receivers_shares_the_link_and_returns_once():
    n = 4_800_000
    env, net = _net(window=2 * MIB)
    log = {}

    def controller():
        model, cmd = object(), object()  # one message each, to both receivers
        yield env.all_of([net.send("a", d, n, lambda d=d: log.setdefault(d, env.now), batch=model)
                          for d in ("b", "c")])
        log["returned"] = env.now
        yield env.all_of([net.send("a", d, 100, lambda d=d: log.setdefault("cmd" + d, env.now), batch=cmd)
                          for d in ("b", "c")])

    env.process(controller())
    env.run()
    # Two flows at half the rate each: the groups before the tail took 2 x 4 MiB of the uplink.
    assert log["returned"] == approx(2 * 4 * MIB / 1e6)
    assert log["b"] == approx(2 * n / 1e6) and log["c"] == approx(2 * n / 1e6)
    assert log["cmdb"] == approx(2 * n / 1e6 + 200 / 1e6)
    assert log["cmdc"] == approx(2 * n / 1e6 + 200 / 1e6)


def test_a_failed_receiver_aborts_the_waiting_send_and_the_queue_goes_on():
    env, net = _net(window=2 * MIB)
    log = {}

    def controller():
        yield net.send("a", "b", 3 * MB, lambda: log.setdefault("first", env.now))
        r = yield net.send("a", "c", 100, lambda: log.setdefault("to_c", env.now))
        log["to_c_aborted"] = r.aborted
        yield net.send("a", "b", 100, lambda: log.setdefault("second", env.now))

    def fail_c():
        yield env.timeout(2.9)
        net.fail_node("c")

    env.process(controller())
    env.process(fail_c())
    env.run()
    assert log["to_c_aborted"] and "to_c" not in log
    assert log["first"] == approx(3.0)
    assert log["second"] == approx(3.0 + 100 / 1e6)


def test_defaults_keep_the_old_arithmetic():
    env, net = _net()
    log = {}
    _send(env, net, 0, "a", "b", 4_800_000, log, "m")
    env.run()
    assert log["m.returned"] == approx(4.8) and log["m.delivered"] == approx(4.8)


def test_receiving_costs_decode_time():
    env = simpy.Environment()
    net = Network(env, {n: Link(8e6, 8e6) for n in ("a", "b")})
    world = World(env, net, log=lambda e: None, save_checkpoint=lambda b: "")
    timer = ComputeTimer(ComputeSpec(train_s_per_sample=1e-3, decode_s_per_mb=0.05), None, seed=[0, 1])
    node = world.add(EmuNode(world, "b", 1, ("t",), make_role=None, timer=timer))
    node.up = True
    got = {}

    def receiver():
        msg = yield from node.recv(("t",), deadline=None)
        got["at"], got["len"] = env.now, len(msg.data)

    env.process(receiver())
    world.transmit("a", "b", "t", b"x" * 2_000_000)
    env.run()
    assert got["len"] == 2_000_000
    assert got["at"] == approx(2.0 + 2 * 0.05)   # 2 s on the wire, 0.1 s decoding


def test_messages_sent_in_one_instant_go_in_order():
    env, net = _net(window=2 * MIB)
    log = {}
    for name, dst in (("first", "b"), ("second", "c")):  # two messages (batches) at t=0
        net.send("a", dst, MB, lambda name=name: log.setdefault(name, env.now))
    env.run()
    assert log["first"] == approx(1.0) and log["second"] == approx(2.0)   # FIFO, not shared


def test_the_keys_are_opt_in_and_named_in_the_digest_only_when_set():
    from dtemu.host.scenario_file import load_scenario

    path = ROOT / "scenarios" / "fl_codecs.yaml"
    base = load_scenario(path, [])
    assert (base.network.framing, base.network.send_window_bytes, base.compute.default.decode_s_per_mb) == \
        ("payload", 0, 0.0)
    same = load_scenario(path, ["network.framing=payload", "network.send_window_bytes=0",
                                "compute.default.decode_s_per_mb=0"])
    assert same.digest() == base.digest()
    for key in ("network.framing=rtps", "network.send_window_bytes=2097152", "compute.nodes.client1.decode_s_per_mb=0.001"):
        assert load_scenario(path, [key]).digest() != base.digest(), key


def test_an_fl_round_starts_before_the_models_tail_has_gone(tmp_path):
    """The controller publishes the 4.8 MB model, starts the round and sends the command: with the
    writer history the round starts while the model's last group is still on the wire, and the
    command (behind it in the controller's FIFO) starts the clients' training no earlier."""
    from dtemu.core.scenario import parse_scenario
    from dtemu.emu.run import run_emulation
    from dtemu.host.rundir import read_events
    from test_fl_protocol import StandIn

    class Big(StandIn):
        dim = 1_200_000  # mnist_cnn's size: a 4.8 MB model

    def run(name, *sets):
        raw = {"name": "tail", "fl": {"clients": 2, "rounds": 1, "subset": 1000, "min_clients": 2},
               "network": {"default": {"up_mbps": 100, "down_mbps": 100, "latency_ms": 0}}}
        run_emulation(parse_scenario(raw, list(sets)), tmp_path / name, work=Big())
        events = read_events(tmp_path / name)
        start = next(e["t"] for e in events if e["kind"] == "round_start")
        close = next(e["t"] for e in events if e["kind"] == "round_close")
        train = min(e["t"] for e in events if e["kind"] == "train_start")
        return train - start, close - start

    gap, round_s = run("default")
    gap_w, round_w = run("window", "network.send_window_bytes=2097152")
    model = 4 * Big.dim + 1000  # the blob: the fp32 packet and a few headers
    tail_s = wire_model.tail_bytes(model, 2 * MIB) / (100e6 / 8 / 2)  # two clients share the uplink
    assert gap < 1e-3                                   # the model had arrived: the command goes at once
    assert gap_w - gap == pytest.approx(tail_s, abs=2e-4)
    assert round_w - round_s == pytest.approx(tail_s, abs=2e-4)



def test_store_and_forward_shares_the_senders_link_and_arrives_no_faster_than_it_passes():
    """emu.tandem's two stages: a batch's two flows share the sender's link (each passes it at half
    its rate: 2 s for both, not 1 s for the first and then all of the link for the second while the
    first's rest is counted as waiting downstream), and where nothing waits at the receiver's side a
    flow arrives as it passes the sender's, however fast the receiver's link (10x here)."""
    env, net = _net(window=2 * MIB, nodes=("a", "b", "c"))
    log = {}
    batch = object()
    for dst in ("b", "c"):
        net.send("a", dst, MB, lambda dst=dst: log.setdefault(dst, env.now), batch=batch)
    env.run()
    assert log["b"] == approx(2.0) and log["c"] == approx(2.0)

    env = simpy.Environment()
    links = {"a": Link(8e6, 8e6, 0.0), "b": Link(80e6, 80e6, 0.0)}
    net = Network(env, links, send_window=2 * MIB)
    net.send("a", "b", MB, lambda: log.setdefault("fast", env.now))
    env.run()
    assert log["fast"] == approx(1.0)


def test_on_the_stream_messages_to_two_receivers_go_one_after_another_as_in_dds():
    # real.stream_out holds a frame to one peer while another's are unacknowledged, so a sender's
    # messages to b and then c cross its link in order, as through DDS's writer: b's ends first.
    ends = {}
    for framing in ("rtps", "stream"):
        log = {}
        env, net = _net(framing=framing, window=2 * MIB)
        _send(env, net, 0.0, "a", "b", MB, log, "b")
        _send(env, net, 0.0, "a", "c", MB, log, "c")
        env.run()
        ends[framing] = (log["b.delivered"], log["c.delivered"])
    for framing in ("rtps", "stream"):
        assert ends[framing][0] < 0.6 * ends[framing][1]


def test_groups_end_where_the_writer_waits_for_its_acknowledgement():
    window = 2 * MIB   # groups of two frames
    frame = wire_model._sample_wire(wire_model.FRAME_BYTES + wire_model.FRAME_HEADER_BYTES, 1500)
    assert wire_model.group_bounds(4_800_000, window, 1500) == (2 * frame, 4 * frame)   # frames 1-2, 3-4; 5 last
    assert wire_model.group_bounds(4 * MIB, window, 1500) == (2 * frame,)
    assert wire_model.group_bounds(2 * MIB, window, 1500) == ()            # one group: nothing to wait for
    assert wire_model.group_bounds(4_800_000, window, 1500, "payload") == (2 * MIB, 4 * MIB)
    assert wire_model.group_bounds(4_800_000, 0, 1500) == ()               # no writer history
    assert wire_model.group_bounds(4_800_000, window, 1500, "stream") == ()  # TCP acknowledges as it goes


def test_a_writer_waits_a_round_trip_after_each_group():
    """An idle path: each group but the last waits for its acknowledgement, a round trip (here 4 x
    10 ms); the send returns as the last group starts."""
    n, latency = 4_800_000, 0.010
    env, net = _net(window=2 * MIB, latency_s=latency)
    log = {}
    _send(env, net, 0, "a", "b", n, log, "model")
    env.run()
    rtt = 2 * (2 * latency)
    assert log["model.returned"] == approx(4 * MIB / 1e6 + 2 * rtt)
    assert log["model.delivered"] == approx(n / 1e6 + 2 * rtt + 2 * latency)


def test_an_acknowledgement_waits_behind_what_the_receiver_is_sending():
    """The testbed's geo push (notebook entry 48): a's message to b, while b sends c a message of its
    own.  b's writer put all of it in its link's queue at once, and the acknowledgement of a's first
    group waits behind what is left of it; a's link idles meanwhile.  A message of one group waits
    for no acknowledgement."""
    n = 4_800_000
    env, net = _net(window=2 * MIB, nodes=("a", "b", "c"))
    log = {}
    _send(env, net, 0, "a", "b", n, log, "push")
    _send(env, net, 1.0, "b", "c", 1.5 * MIB, log, "other")       # b's link busy from 1 s to 2.57 s
    env.run()
    behind = 1.0 + 1.5 * MIB / 1e6 - 2 * MIB / 1e6                  # b's queue when a's first group arrived
    assert log["other.delivered"] == approx(1.0 + 1.5 * MIB / 1e6)   # b's own message is not slowed
    assert log["push.returned"] == approx(4 * MIB / 1e6 + behind)
    assert log["push.delivered"] == approx(n / 1e6 + behind)
    env, net = _net(window=2 * MIB, nodes=("a", "b", "c"))
    log = {}
    _send(env, net, 0, "a", "b", 2 * MIB, log, "small")
    _send(env, net, 1.0, "b", "c", 1.5 * MIB, log, "other")
    env.run()
    assert log["small.delivered"] == approx(2 * MIB / 1e6)


def test_a_receiver_that_fails_while_a_group_waits_for_its_acknowledgement_aborts_the_send():
    n = 4_800_000
    env, net = _net(window=2 * MIB, latency_s=0.05)
    results = {}

    def sender():
        results["a"] = yield net.send("a", "b", n, lambda: results.setdefault("delivered", env.now))

    def failure():
        yield env.timeout(2 * MIB / 1e6 + 0.1)   # a's first group arrived; its acknowledgement is on the way
        net.fail_node("b")

    env.process(sender())
    env.process(failure())
    env.run()
    assert results["a"].aborted and "delivered" not in results
    assert not net.active_flows()
