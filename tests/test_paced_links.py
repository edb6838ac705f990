"""Real mode on one machine paces its messages by the scenario's links, as emu's network times them."""

import time
from types import SimpleNamespace

import pytest

from dtemu.core.runtime.compute import ComputeTimer
from dtemu.core.runtime.compute_spec import ComputeSpec
from dtemu.core.scenario import parse_scenario
from dtemu.real.paced_links import PacedLinks
from dtemu.real.primitives import RealPrimitives

STRAGGLER_NET = {"default": {"up_mbps": 50, "down_mbps": 100, "latency_ms": 10}, "nodes": {"client2": {"up_mbps": 5}}}
CLIENTS = ["client1", "client2", "client3", "client4"]


def scenario(network=STRAGGLER_NET, **extra):
    return parse_scenario({"name": "t", "fl": {"clients": 4}, "network": network, **extra})


def test_a_broadcast_and_an_upload_take_emus_times():
    # emu's fl_straggler events: the 73,576-byte model reaches the four clients 0.06708864 s after it
    # is sent (the controller's 50 Mbit/s uplink shared four ways, then 10 + 10 ms), client1's
    # 18,451-byte update 0.02295216 s, and client2's (a 5 Mbit/s uplink) 0.0495216 s.
    ctl = PacedLinks(scenario(), "controller", pace=1.0)
    done = ctl.send_done(0.0, 73576, CLIENTS)
    assert done == pytest.approx(0.04708864)
    assert PacedLinks(scenario(), "client1", 1.0).due("controller", done) == pytest.approx(0.06708864)
    c1, c2 = PacedLinks(scenario(), "client1", 1.0), PacedLinks(scenario(), "client2", 1.0)
    assert ctl.due("client1", c1.send_done(1.0, 18451, ["controller"])) - 1.0 == pytest.approx(0.02295216)
    assert ctl.due("client2", c2.send_done(1.0, 18451, ["controller"])) - 1.0 == pytest.approx(0.0495216)


def test_the_uplink_is_a_fifo_and_the_pace_stretches_every_time():
    ctl = PacedLinks(scenario(), "controller", pace=8.0)
    first = ctl.send_done(0.0, 73576, CLIENTS)
    assert first == pytest.approx(8 * 0.04708864)
    assert ctl.send_done(0.1, 34, ["client1"]) == pytest.approx(first + 8 * 34 * 8 / 50e6)  # behind the model
    assert PacedLinks(scenario(), "client1", 8.0).due("controller", 1.0) == pytest.approx(1.0 + 8 * 0.02)
    assert ctl.send_done(5.0, 0, ["controller"]) == 5.0 and ctl.due("controller", 5.0) == 5.0  # to oneself


def test_multicast_sends_one_copy_and_a_slow_downlink_is_the_bottleneck():
    net = {"default": {"up_mbps": 50, "down_mbps": 100, "latency_ms": 10}, "nodes": {"client3": {"down_mbps": 1}}}
    multi = PacedLinks(scenario({**net, "delivery": "multicast"}), "controller", 1.0)
    assert multi.send_done(0.0, 10_000, ["client1", "client2"]) == pytest.approx(10_000 * 8 / 50e6)
    uni = PacedLinks(scenario(net), "controller", 1.0)
    assert uni.send_done(0.0, 10_000, ["client1", "client3"]) == pytest.approx(10_000 * 8 / 1e6)


class FakeTransport:
    """What RealPrimitives asks of a transport: messages on topics, in order, with their times."""

    def __init__(self):
        self.inbox = []
        self.on_reject = None
        self.clock = SimpleNamespace(wall_ns=time.time_ns)  # this machine's clock (real.clock_sync)

    def put(self, topic, src, sent_at):
        self.inbox.append(SimpleNamespace(topic=topic, src=src, data=b"x", sent_at=sent_at, received_at=sent_at))

    def recv(self, topics, timeout_s=None):
        for m in self.inbox:
            if m.topic in topics:
                self.inbox.remove(m)
                return m
        time.sleep(min(timeout_s or 0.0, 0.05))
        return None


def prims(links):
    run = SimpleNamespace(event=lambda e: None)
    return RealPrimitives("client1", FakeTransport(), run, (), ComputeTimer(ComputeSpec(), None, seed=0),
                          links=links)


def test_a_message_is_held_until_the_paths_latency_has_passed():
    # 10 + 10 ms of latency at pace 5: a message written now is the role's 0.1 s later
    p = prims(PacedLinks(scenario(), "client1", pace=5.0))
    now = time.monotonic()
    p.transport.put("train/model", "controller", now)
    p.transport.put("other/topic", "controller", now)
    assert p.recv.__wrapped__(p, ("train/model",), p.now() + 0.02) is None  # its deadline comes first
    msg = p.recv.__wrapped__(p, ("train/model",), None)
    assert msg.topic == "train/model" and time.monotonic() - now >= 0.1
    assert msg.received_at == pytest.approx(now - p.t0 + 0.1)
    late = p.recv.__wrapped__(p, ("other/topic",), None)  # held apart from the first: not lost
    assert late.topic == "other/topic"


def test_without_pacing_a_message_is_the_roles_at_once():
    p = prims(None)
    now = time.monotonic()
    p.transport.put("train/model", "controller", now)
    t0 = time.monotonic()
    assert p.recv.__wrapped__(p, ("train/model",), None).topic == "train/model"
    assert time.monotonic() - t0 < 0.05
