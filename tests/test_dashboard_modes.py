"""The live dashboard shows each mode's own progress (host.progress), folded from the events of a
real emulated run: no event is left unread, and every node says what it is doing."""

import json

from rich.console import Console

from dtemu.core.ml.workload import Workload
from dtemu.core.scenario import parse_scenario
from dtemu.emu.run import run_emulation
from dtemu.host.dashboard import DashboardState, render
from tests.test_geo import StandIn, geo_scenario
from tests.test_ps_form import DATA


def folded(tmp_path, s, work):
    run_emulation(s, tmp_path / "run", work=work)
    state = DashboardState.from_scenario(s)
    for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines():
        state.observe(json.loads(line))
    assert state.bad_events == 0
    console = Console(record=True, width=200)
    console.print(render(state, "test"))
    return state, console.export_text()


def test_geo_shows_rounds_and_wan_bytes_per_site(tmp_path):
    state, text = folded(tmp_path, geo_scenario(), StandIn())
    local_ps = [v for name, v in state.nodes.items() if v.wan_bytes]
    assert local_ps and all(v.round == 12 for v in local_ps)
    assert "WAN" in text and "push to pull" in text


def test_ddp_shows_steps_with_the_compute_and_communication_split(tmp_path):
    s = parse_scenario({"name": "ddp-dash", "mode": "ddp", "model": "small_cnn", "threads": 1,
                        "ddp": {"workers": 2, "max_steps": 5, "batch_size": 16, "window": 1}})
    state, text = folded(tmp_path, s, Workload(s, DATA))
    assert state.unit == "step" and state.round == 5
    assert state.rounds_total == 5 and "step 5/5" in text and "compute" in state.nodes["worker0"].detail


def test_fl_esync_shows_each_clients_steps(tmp_path):
    from tests.test_fl_protocol import StandIn as FLStandIn
    from tests.test_server_opt import fl_scenario

    s = fl_scenario(**{"fl.algorithm": "esync", "compute.nodes.client5.slowdown": 4})
    state, text = folded(tmp_path, s, FLStandIn())
    fast, slow = state.nodes["client1"], state.nodes["client5"]
    assert fast.iterations > slow.iterations == 3     # one step a round for the straggler
    assert "steps this round" in fast.detail and "ss" in state.nodes
