"""A scenario's own task (core.ml.task) trains and is evaluated the same way in every mode:
a next-token model with integer inputs, a target per token and its own loss and counting, and an
image classification at another shape with the defaults.  Bad task code is the scenario's error."""

from __future__ import annotations

import json

import pytest

from dtemu.core.errors import ScenarioError
from dtemu.core.scenario import parse_scenario
from dtemu.emu.cli import main as emu_main
from dtemu.emu.run import run_emulation
from dtemu.host.scenario_file import load_scenario

SEQ = "toy_tasks:NextToken"
MODES = {
    "fl": {"fl": {"clients": 2, "rounds": 3, "batch_size": 16, "lr": 0.5}},
    "ddp": {"mode": "ddp", "ddp": {"workers": 2, "max_steps": 8, "batch_size": 16, "lr": 0.5}},
    # (the ps form of a scenario, read as FL's: SSGD, one step a round)
    "ps": {"mode": "ps", "ps": {"workers": 2, "rounds": 3, "batch_size": 16, "lr": 0.5, "algorithm": "ssgd"}},
    "geo": {"mode": "geo", "network": {"sites": {s: {"wan": {"up_mbps": 10, "down_mbps": 10, "latency_ms": 5}}
                                                 for s in ("c", "a", "b")}},
            "geo": {"workers_per_site": 1, "rounds": 6, "eval_every": 3, "batch_size": 16, "lr": 0.5,
                    "round_timeout_s": 5}},
}


def scenario(mode: str, task: str = SEQ, **extra):
    return parse_scenario({"name": f"task-{mode}", "seed": 2, "task": task, "targets": [0.5], **MODES[mode], **extra})


def test_a_task_without_a_cost_needs_one_for_emu(tmp_path):
    s = parse_scenario({"name": "t", "task": "toy_tasks:SmallColour", "fl": {"clients": 2, "rounds": 1}})
    with pytest.raises(ScenarioError, match="emu calibrate") as err:
        run_emulation(s, tmp_path / "run")
    assert err.value.path == "compute.default.train_s_per_sample"


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_sequence_task_trains_in_every_mode(mode, tmp_path):
    s = run_emulation(scenario(mode), tmp_path / mode)
    assert s["final_accuracy"] is not None and s["final_accuracy"] > 0.5, s["final_accuracy"]  # chance: 1/8
    assert s["model_sha256"]
    again = run_emulation(scenario(mode), tmp_path / f"{mode}-again")
    assert again["model_sha256"] == s["model_sha256"]


def test_counting_is_the_tasks_per_token_not_per_sample(tmp_path):
    from dtemu.core.ml.evaluation import evaluate
    from dtemu.core.ml.task import task_of
    from dtemu.core.ml.workload import Workload
    from dtemu.host.datasets import load_for

    s = scenario("fl")
    work = Workload(s, load_for(s))
    correct, counted = evaluate(work.new_model(), work.dataset.x_test, work.dataset.y_test, task=work.task)
    assert counted == 64 * 6 and 0 <= correct <= counted
    assert task_of(s.model_spec) is work.task


def test_an_image_task_at_another_shape_uses_the_default_loss(tmp_path):
    s = run_emulation(scenario("fl", task="toy_tasks:SmallColour",
                               compute={"default": {"train_s_per_sample": 1e-5}}), tmp_path / "colour")
    assert s["final_accuracy"] > 0.6


@pytest.mark.parametrize("task,message", [
    ("toy_tasks:NoModel", "has no model() method"),
    ("toy_tasks:FailingData", "task: task's data() 'toy_tasks:FailingData' failed: SystemExit: no data today"),
    ("toy_tasks:WrongData", "task: task 'toy_tasks:WrongData': data() returned str"),
    ("no_such_module_q:Task", "task: task 'no_such_module_q:Task' cannot be imported"),
])
def test_bad_task_code_is_exit_2_naming_the_task(task, message, tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: t\ntask: '{task}'\nfl: {{clients: 2, rounds: 1}}\n")
    assert emu_main(["run", str(path), "--no-tui", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "run").exists()


def test_what_cannot_go_with_a_task_is_refused_at_its_key(tmp_path):
    with pytest.raises(ScenarioError, match="supplies its own data") as err:
        parse_scenario({"name": "t", "task": SEQ, "data": {"factory": "toy_tasks:x"}})
    assert err.value.path == "data.factory"
    from dtemu.core.ml.workload import Workload
    from dtemu.host.datasets import load_for

    s = scenario("fl", data={"partition": "dirichlet"})
    with pytest.raises(ScenarioError, match="use iid") as err:
        Workload(s, load_for(s)).partitions
    assert err.value.path == "data.partition"
    path = tmp_path / "s.yaml"
    path.write_text(f"name: t\ntask: '{SEQ}'\n")
    with pytest.raises(ScenarioError, match="names code") as err:
        load_scenario(path, allow_code=False)
    assert err.value.path == "task"


def test_without_a_task_the_digest_is_what_it_was():
    plain = parse_scenario({"name": "t"})
    assert "task" not in json.dumps(plain.to_dict()) or plain.task is None
    assert parse_scenario({"name": "t", "task": SEQ}).digest() != plain.digest()
    assert plain.model_spec == "mnist_cnn" and parse_scenario({"name": "t", "task": SEQ}).model_spec == "task:" + SEQ


@pytest.mark.slow  # (the default run keeps under 10 minutes on 2 cores; issue 45)
def test_a_task_runs_for_real_and_ends_with_emus_model(tmp_path):
    """Every rank imports the task itself (here from tests/, on PYTHONPATH): the same model as emu."""
    import os
    from pathlib import Path

    pytest.importorskip("cyclonedds")
    from helpers import real_launch, scenario_file

    raw = {"name": "task-real", "seed": 2, "task": SEQ, "threads": 1,
           "fl": {"clients": 2, "rounds": 2, "batch_size": 16, "lr": 0.5, "min_clients": 2,
                  "round_timeout_s": 40, "barrier_timeout_s": 30}}
    emu = run_emulation(parse_scenario(raw), tmp_path / "emu")
    tests = str(Path(__file__).resolve().parent)
    code, out = real_launch(scenario_file(tmp_path, raw), tmp_path / "real", 100,
                            {"PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])})
    assert code == 0, out
    real = json.loads((tmp_path / "real" / "summary.json").read_text())
    assert real["model_sha256"] == emu["model_sha256"] and real["rounds"] == 2


SITES = {"network": {"sites": {"c": {}, "a": {}, "b": {}}}}


@pytest.mark.parametrize("mode", ["fl", "ps", "ddp", "geo", "geo-hfa"])
def test_task_code_that_raises_costs_its_node_the_round_not_the_run(mode, tmp_path):
    """FL (and ps's FedAsync, read as FL's): the node sends no update that round.  DDP and geo: its gradient that step is zero, so
    its peers are not left waiting for its share."""
    extra = {"fl": {"fl": {"clients": 3, "rounds": 4, "batch_size": 16, "lr": 0.5, "min_clients": 1,
                           "round_timeout_s": 5}},
             "ps": {"mode": "ps", "ps": {"workers": 3, "rounds": 4, "batch_size": 16, "lr": 0.5,
                                         "algorithm": "fedasync"}},
             "ddp": {"mode": "ddp", "ddp": {"workers": 2, "max_steps": 8, "batch_size": 16, "lr": 0.5}},
             "geo": {"mode": "geo", **SITES, "geo": {"workers_per_site": 2, "rounds": 4, "batch_size": 16}},
             "geo-hfa": {"mode": "geo", **SITES, "geo": {"workers_per_site": 2, "rounds": 4, "batch_size": 16,
                                                          "sync": "hfa", "k1": 1, "k2": 1}}}[mode]
    s = parse_scenario({"name": f"flaky-{mode}", "seed": 2, "task": "toy_tasks:Flaky", **extra})
    summary = run_emulation(s, tmp_path / mode)
    events = [json.loads(line) for line in (tmp_path / mode / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["kind"] == "train_failed"]
    assert failed and all("toy_tasks:Flaky" in e["error"] and "not to my liking" in e["error"] for e in failed)
    # the run went on to its end: rounds nobody could answer failed under the quorum rules, not the run
    # (FedAsync makes its versions whoever fails: a client given up is replaced)
    done = summary.get("steps") if mode == "ddp" else summary["rounds"] + (mode != "ps") * summary.get("rounds_failed", 0)
    assert done == (8 if mode == "ddp" else 4) and (mode == "ddp" or summary["rounds"] >= 1)
    assert summary["stop_reason"] == "done" and summary["model_sha256"]


@pytest.mark.parametrize("mode", ["fl", "ps"])
def test_a_task_may_bring_its_own_optimizer(mode, tmp_path):
    import toy_tasks

    extra = {"fl": {"fl": {"clients": 2, "rounds": 2, "batch_size": 16, "lr": 0.01}},
             "ps": {"mode": "ps", "ps": {"workers": 2, "rounds": 2, "batch_size": 16, "lr": 0.01,
                                         "algorithm": "ssgd"}}}[mode]
    sgd = run_emulation(parse_scenario({"name": "sgd", "task": "toy_tasks:NextToken", **extra}), tmp_path / "sgd")
    before = toy_tasks.WithAdam.made
    adam = run_emulation(parse_scenario({"name": "adam", "task": "toy_tasks:WithAdam", **extra}), tmp_path / "adam")
    # a fresh optimizer per client per round (ps's form too: it is FL's)
    assert toy_tasks.WithAdam.made - before == 4
    assert adam["model_sha256"] != sgd["model_sha256"] and adam["stop_reason"] == "done"
