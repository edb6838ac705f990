"""ESync as an FL rule (fl.algorithm esync, core.fl.esync): each client trains a step at a time and
asks the state server, a node of its own, whether to go on; FedAvg aggregates.  Its training a step
at a time gives the bits of training at once (core.ml.train.LocalTraining), and in emu the fast
clients run more iterations than the slow one, with every codec, sampling and seal."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dtemu.core.errors import ScenarioError
from dtemu.core.ml.params import flatten
from dtemu.core.ml.train import LocalTraining, train_local
from dtemu.emu.run import run_emulation
from dtemu.host.rundir import read_events
from dtemu.report.audit_fl import check_fl
from tests.test_fl_protocol import StandIn
from tests.test_server_opt import KEY, fl_scenario   # (6 clients, 3 rounds, fast links)


def of(events, kind, **match):
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


# --- a step at a time is training at once -----------------------------------------------------

def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3))


def test_steps_one_at_a_time_give_the_bits_of_training_at_once():
    x, y = torch.randn(50, 5), torch.randint(0, 3, (50,))
    idx = np.arange(3, 50, 2)   # 24 samples: batches of 7, 7, 7, 3 an epoch
    once = _model()
    result = train_local(once, x, y, idx, epochs=2, batch_size=7, lr=0.1, momentum=0.5, seed=11, proximal_mu=0.01)
    steps = LocalTraining(_model(), x, y, idx, batch_size=7, lr=0.1, momentum=0.5, seed=11, proximal_mu=0.01)
    other = LocalTraining(_model(), x, y, idx, batch_size=7, lr=0.1, seed=5)
    sizes = []
    for _ in range(2 * steps.per_epoch):
        sizes.append(steps.next_batch)
        steps.run(1)
        other.run(1)   # another client's steps in between (emu interleaves them): no bit moves
    assert sizes == [7, 7, 7, 3] * 2
    assert np.array_equal(steps.weights(), flatten(once))
    assert steps.result() == result and result.steps == 8 and result.samples == 48


# --- in emu -----------------------------------------------------------------------------------

def esync(**sets):
    return fl_scenario(**{"fl.algorithm": "esync", "compute.nodes.client5.slowdown": 4, **sets})


def test_the_fast_clients_train_more_and_all_arrive_together(tmp_path):
    sc = esync()
    assert sc.node_names[-1] == "ss" and sc.node_names[5] == "client5"   # the clients keep their ranks
    summary = run_emulation(sc, tmp_path / "run", work=StandIn())
    events = read_events(tmp_path / "run")
    assert summary["rounds"] == 3 and summary["rounds_failed"] == 0
    assert summary["updates"] == {"accepted": 18}
    steps = {e["node"]: e["steps"] for e in of(events, "upload_start", round=2)}
    assert steps["client5"] == 1 and all(steps[c] > 1 for c in steps if c != "client5")
    ss = summary["state_server"]
    assert ss["queries"] == sum(ss["answers"].values()) > 0 and ss["rejected"] == {}
    # every update weighs by the data its client holds, whatever its iterations (ESync's n_k)
    assert {e["num_samples"] for e in of(events, "update_accepted")} == {100}
    assert check_fl(events, summary, True, sc.to_dict())[1] == []


def test_a_cap_on_iterations_and_a_silent_state_server(tmp_path):
    capped = run_emulation(esync(**{"fl.esync.max_iterations": 2}), tmp_path / "capped", work=StandIn())
    steps = {e["steps"] for e in of(read_events(tmp_path / "capped"), "upload_start")}
    assert steps <= {1, 2} and 2 in steps and capped["rounds"] == 3
    # the state server gone once the run began: each question times out as SYNC, and the rounds go on
    sc = esync(**{"fl.esync.query_timeout_s": 0.05, "faults.offline": [{"node": "ss", "start_s": 0.001, "end_s": 1e9}]})
    summary = run_emulation(sc, tmp_path / "silent", work=StandIn())
    events = read_events(tmp_path / "silent")
    assert summary["rounds"] == 3 and summary["rounds_failed"] == 0
    assert {e["steps"] for e in of(events, "upload_start")} == {1}


def test_sampled_rounds_search_the_straggler_among_their_own_clients(tmp_path):
    sc = esync(**{"fl.sample": 0.5})
    summary = run_emulation(sc, tmp_path / "run", work=StandIn(), key=KEY)
    events = read_events(tmp_path / "run")
    assert summary["rounds"] == 3 and summary["sealed"] and summary["state_server"]["rejected"] == {}
    for e in of(events, "sampled"):
        assert len(e["clients"]) == 3
    assert summary["updates"] == {"accepted": 9}


@pytest.mark.parametrize("sets, key", [
    ({"fl.algorithm": "fedavg", "fl.esync.max_iterations": 3}, "fl.esync"),
    ({"fl.algorithm": "esync", "fl.esync.max_iterations": 0}, "fl.esync.max_iterations"),
    ({"fl.algorithm": "esync", "fl.esync.query_timeout_s": -1}, "fl.esync.query_timeout_s"),
])
def test_esync_keys_are_refused_out_of_place_or_range(sets, key):
    with pytest.raises(ScenarioError) as err:
        fl_scenario(**sets)
    assert key in str(err.value)


def test_an_esync_run_resumes_from_its_checkpoint(tmp_path):
    """The resumed controller begins round 3 anew: the state server's first RESET of it goes back from
    nothing, so every record starts afresh, and the clients ask as in any round."""
    run_emulation(esync(**{"fl.rounds": 2}), tmp_path / "part", work=StandIn())
    init = (tmp_path / "part" / "checkpoint.dtck").read_bytes()
    resumed = run_emulation(esync(**{"fl.rounds": 4}), tmp_path / "resumed", init=init, work=StandIn())
    events = read_events(tmp_path / "resumed")
    assert resumed["rounds"] == 4 and resumed["rounds_failed"] == 0
    assert [e["round"] for e in of(events, "round_start")] == [3, 4]
    steps = {e["node"]: e["steps"] for e in of(events, "upload_start", round=4)}
    assert steps["client5"] == 1 and max(steps.values()) > 1


def test_the_shipped_scenario_is_esync_in_fl():
    from pathlib import Path

    from dtemu.host.scenario_file import load_scenario

    sc = load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "esync.yaml")
    assert (sc.mode, sc.fl.algorithm, sc.node_names[0], sc.node_names[-1]) == ("fl", "esync", "controller", "ss")
    assert len(sc.node_names) == 14 and sc.kind.readers_of(sc)["ps/state"] == {"ss"}


def test_a_client_waiting_for_an_answer_takes_stop_at_once(tmp_path):
    """The state server gone: each question waits its timeout (here 100 s), but the controller's Stop
    (or a newer round) ends the wait; the clients do not outlive the run by a timeout."""
    sc = esync(**{"fl.rounds": 2, "fl.esync.query_timeout_s": 100,
                  "faults.offline": [{"node": "ss", "start_s": 0.001, "end_s": 1e9}]})
    summary = run_emulation(sc, tmp_path / "run", work=StandIn())
    events = read_events(tmp_path / "run")
    assert summary["rounds_failed"] == 2 and summary["time_s"] < 5
    stops = of(events, "client_stop")
    assert len(stops) == 6 and max(e["t"] for e in stops) < 5
    assert {e["round"] for e in of(events, "cmd_skipped")} == {1, 2}   # each round's work dropped
