"""The model on its way down as a compressed delta (fl.downlink_codec, issue 12)."""

import numpy as np
import pytest

from dtemu.core.fl.downlink import Downlink, HeldModel
from dtemu.core.runtime.requests import RecordingContext, Send, WaitPeers
from dtemu.core.scenario import parse_scenario
from dtemu.core.wire import messages
from dtemu.core.wire.topics import MODEL_BLOB
from dtemu.emu.run import run_emulation
from dtemu.host.rundir import read_events
from test_fl_protocol import StandIn, of


class Wide(StandIn):
    dim = 20000


def scenario(**sets):
    raw = {"name": "down", "fl": {"clients": 3, "rounds": 4, "subset": 1000, "round_timeout_s": 3.0,
                                  "min_clients": 1, "downlink_codec": "q8"},
           "network": {"default": {"up_mbps": 1000, "down_mbps": 1000, "latency_ms": 1}}}
    return parse_scenario(raw, [f"{k}={v}" for k, v in sets.items()])


def drive(gen, answers):
    """Run a generator of requests, answering WaitPeers with ``answers`` and collecting Sends."""
    sent, value = [], None
    try:
        while True:
            req = gen.send(value)
            value = answers if isinstance(req, WaitPeers) else None
            if isinstance(req, Send):
                sent.append(req)
    except StopIteration:
        return sent


@pytest.mark.parametrize("codec", ["q8", "s4", "sq8"])
def test_a_client_applying_every_delta_holds_the_controllers_reference_bit_for_bit(codec):
    sc = scenario(**{"fl.downlink_codec": codec})
    clients = ("client1",)
    down, held, ctx = Downlink(sc.fl, clients), HeldModel(), RecordingContext()
    rng = np.random.default_rng(0)
    w = rng.normal(size=5000).astype(np.float32)
    held.take_full(0, down.full(0, w))
    for r in range(1, 6):
        w = w + rng.normal(scale=0.1, size=5000).astype(np.float32)
        (send,) = drive(down.publish(ctx, r, w, lambda t, r_, d: d), frozenset(clients))
        assert held.take_delta(messages.decode(send.data), send.data)
        assert (held.weights(5000) == down.reference).all()
    # the exact model is ahead of the reference by what the codec has not carried yet
    assert np.abs(w - down.reference).max() < np.abs(w).max()


def test_a_stale_client_gets_the_full_model_before_the_delta():
    sc = scenario()
    down, ctx = Downlink(sc.fl, ("client1", "client2")), RecordingContext()
    w = np.ones(100, np.float32)
    down.full(0, w)
    down.missed(["client2"])
    sends = drive(down.publish(ctx, 1, w * 2, lambda t, r, d: d), frozenset({"client1", "client2"}))
    assert [s.to for s in sends] == [("client2",), None]
    assert isinstance(messages.decode(sends[0].data), messages.ModelBlob)
    # away at a publish: stale until present again
    sends = drive(down.publish(ctx, 2, w * 3, lambda t, r, d: d), frozenset({"client1"}))
    assert [s.to for s in sends] == [None]
    sends = drive(down.publish(ctx, 3, w * 3, lambda t, r, d: d), frozenset({"client1", "client2"}))
    assert [s.to for s in sends] == [("client2",), None]


def model_bytes_after_the_first(run):
    """Bytes of the models the clients received after the initial one (which is always full)."""
    seen, total = set(), 0
    for e in read_events(run):
        if e["kind"] == "deliver" and e["topic"] == MODEL_BLOB:
            total += e["bytes"] if e["node"] in seen else 0
            seen.add(e["node"])
    return total


def test_q8_downlink_sends_a_quarter_of_the_bytes_and_trains_every_round(tmp_path):
    full = run_emulation(scenario(**{"fl.downlink_codec": "fp32"}), tmp_path / "fp32", work=Wide())
    q8 = run_emulation(scenario(), tmp_path / "q8", work=Wide())
    assert q8["rounds"] == full["rounds"] == 4 and q8["rounds_failed"] == 0
    assert model_bytes_after_the_first(tmp_path / "q8") / model_bytes_after_the_first(tmp_path / "fp32") < 0.26
    events = read_events(tmp_path / "q8")
    assert [e["full_to"] for e in of(events, "model_sent")] == [0, 0, 0, 0]
    assert all(len(e["clients"]) == 3 for e in of(events, "round_close"))


def test_a_restarted_client_is_sent_the_full_model_and_trains_again(tmp_path):
    sc = scenario(**{"fl.rounds": 6, "faults.offline": "[{node: client2, start_s: 0.05, end_s: 3.5}]"})
    s = run_emulation(sc, tmp_path / "r", work=Wide())
    events = read_events(tmp_path / "r")
    assert s["rounds_failed"] == 0
    assert any(e["full_to"] == 1 for e in of(events, "model_sent"))
    assert "client2" in of(events, "round_close")[-1]["clients"]


def test_a_restarted_controller_starts_a_new_reference_the_clients_take(tmp_path):
    sc = scenario(**{"fl.rounds": 5, "faults.crashes": "[{node: controller, round: 2, at: after_checkpoint, "
                                                      "restart_after_s: 0.5}]"})
    s = run_emulation(sc, tmp_path / "r", work=Wide())
    events = read_events(tmp_path / "r")
    assert s["rounds"] == 5 and s["rounds_failed"] == 0
    # after the restart every client trains on the new reference and answers every round
    assert all(len(e["clients"]) == 3 for e in of(events, "round_close") if e["round"] > 2)
