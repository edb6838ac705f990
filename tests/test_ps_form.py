"""Mode ps is a form, not a mode (issue 45): a ``ps:`` scenario is checked as it always was and read as
the FL scenario it is (core.fl.ps_form), with notes that say what became what; FL's keys that the
form needs (fl.init, fl.max_time_s) work in any FL run.

A synthetic, learnable data set (class = a bright bar's row) keeps these fast and independent of
the MNIST archives; virtual time is exact, so no sleeps.
"""

import json

import numpy as np
import pytest
import torch

from dtemu.core import events as ev
from dtemu.core.errors import ScenarioError
from dtemu.core.ml.data import Dataset
from dtemu.core.ml.models import build_model, xavier_init
from dtemu.core.ml.params import flatten, sha256_of
from dtemu.core.ml.workload import Workload
from dtemu.core.scenario import parse_scenario
from dtemu.emu.run import run_emulation


def synthetic(n_train=960, n_test=200, seed=0) -> Dataset:
    g = torch.Generator().manual_seed(seed)

    def make(n):
        y = torch.randint(0, 10, (n,), generator=g)
        x = torch.rand((n, 1, 28, 28), generator=g) * 0.3
        for c in range(10):  # a bright bar whose row says the class
            x[y == c, 0, 2 + 2 * c: 4 + 2 * c, 4:24] += 1.0
        return x, y

    xt, yt = make(n_train)
    xs, ys = make(n_test)
    return Dataset("synthetic", xt, yt, xs, ys)


DATA = synthetic()


def raw_ps(**ps):
    """A mode ps scenario's mapping: ``ps.workers`` workers (4), the second half ``slow`` times slower."""
    slow = ps.pop("slow", 10.0)
    workers = ps.get("workers", 4)
    return {"name": "ps-test", "mode": "ps", "model": "small_cnn", "targets": [0.5, 0.9],
            "ps": {"workers": workers, "rounds": 4, "lr": 0.05, **ps},
            "network": {"default": {"latency_ms": 0.1}},
            "compute": {"nodes": {f"worker{k}": {"slowdown": slow} for k in range(workers // 2 + 1, workers + 1)}}}


def scenario(**ps):
    return parse_scenario(raw_ps(**ps))


def run(tmp_path, s, name="run"):
    summary = run_emulation(s, tmp_path / name, work=Workload(s, DATA))
    events = [json.loads(line) for line in (tmp_path / name / "events.jsonl").read_text().splitlines()]
    assert ev.problems(events) == []
    return summary, events


# --- the translation ----------------------------------------------------------------------------

@pytest.mark.parametrize("ps, fl", [
    ({"algorithm": "esync", "max_local_iterations": 5, "query_timeout_s": 2.0},
     {"algorithm": "esync", "subset": None, "esync.max_iterations": 5, "esync.query_timeout_s": 2.0}),
    ({"algorithm": "esync", "fixed_iterations": 3, "batch_size": 16},
     {"algorithm": "fedavg", "subset": 48, "batch_size": 16}),
    ({"algorithm": "ssgd", "global_lr": 0.5}, {"algorithm": "fedavg", "subset": 32, "server_lr": 0.5}),
    ({"algorithm": "asgd"}, {"algorithm": "asgd", "subset": 32}),
    ({"algorithm": "dcasgd", "dcasgd_lambda": 0.1}, {"algorithm": "dcasgd", "subset": 32, "dcasgd_lambda": 0.1}),
    ({"algorithm": "fedavg", "local_epochs": 2}, {"algorithm": "fedavg", "subset": None, "epochs": 2}),
    ({"algorithm": "fedasync", "fedasync_alpha": 0.3, "staleness": "hinge", "hinge_b": 2.0},
     {"algorithm": "fedasync", "fedasync.alpha": 0.3, "fedasync.staleness": "hinge", "fedasync.hinge_b": 2.0}),
    ({"algorithm": "feddrop", "feddrop_k_hat": 1}, {"algorithm": "feddrop", "feddrop.k_hat": 1}),
    ({"algorithm": "feddrop"}, {"algorithm": "fedavg"}),                      # dropping none is FedAvg
    ({"algorithm": "tifl", "tifl_workers_per_round": 2, "tifl_credits": [10, 1]},
     {"algorithm": "tifl", "sample": 2, "tifl.credits": [10, 1]}),
])
def test_each_ps_rule_is_the_fl_rule_of_its_keys(ps, fl):
    s = scenario(**ps)
    assert s.mode == "fl" and s.fl.clients == 4 and s.fl.init == "xavier"
    for key, want in fl.items():
        value = s.fl
        for part in key.split("."):
            value = getattr(value, part)
        assert value == want, key


def test_the_nodes_keep_their_parts_under_fl_names():
    raw = raw_ps(algorithm="esync", min_workers=2, round_timeout_s=7, max_time_s=30)
    raw["compute"]["nodes"].update({"ps": {"slowdown": 2.0}, "ss": {"slowdown": 3.0}})
    raw["faults"] = {"offline": [{"node": "worker1", "start_s": 1, "end_s": 2}],
                     "partitions": [{"nodes": ["worker2", "ss"], "start_s": 1, "end_s": 2}]}
    s = parse_scenario(raw)
    assert s.node_names == ["controller", "client1", "client2", "client3", "client4", "ss"]
    assert set(s.compute.nodes) == {"controller", "ss", "client3", "client4"}
    assert s.compute_for("controller").slowdown == 2.0 and s.compute_for("ss").slowdown == 3.0
    assert s.faults.offline[0].node == "client1" and s.faults.partitions[0].nodes == ["client2", "ss"]
    assert (s.fl.min_clients, s.fl.round_timeout_s, s.fl.max_time_s) == (2, 7, 30)
    # without ESync's adaptive rule there is no state server: its settings go, and a note says so
    raw = raw_ps(algorithm="ssgd")
    raw["compute"]["nodes"]["ss"] = {"slowdown": 3.0}
    raw["faults"] = {"offline": [{"node": "ss", "start_s": 1}, {"node": "worker2", "start_s": 1}]}
    notes = []
    s = parse_scenario(raw, notes=notes)
    assert "ss" not in s.node_names and "ss" not in s.compute.nodes
    assert [w.node for w in s.faults.offline] == ["client2"]
    assert any("compute.nodes.ss" in n for n in notes) and any("faults.offline" in n for n in notes)
    assert notes[0].startswith("mode ps is read as mode fl")


@pytest.mark.parametrize("ps, key", [
    ({"algorithm": "ssgd", "max_local_iterations": 3}, "ps.max_local_iterations"),
    ({"algorithm": "esync", "fixed_iterations": 2, "max_local_iterations": 3}, "ps.max_local_iterations"),
    ({"algorithm": "esync", "max_local_iterations": 0}, "ps.max_local_iterations"),
    ({"min_workers": 9}, "ps.min_workers"),
    ({"feddrop_k_hat": 4}, "ps.feddrop_k_hat"),
    ({"rounds": "many"}, "ps.rounds"),
    ({"learning_rate": 0.1}, "ps.learning_rate"),
])
def test_a_bad_ps_key_is_refused_by_its_ps_name(ps, key):
    with pytest.raises(ScenarioError) as err:
        scenario(**ps)
    assert key in str(err.value)


@pytest.mark.parametrize("section, value", [("compute", "fast"), ("network", [1]), ("faults", {"offline": "x"})])
def test_a_malformed_section_of_a_ps_scenario_is_refused_by_its_key(section, value):
    raw = raw_ps()
    raw[section] = value
    with pytest.raises(ScenarioError) as err:
        parse_scenario(raw)
    assert section in str(err.value)


def test_a_ps_scenario_with_fl_keys_is_refused_and_overrides_use_the_ps_names():
    raw = raw_ps()
    raw["fl"] = {"clients": 3}
    with pytest.raises(ScenarioError, match="mode ps takes its keys from ps:"):
        parse_scenario(raw)
    s = parse_scenario(raw_ps(), ["ps.workers=6", "ps.algorithm=asgd", "compute.nodes.worker6.slowdown=5"])
    assert (s.fl.clients, s.fl.algorithm, s.compute_for("client6").slowdown) == (6, "asgd", 5)


def test_loading_a_ps_file_prints_what_it_became(tmp_path, capsys):
    from dtemu.host.scenario_file import load_scenario

    path = tmp_path / "old.yaml"
    path.write_text(json.dumps(raw_ps(algorithm="ssgd", eval_every_s=5)))
    s = load_scenario(path)
    err = capsys.readouterr().err
    assert s.fl.algorithm == "fedavg" and "note: mode ps is read as mode fl" in err
    assert "fl.subset 32" in err and "ps.eval_every_s" in err


def test_the_shipped_esync_scenarios_are_fl():
    from pathlib import Path

    from dtemu.host.scenario_file import load_scenario

    root = Path(__file__).resolve().parents[1] / "scenarios"
    esync, ssgd = load_scenario(root / "esync.yaml"), load_scenario(root / "ssgd_hetero.yaml")
    assert (esync.mode, esync.fl.algorithm, esync.node_names[-1], esync.fl.init) == ("fl", "esync", "ss", "xavier")
    assert (ssgd.fl.algorithm, ssgd.fl.subset, ssgd.fl.batch_size) == ("fedavg", 32, 32)
    assert esync.compute_for("client7").slowdown == ssgd.compute_for("client12").slowdown == 150


# --- FL's keys the form needs ----------------------------------------------------------------------

def test_xavier_init_is_the_first_model_and_the_default_keeps_the_digest():
    s = scenario(algorithm="fedavg")
    work = Workload(s, DATA)
    want = flatten(xavier_init(build_model(s.model_spec, seed=s.seed), s.seed))
    assert np.array_equal(work.xavier_weights, want)
    assert not np.array_equal(work.initial_weights, want)
    fl = {"name": "d", "fl": {"clients": 2}}
    base = parse_scenario(fl).digest()
    assert parse_scenario(fl, ["fl.init=seeded", "fl.max_time_s=5"]).digest() == base   # (digests before the keys)
    assert parse_scenario(fl, ["fl.init=xavier"]).digest() != base


def test_a_ps_esync_run_is_fls_esync(tmp_path):
    s = scenario(algorithm="esync")
    summary, events = run(tmp_path, s)
    assert summary["mode"] == "fl" and summary["rounds"] == 4 and summary["stop_reason"] == "done"
    assert summary["state_server"]["queries"] > 0
    steps = {e["node"]: e["steps"] for e in events if e["kind"] == "upload_start" and e["round"] == 2}
    assert steps["client3"] == steps["client4"] == 1 and steps["client1"] > 1   # the fast fill the slow's time
    again, _ = run(tmp_path, s, "again")
    assert again["model_sha256"] == summary["model_sha256"]   # deterministic for a seed


@pytest.mark.parametrize("algorithm", ["ssgd", "asgd"])
def test_max_time_stops_after_the_round_that_reaches_it_and_evaluates_it(tmp_path, algorithm):
    s = scenario(algorithm=algorithm, rounds=10_000, max_time_s=0.05, eval_every=1000)
    summary, events = run(tmp_path, s)
    done = summary["rounds"]
    assert 0 < done < 10_000 and "fl.max_time_s" in summary["stop_reason"]
    closes = [e["t"] for e in events if e["kind"] == "round_close"]
    evals = [e for e in events if e["kind"] == "eval"]
    assert closes[-2] < 0.05 <= evals[-1]["t"]     # the round before had not reached it
    assert evals[-1]["round"] == done              # the last round is evaluated, whatever eval_every says
