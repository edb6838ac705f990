"""Sampled rounds and client availability (issue 12): who is asked, who is waited for."""

import math

import numpy as np

import pytest

from dtemu.core.errors import ScenarioError
from dtemu.core.fl.population import Population, parse_trace
from dtemu.core.scenario import parse_scenario
from dtemu.core.wire.topics import TRAIN_CMD
from dtemu.emu.run import run_emulation
from dtemu.host.rundir import read_events
from dtemu.host.traces import load_population
from test_fl_protocol import StandIn, of


def scenario(clients=20, **sets):
    raw = {"name": "pop", "fl": {"clients": clients, "rounds": 3, "subset": 100, "round_timeout_s": 5.0,
                                 "min_clients": 1},
           "network": {"default": {"up_mbps": 1000, "down_mbps": 1000, "latency_ms": 1}}}
    return parse_scenario(raw, [f"{k}={v}" for k, v in sets.items()])


def test_sample_as_fraction_or_count_with_a_minimum():
    assert scenario(**{"fl.sample": 0.25}).fl.asked_per_round == 5
    assert scenario(**{"fl.sample": 3}).fl.asked_per_round == 3
    assert scenario(**{"fl.sample": 0.05, "fl.sample_min": 4}).fl.asked_per_round == 4
    assert not scenario().fl.sampled
    with pytest.raises(ScenarioError, match="fl.sample"):
        scenario(**{"fl.sample": 2.5})
    with pytest.raises(ScenarioError, match="fl.min_clients"):
        scenario(**{"fl.sample": 3, "fl.min_clients": 4})


def test_draw_depends_on_the_round_seed_only():
    pop = Population(scenario(**{"fl.sample": 5}))
    a, avail = pop.choose(0.0, 1234)
    assert avail == 20 and len(a) == 5 and a == sorted(a, key=lambda c: int(c[6:]))
    assert pop.choose(99.0, 1234)[0] == a
    assert pop.choose(0.0, 1235)[0] != a


def test_sampled_round_asks_only_the_drawn_clients_and_waits_only_for_them(tmp_path):
    sc = scenario(**{"fl.sample": 4})
    run_emulation(sc, tmp_path / "r", work=StandIn())
    events = read_events(tmp_path / "r")
    for r in (1, 2, 3):
        (drawn,) = of(events, "sampled", round=r)
        assert drawn["asked"] == 4 and drawn["available"] == 20
        trained = sorted(e["node"] for e in of(events, "train_start", round=r))
        assert trained == sorted(drawn["clients"])
        (close,) = of(events, "round_close", round=r)
        assert close["expected"] == 4 and close["ready"] == 4 and not close["timed_out"]
        # closed as soon as the four answered, long before the 5 s timeout
        assert close["t"] - of(events, "round_start", round=r)[0]["t"] < 1.0
    # the commands travelled to the four only
    cmds = [e for e in events if e["kind"] == "deliver" and e["topic"] == TRAIN_CMD]
    assert len(cmds) == 3 * 4 + 20  # 4 commands a round, and the final Stop to every client


def test_onoff_availability_is_seeded_and_stationary():
    sc = scenario(clients=2000, **{"fl.availability.kind": "onoff", "fl.availability.mean_on_s": 300,
                                   "fl.availability.mean_off_s": 100})
    a, b = Population(sc), Population(sc)
    on = a.online(50.0)
    assert abs(len(on) / 2000 - 0.75) < 0.04
    # looked at at other times first, or not: the same timeline
    b.online(10.0), b.online(40.0)
    assert b.online(50.0) == on
    later = a.online(5000.0)
    assert abs(len(later) / 2000 - 0.75) < 0.04 and later != on


def test_trace_windows_and_its_errors(tmp_path):
    names = [f"client{i}" for i in range(1, 4)]
    w = parse_trace("client,start_s,end_s\n# two windows\nclient1,0,10\n1,5,20\n2,30,inf\n", names)
    assert w == {"client1": [(0.0, 20.0)], "client2": [(30.0, math.inf)]}
    for bad, msg in [("client9,0,1", "no client"), ("client1,5,1", "start_s < end_s"),
                     ("client1,a,1", "numbers"), ("client1,0", "client,start_s,end_s")]:
        with pytest.raises(ScenarioError, match=msg):
            parse_trace(bad, names)
    trace = tmp_path / "t.csv"
    trace.write_text("client1,0,10\nclient2,100,200\n")
    sc = scenario(clients=3, **{"fl.availability.kind": "trace", "fl.availability.trace": str(trace)})
    pop = load_population(sc)
    assert pop.online(5.0) == ["client1", "client3"]  # client3 is not in the trace: always there
    assert pop.online(150.0) == ["client2", "client3"]
    with pytest.raises(ScenarioError, match="cannot read"):
        load_population(scenario(clients=3, **{"fl.availability.kind": "trace",
                                               "fl.availability.trace": str(tmp_path / "none")}))


def test_a_round_with_no_one_available_waits_out_its_time(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("client1,7,inf\nclient2,7,inf\n")
    sc = scenario(clients=2, **{"fl.availability.kind": "trace", "fl.availability.trace": str(trace),
                                "fl.rounds": 2})
    run_emulation(sc, tmp_path / "r", work=StandIn())
    events = read_events(tmp_path / "r")
    first, second = of(events, "round_close", round=1)[0], of(events, "round_close", round=2)[0]
    assert first["expected"] == 0 and first["t"] == pytest.approx(5.0, abs=0.01)
    assert of(events, "round_failed", round=1)
    assert second["expected"] == 0  # at ~5 s: still no one
    assert of(events, "sampled", round=2)[0]["available"] == 0


def test_dashboard_summarises_a_thousand_clients(tmp_path):
    from rich.console import Console

    from dtemu.host.dashboard import DashboardState, render

    sc = scenario(clients=1000, **{"fl.sample": 100, "fl.rounds": 1})
    state = DashboardState.from_scenario(sc)
    run_emulation(sc, tmp_path / "r", work=StandIn(), observers=[state.observe])
    console = Console(width=120, record=True, file=open("/dev/null", "w"))
    console.print(render(state))
    text = console.export_text()
    assert len(text.splitlines()) < 40
    assert "asked 100 of 1000 available" in text and "stopped" in text and "1000" in text


def test_error_feedback_residuals_beyond_the_bound_are_spilled_and_come_back(tmp_path):
    from dtemu.core.fl.residuals import Residuals
    from dtemu.host.spill import DiskSpill

    store = Residuals(2, DiskSpill(tmp_path / "spill"))
    for i in range(4):
        store.put(f"client{i}", np.full(3, i, np.float32))
    assert list(store.memory) == ["client2", "client3"] and store.spilled == 2
    assert (store.take("client0") == 0).all() and "client0" not in store.spill
    store.forget("client1")
    assert store.take("client1") is None
    # a whole run: the same model with the residuals bounded as without
    base = {"fl.codec": "sq8", "fl.error_feedback": "true", "fl.sample": 4}
    free = run_emulation(scenario(**base), tmp_path / "free", work=StandIn())
    bounded = run_emulation(scenario(**base, **{"fl.residuals_in_memory": 2}), tmp_path / "bounded", work=StandIn())
    assert bounded["model_sha256"] == free["model_sha256"]
    assert (tmp_path / "bounded" / "spill").is_dir()
