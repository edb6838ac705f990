"""The emulated network: fair sharing, latency, loss and failures, in virtual time."""

import math
from collections import defaultdict

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from dtemu.emu.network import FlowResult, Link, Network, link_from_spec

MBPS = 1e6


def approx(x):
    return pytest.approx(x, rel=1e-9, abs=1e-9)


class Recorder:
    """Sends messages at given times and remembers when each was delivered."""

    def __init__(self, env, net):
        self.env, self.net = env, net
        self.delivered_at = {}
        self.results = {}
        self.event_fired_at = {}

    def send_at(self, t, name, src, dst, nbytes):
        def proc():
            yield self.env.timeout(t)
            event = self.net.send(src, dst, nbytes,
                                  lambda: self.delivered_at.setdefault(name, self.env.now))
            result = yield event
            self.event_fired_at[name] = self.env.now
            self.results[name] = result
        self.env.process(proc())


def setup(links, seed=0, mtu=1500):
    env = simpy.Environment()
    net = Network(env, links, seed=seed, mtu=mtu)
    return env, net, Recorder(env, net)


# -- one flow, sharing ------------------------------------------------------------


def test_one_flow_end_and_delivery():
    env, net, rec = setup({"A": Link(100 * MBPS, 100 * MBPS, 0.010),
                           "B": Link(100 * MBPS, 50 * MBPS, 0.025)})
    n = 1_234_567
    rec.send_at(0.5, "m", "A", "B", n)
    env.run()
    end = 0.5 + n * 8 / (50 * MBPS)
    r = rec.results["m"]
    assert isinstance(r, FlowResult) and not r.aborted
    assert r.start == 0.5 and r.end == approx(end)
    assert rec.event_fired_at["m"] == approx(end)          # sender done at flow end
    assert rec.delivered_at["m"] == approx(end + 0.035)     # on_deliver after both latencies
    assert r.delivered_at == approx(end + 0.035)
    assert (r.lost_packets, r.wire_bytes) == (0, n)


def test_uplink_is_the_bottleneck_when_slower():
    env, net, rec = setup({"A": Link(10 * MBPS, 1), "B": Link(1, 1000 * MBPS)})
    rec.send_at(0, "m", "A", "B", 1_000_000)
    env.run()
    assert rec.results["m"].end == approx(8e6 / (10 * MBPS))


def test_two_flows_from_one_sender_share_its_uplink():
    env, net, rec = setup({"A": Link(100 * MBPS, 1), "B": Link(1, 1000 * MBPS),
                           "C": Link(1, 1000 * MBPS)})
    n = 1_000_000
    rec.send_at(0, "b", "A", "B", n)
    rec.send_at(0, "c", "A", "C", n)
    env.run()
    alone = n * 8 / (100 * MBPS)
    assert rec.results["b"].end == approx(2 * alone)
    assert rec.results["c"].end == approx(2 * alone)


def test_max_min_gives_the_slow_receiver_its_link_and_the_rest_to_the_other():
    env, net, rec = setup({"A": Link(100 * MBPS, 1), "B": Link(1, 10 * MBPS),
                           "C": Link(1, 1000 * MBPS)})
    allocations = []
    net.on_rates_changed = lambda now: allocations.append(
        {(f.src, f.dst): f.rate * 8 for f in net.active_flows()})
    n = 10_000_000
    rec.send_at(0, "b", "A", "B", n)
    rec.send_at(0, "c", "A", "C", n)
    env.run()
    assert allocations[0][("A", "B")] == approx(10 * MBPS)
    assert allocations[0][("A", "C")] == approx(90 * MBPS)
    # C finishes first at 90 Mbit/s; B was at its own 10 Mbit/s all along.
    assert rec.results["c"].end == approx(n * 8 / (90 * MBPS))
    assert rec.results["b"].end == approx(n * 8 / (10 * MBPS))
    assert allocations[-1] == {}


def test_clients_uploading_together_share_the_controllers_downlink():
    links = {"ctl": Link(1000 * MBPS, 100 * MBPS)}
    links.update({f"c{i}": Link(1000 * MBPS, 1000 * MBPS) for i in range(5)})
    env, net, rec = setup(links)
    n = 2_000_000
    for i in range(5):
        rec.send_at(1.0, i, f"c{i}", "ctl", n)
    env.run()
    for i in range(5):
        assert rec.results[i].end == approx(1.0 + 5 * n * 8 / (100 * MBPS))


def test_a_flow_starting_midway_is_accounted_piecewise():
    # C's downlink: 1e7 bytes/s.  A alone for 0.5 s (5e6 bytes), then A and B
    # at 5e6 bytes/s each until A is done at 1.5 s; then B alone, 5e6 bytes to go.
    env, net, rec = setup({"A": Link(1e9, 1e9), "B": Link(1e9, 1e9), "C": Link(1e9, 8e7)})
    rec.send_at(0.0, "a", "A", "C", 10_000_000)
    rec.send_at(0.5, "b", "B", "C", 10_000_000)
    env.run()
    assert rec.results["a"].end == approx(1.5)
    assert rec.results["b"].end == approx(2.0)


def test_active_flows_reports_remaining_bytes_now():
    env, net, _ = setup({"A": Link(8e6, 8e6), "B": Link(8e6, 8e6)})   # 1e6 bytes/s
    net.send("A", "B", 3_000_000, lambda: None)
    env.run(until=1.0)
    (flow,) = net.active_flows()
    assert (flow.src, flow.dst, flow.total) == ("A", "B", 3_000_000)
    assert flow.remaining == approx(2_000_000)
    assert flow.rate == approx(1e6)


def test_many_small_flows_finishing_together_leave_no_dust():
    # Sizes and rates that are not exact in binary; everything must finish and
    # nothing may linger with a 1e-12-byte remainder.
    links = {f"n{i}": Link(3 * MBPS + 0.1 * i, 7 * MBPS / 3) for i in range(7)}
    env, net, rec = setup(links)
    k = 0
    for t in (0, 0.1, 1 / 3, 0.7):
        for i in range(7):
            rec.send_at(t, k, f"n{i}", f"n{(i * 3 + 1) % 7}", 100_003 + 17 * k)
            k += 1
    env.run()
    assert len(rec.delivered_at) == k
    assert net.active_flows() == []


# -- loss -------------------------------------------------------------------------


def test_no_loss_means_no_extra_bytes_or_delay():
    env, net, rec = setup({"A": Link(8e6, 8e6, 0.01), "B": Link(8e6, 8e6, 0.02)})
    rec.send_at(0, "m", "A", "B", 1_500_000)
    env.run()
    r = rec.results["m"]
    assert (r.lost_packets, r.wire_bytes) == (0, 1_500_000)
    assert r.end == approx(1.5) and r.delivered_at == approx(1.53)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_loss_adds_retransmitted_bytes_and_round_trips(seed):
    la, lb = 0.05, 0.02
    link_a = Link(80 * MBPS, 80 * MBPS, 0.010, la)
    link_b = Link(80 * MBPS, 40 * MBPS, 0.015, lb)
    env, net, rec = setup({"A": link_a, "B": link_b}, seed=seed)
    n = 1_000_000
    rec.send_at(0, "m", "A", "B", n)
    env.run()
    packets = math.ceil(n / 1500)
    p = 1 - (1 - la) * (1 - lb)
    lost = np.random.default_rng(seed).binomial(packets, p)
    assert lost > 0
    r = rec.results["m"]
    wire = n + lost * 1500
    assert (r.lost_packets, r.wire_bytes) == (lost, wire)
    assert r.end == approx(wire * 8 / (40 * MBPS))
    assert rec.delivered_at["m"] == approx(r.end + (1 + 2 * lost) * 0.025)
    assert net.stats["A"].wire_bytes_sent == wire
    assert net.stats["A"].bytes_sent == n and net.stats["B"].bytes_received == n


def test_when_every_packet_is_lost_the_whole_message_is_resent_once():
    env, net, rec = setup({"A": Link(8e6, 8e6, 0.0, 0.999999), "B": Link(8e6, 8e6, 0.5)})
    rec.send_at(0, "m", "A", "B", 2000)     # 2 packets, the last one short
    env.run()
    assert rec.results["m"].lost_packets == 2
    assert rec.results["m"].wire_bytes == 4000


def lossy_run(seed):
    links = {"ctl": link_from_spec(100, 100, 5, 0.02)}
    links.update({f"c{i}": link_from_spec(20, 50, 10 + i, 0.01 * i) for i in range(4)})
    env, net, rec = setup(links, seed=seed)
    for i in range(4):
        rec.send_at(0, ("down", i), "ctl", f"c{i}", 500_000)
        rec.send_at(0.05 * i, ("up", i), f"c{i}", "ctl", 300_000)
    env.run()
    return sorted(rec.delivered_at.items()), [r.lost_packets for _, r in sorted(rec.results.items())]


def test_same_seed_same_times_different_seed_different_times():
    assert lossy_run(3) == lossy_run(3)
    assert lossy_run(3) != lossy_run(4)


# -- edge cases -------------------------------------------------------------------


def test_message_to_oneself_is_delivered_at_once_without_links():
    env, net, rec = setup({"A": Link(1, 1, 0.5, 0.5)})
    rec.send_at(2.0, "m", "A", "A", 10**9)
    env.run()
    r = rec.results["m"]
    assert rec.delivered_at["m"] == 2.0 and r.end == 2.0 and r.delivered_at == 2.0
    assert (r.lost_packets, r.wire_bytes) == (0, 0)
    assert net.stats["A"].bytes_received == 10**9 and net.stats["A"].wire_bytes_sent == 0


def test_zero_byte_message_still_pays_latency():
    env, net, rec = setup({"A": Link(1e6, 1e6, 0.01, 0.3), "B": Link(1e6, 1e6, 0.02, 0.3)})
    rec.send_at(1.0, "m", "A", "B", 0)
    env.run()
    r = rec.results["m"]
    assert r.end == 1.0 and rec.event_fired_at["m"] == 1.0
    assert rec.delivered_at["m"] == approx(1.03)
    assert (r.lost_packets, r.wire_bytes) == (0, 0)


def test_link_from_spec_uses_megabits_and_milliseconds():
    assert link_from_spec(100, 20, 15, 0.01) == Link(100e6, 20e6, 0.015, 0.01)


@pytest.mark.parametrize("bad", [dict(up_bps=0, down_bps=1), dict(up_bps=1, down_bps=math.inf),
                                 dict(up_bps=1, down_bps=1, latency_s=-1),
                                 dict(up_bps=1, down_bps=1, loss=1.0)])
def test_invalid_links_are_rejected(bad):
    with pytest.raises(ValueError):
        Link(**bad)


def test_unknown_node_is_an_error():
    env, net, _ = setup({"A": Link(1, 1)})
    with pytest.raises(KeyError):
        net.send("A", "Z", 1, lambda: None)


# -- failures ---------------------------------------------------------------------


def test_fail_node_aborts_its_flows_and_the_others_speed_up():
    # C's downlink 1e7 bytes/s shared by A and B; A fails at 0.4 s with 2e6 bytes sent.
    env, net, rec = setup({"A": Link(1e9, 1e9), "B": Link(1e9, 1e9), "C": Link(1e9, 8e7)})
    rec.send_at(0, "a", "A", "C", 10_000_000)
    rec.send_at(0, "b", "B", "C", 10_000_000)

    def crash():
        yield env.timeout(0.4)
        net.fail_node("A")
        assert not net.is_up("A")
    env.process(crash())
    env.run()
    a, b = rec.results["a"], rec.results["b"]
    assert a.aborted and a.end == approx(0.4) and a.delivered_at is None
    assert a.wire_bytes == 2_000_000 and "a" not in rec.delivered_at
    assert rec.event_fired_at["a"] == approx(0.4)
    # B: 2e6 bytes by 0.4 s, then the remaining 8e6 alone at 1e7 bytes/s.
    assert not b.aborted and b.end == approx(1.2) and rec.delivered_at["b"] == approx(1.2)
    assert net.stats["A"].wire_bytes_sent == 2_000_000
    assert net.stats["A"].bytes_sent == 0
    assert net.stats["A"].messages_lost_to_failure == 1
    assert net.stats["C"].messages_delivered == 1


def test_failed_node_drops_sends_until_restored():
    env, net, rec = setup({"A": Link(8e6, 8e6, 0.1), "B": Link(8e6, 8e6, 0.1)})
    net.fail_node("B")
    rec.send_at(1.0, "to", "A", "B", 1000)
    rec.send_at(1.0, "from", "B", "A", 1000)

    def restore():
        yield env.timeout(2.0)
        net.restore_node("B")
    env.process(restore())
    rec.send_at(3.0, "after", "A", "B", 1_000_000)
    env.run()
    for name in ("to", "from"):
        r = rec.results[name]
        assert r.aborted and r.end == 1.0 and r.wire_bytes == 0 and name not in rec.delivered_at
    assert rec.results["after"].end == approx(4.0)
    assert rec.delivered_at["after"] == approx(4.2)
    assert net.is_up("B")
    assert net.stats["A"].messages_sent == 2 and net.stats["A"].messages_lost_to_failure == 1
    assert net.stats["B"].messages_lost_to_failure == 1


def test_fail_node_cancels_deliveries_still_in_propagation():
    env, net, rec = setup({"A": Link(8e6, 8e6, 1.0), "B": Link(8e6, 8e6, 1.0)})
    rec.send_at(0, "m", "A", "B", 1_000_000)      # flow ends at 1.0, delivery due at 3.0

    def crash():
        yield env.timeout(2.0)
        net.fail_node("B")
    env.process(crash())
    env.run()
    r = rec.results["m"]
    assert not r.aborted and r.end == approx(1.0)
    assert r.delivered_at is None and "m" not in rec.delivered_at
    assert net.stats["A"].bytes_sent == 1_000_000 and net.stats["B"].bytes_received == 0
    assert net.stats["A"].messages_lost_to_failure == 1


def test_sender_failing_after_its_flow_ended_does_not_stop_delivery():
    env, net, rec = setup({"A": Link(8e6, 8e6, 1.0), "B": Link(8e6, 8e6, 1.0)})
    rec.send_at(0, "m", "A", "B", 1_000_000)

    def crash():
        yield env.timeout(2.0)
        net.fail_node("A")
    env.process(crash())
    env.run()
    assert rec.delivered_at["m"] == approx(3.0)


# -- properties -------------------------------------------------------------------


speeds = st.sampled_from([1e6, 3e6, 1e7, 2.5e7, 1e8, 7.7e7])
flow_specs = st.lists(
    st.tuples(st.integers(0, 20).map(lambda k: k * 0.05),     # start time
              st.integers(0, 4), st.integers(0, 4),          # src, dst
              st.integers(0, 3_000_000)),                     # payload bytes
    min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(ups=st.lists(speeds, min_size=5, max_size=5),
       downs=st.lists(speeds, min_size=5, max_size=5),
       flows=flow_specs, lossy=st.booleans())
def test_fair_sharing_properties(ups, downs, flows, lossy):
    nodes = [f"n{i}" for i in range(5)]
    links = {node: Link(ups[i], downs[i], 0.001 * i, 0.01 if lossy else 0.0)
             for i, node in enumerate(nodes)}
    env, net, rec = setup(links, seed=len(flows))
    capacity = {(n, "up"): links[n].up_bps / 8 for n in nodes}
    capacity.update({(n, "down"): links[n].down_bps / 8 for n in nodes})

    def check_allocation(now):
        active = net.active_flows()
        load = defaultdict(float)
        for f in active:
            assert f.rate > 0
            load[(f.src, "up")] += f.rate
            load[(f.dst, "down")] += f.rate
        # (b) no link is over capacity.
        for port, used in load.items():
            assert used <= capacity[port] * (1 + 1e-9)
        # Max-min: every flow has a bottleneck, a saturated link on which no
        # other flow gets more than it does.
        for f in active:
            ports = [(f.src, "up"), (f.dst, "down")]
            assert any(load[p] >= capacity[p] * (1 - 1e-9)
                       and all(g.rate <= f.rate * (1 + 1e-9) for g in active
                               if p in ((g.src, "up"), (g.dst, "down")))
                       for p in ports)
    net.on_rates_changed = check_allocation

    for k, (start, s, d, nbytes) in enumerate(flows):
        rec.send_at(start, k, nodes[s], nodes[d], nbytes)
    env.run()

    sent = 0
    for k, (start, s, d, nbytes) in enumerate(flows):
        r = rec.results[k]
        # (a) no flow beats its own access links.
        if s != d:
            alone = r.wire_bytes * 8 / min(ups[s], downs[d])
            assert r.end - start >= alone * (1 - 1e-9) - 1e-12
            assert r.wire_bytes >= nbytes
        assert rec.delivered_at[k] >= r.end
        sent += nbytes
    # (c) every byte sent is delivered.
    assert len(rec.delivered_at) == len(flows)
    assert sum(st_.bytes_sent for st_ in net.stats.values()) == sent
    assert sum(st_.bytes_received for st_ in net.stats.values()) == sent
    assert sum(st_.messages_delivered for st_ in net.stats.values()) == len(flows)
    assert net.active_flows() == []


def test_ten_thousand_messages_run_quickly_and_all_arrive():
    # A federated-learning-like load: 20 clients, each uploading then downloading.
    links = {"ctl": link_from_spec(1000, 1000, 1, 0.001)}
    links.update({f"c{i}": link_from_spec(50, 100, 20, 0.001) for i in range(20)})
    env = simpy.Environment()
    net = Network(env, links, seed=1)
    delivered = [0]

    def on_deliver():
        delivered[0] += 1

    def client(i):
        for _ in range(250):
            yield net.send(f"c{i}", "ctl", 20_000, on_deliver)
            yield net.send("ctl", f"c{i}", 20_000, on_deliver)
    for i in range(20):
        env.process(client(i))
    env.run()
    assert delivered[0] == 10_000
    assert net.stats["ctl"].messages_delivered == 5_000
