"""Multicast delivery in the network model (network.delivery, issue 12): one copy per link."""

import pytest
import simpy

from dtemu.core.scenario import parse_scenario
from dtemu.emu.network import Link, Network
from dtemu.emu.run import run_emulation
from dtemu.host.rundir import read_events
from test_fl_protocol import StandIn

MB = 1_000_000


def star(n, up_bps=100e6, down_bps=100e6, latency_s=0.001, **overrides):
    env = simpy.Environment()
    links = {"src": Link(up_bps, down_bps, latency_s)}
    links.update({f"r{i}": Link(up_bps, down_bps, latency_s) for i in range(n)})
    links.update(overrides)
    return env, Network(env, links, seed=1)


def test_a_multicast_crosses_the_senders_uplink_once():
    env, net = star(100)
    got = {}
    done = net.multicast("src", [f"r{i}" for i in range(100)], MB, lambda dst: got.setdefault(dst, env.now))
    env.run()
    # 1 MB at 100 Mbit/s: 0.08 s for all of them together (unicast: 100 x 0.08 s on the shared uplink)
    assert len(got) == 100 and all(t == pytest.approx(0.08 + 0.002) for t in got.values())
    assert all(r.end == pytest.approx(0.08) for r in done.value)
    assert net.stats["src"].bytes_sent == MB and net.stats["r7"].bytes_received == MB


def test_unicast_to_the_same_readers_shares_the_uplink():
    env, net = star(10)
    events = [net.send("src", f"r{i}", MB, lambda: None) for i in range(10)]
    env.run()
    assert max(e.value.end for e in events) == pytest.approx(0.8)
    assert net.stats["src"].bytes_sent == 10 * MB


def test_the_slowest_reader_paces_a_multicast():
    env, net = star(3, r2=Link(100e6, 10e6, 0.001))
    got = {}
    net.multicast("src", ["r0", "r1", "r2"], MB, lambda dst: got.setdefault(dst, env.now))
    env.run()
    assert got["r0"] == got["r2"] == pytest.approx(0.8 + 0.002)


def test_a_reader_failing_midway_does_not_stop_the_others():
    env, net = star(3)
    got = {}
    net.multicast("src", ["r0", "r1", "r2"], MB, lambda dst: got.setdefault(dst, env.now))
    env.timeout(0.04).callbacks.append(lambda _e: net.fail_node("r1"))
    env.run()
    assert sorted(got) == ["r0", "r2"] and net.stats["src"].messages_lost_to_failure == 1


def test_a_multicast_repairs_the_most_any_reader_lost():
    env, net = star(2, r1=Link(100e6, 100e6, 0.001, loss=0.05))
    got = {}
    done = net.multicast("src", ["r0", "r1"], MB, lambda dst: got.setdefault(dst, env.now))
    env.run()
    lost = {r.dst: r.lost_packets for r in done.value}
    assert lost["r0"] == 0 and lost["r1"] > 0
    assert net.stats["src"].wire_bytes_sent == MB + lost["r1"] * 1500
    assert got["r1"] > got["r0"]


def test_emulated_run_with_multicast_publishes_the_model_once(tmp_path):
    def sc(delivery):
        return parse_scenario({"name": "mc", "fl": {"clients": 50, "rounds": 2, "subset": 100, "sample": 5},
                               "network": {"default": {"up_mbps": 100, "down_mbps": 100, "latency_ms": 1},
                                           "delivery": delivery}})

    class Big(StandIn):
        dim = 250_000  # a 1 MB model

    uni = run_emulation(sc("unicast"), tmp_path / "uni", work=Big())
    multi = run_emulation(sc("multicast"), tmp_path / "multi", work=Big())
    assert multi["model_sha256"] == uni["model_sha256"] and multi["bytes_down"] == uni["bytes_down"]
    assert multi["time_s"] < uni["time_s"] / 5
    sent = {"uni": uni["emu"]["wire_bytes"], "multi": multi["emu"]["wire_bytes"]}
    assert sent["multi"] < sent["uni"] / 5
    assert {e["kind"] for e in read_events(tmp_path / "multi")} >= {"sampled", "aggregated"}


def test_the_lan_profile_chooses_unicast_or_multicast(monkeypatch):
    from dtemu.real.config import config_xml

    assert "<AllowMulticast>false</AllowMulticast>" in config_xml("lan", peers="10.1.2.3")
    monkeypatch.setenv("DTEMU_DDS_DELIVERY", "multicast")
    assert "<AllowMulticast>true</AllowMulticast>" in config_xml("lan", peers="10.1.2.3")
    assert "<AllowMulticast>false</AllowMulticast>" in config_xml("loopback")  # never off this machine
    monkeypatch.setenv("DTEMU_DDS_DELIVERY", "broadcast")
    with pytest.raises(ValueError, match="DTEMU_DDS_DELIVERY"):
        config_xml("lan", peers="10.1.2.3")


def test_a_multicast_longer_than_the_writer_history_returns_early_and_completes():
    """With network.send_window_bytes, the sender's event fires when the multicast is down to its
    last writer-history group; the list it fired with is completed in place at the flow's end
    (it once failed there: a list has no released_at)."""
    env = simpy.Environment()
    net = Network(env, {n: Link(100e6, 100e6, 0.001) for n in ("src", "r0", "r1")}, seed=1,
                  send_window=2 << 20)
    got, fired = {}, []
    done = net.multicast("src", ["r0", "r1"], 5 * MB, lambda dst: got.setdefault(dst, env.now))
    done.callbacks.append(lambda e: fired.append(env.now))
    env.run()
    assert sorted(got) == ["r0", "r1"] and all(t == pytest.approx(0.4 + 0.002) for t in got.values())
    assert 0 < fired[0] < 0.4   # returned before the end: only the last group was left
    assert [r.dst for r in done.value] == ["r0", "r1"]
    assert all(r.released_at == fired[0] and r.end == pytest.approx(0.4) for r in done.value)
    assert net.stats["src"].bytes_sent == 5 * MB
