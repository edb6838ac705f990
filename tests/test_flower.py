"""Flower apps under dtemu (mode flower, core.flower): an unmodified ServerApp and ClientApp over the
emulated network and clock, their faults, and their misbehaviour.  Needs the extra dtemu[flower]."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("flwr", reason="Flower is an optional extra: pip install 'dtemu[flower]'")

from dtemu.core.errors import AppError, ScenarioError  # noqa: E402
from dtemu.core.scenario import parse_scenario  # noqa: E402
from dtemu.emu.run import run_emulation  # noqa: E402
from dtemu.report.audit import audit  # noqa: E402

TOY = {"server_app": "tests.flower_toy:server", "client_app": "tests.flower_toy:client"}


def toy(run_config: dict | None = None, **sections) -> dict:
    raw = {"name": "flower_toy", "mode": "flower",
           "flower": {**TOY, "run_config": {"num-server-rounds": 2, **(run_config or {})}},
           "fl": {"clients": 3, "round_timeout_s": 5.0},
           "compute": {"default": {"train_s_per_sample": 0.001}}}
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return raw


def run(tmp_path: Path, raw: dict, name: str = "run", **kwargs) -> tuple[dict, list[dict]]:
    out = tmp_path / name
    summary = run_emulation(parse_scenario(raw), out, **kwargs)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return summary, events


def kinds(events, kind, node=None):
    return [e for e in events if e["kind"] == kind and (node is None or e["node"] == node)]


def test_a_flower_app_runs_its_rounds_over_the_emulated_network(tmp_path):
    summary, events = run(tmp_path, toy())
    assert summary["mode"] == "flower" and summary["rounds"] == 2 and summary["stop_reason"] == "done"
    assert summary["updates"] == {"accepted": 6, "evaluated": 6}
    assert summary["final_accuracy"] == pytest.approx(0.6)  # (0.5 + 0.6 + 0.7) / 3, equal examples
    # the ClientApp's cost is its reported examples times the node's cost per sample: client3's 30
    # examples take 0.03 s of virtual time, client1's 10 take 0.01 s
    done = {e["client"]: e["t"] for e in kinds(events, "update_accepted") if e["round"] == 1}
    assert done["client3"] - done["client1"] == pytest.approx(0.02, abs=1e-3)
    assert [e["round"] for e in kinds(events, "eval")] == [1, 2]
    assert summary["bytes_up"] > 0 and summary["bytes_down"] > 0
    assert audit(tmp_path / "run")["problems"] == []
    again, _ = run(tmp_path, toy(), name="again")
    assert again["model_sha256"] == summary["model_sha256"] and again["time_s"] == summary["time_s"]


def test_a_clientapp_that_raises_costs_its_round_one_update(tmp_path):
    summary, events = run(tmp_path, toy({"bad": "raise", "bad-client": 1, "bad-round": 1}))
    assert summary["rounds"] == 2 and summary["stop_reason"] == "done"
    assert summary["updates"] == {"accepted": 5, "client_error": 1, "evaluated": 6}
    failed = kinds(events, "client_app_failed")
    assert [(e["node"], e["round"], e["hung"]) for e in failed] == [("client2", 1, False)]
    assert "RuntimeError: boom in train" in failed[0]["error"]
    assert kinds(events, "round_close")[0]["clients"] == ["client1", "client3"]
    assert audit(tmp_path / "run")["problems"] == []


@pytest.mark.parametrize("bad, counted", [("wrong_type", "client_error"), ("nan", "invalid")])
def test_a_wrong_reply_is_counted_and_the_round_goes_on(tmp_path, bad, counted):
    raw = toy({"bad": bad, "bad-client": 0, "bad-round": 2})
    raw["flower"]["check_arrays"] = True
    summary, events = run(tmp_path, raw)
    assert summary["rounds"] == 2 and summary["updates"][counted] == 1 and summary["updates"]["accepted"] == 5
    if bad == "nan":  # refused by the server's inbox: the strategy never sees it, its bytes are charged
        assert "not finite" in kinds(events, "update_rejected")[0]["error"]
        assert summary["bytes_rejected"] > 0
        closed = kinds(events, "round_close")[1]
        assert closed["ended"] == "refused" and closed["timed_out"] is False   # every client answered
    assert audit(tmp_path / "run")["problems"] == []


def test_without_check_arrays_a_nan_reply_reaches_the_strategy_as_in_flower(tmp_path):
    summary, events = run(tmp_path, toy({"bad": "nan", "bad-client": 0, "bad-round": 2}))
    assert summary["updates"]["accepted"] == 6 and "invalid" not in summary["updates"]
    assert [e["ended"] for e in kinds(events, "round_close")] == ["all_in", "all_in"]


def test_a_clientapp_that_hangs_is_left_behind_and_the_round_closes_at_its_timeout(tmp_path):
    raw = toy({"bad": "hang", "bad-client": 2, "bad-round": 1, "hang-s": 3.0},
              flower={"call_limit_s": 0.3}, fl={"round_timeout_s": 2.0})
    summary, events = run(tmp_path, raw)
    assert summary["rounds"] == 2 and summary["updates"]["accepted"] == 5
    hung = kinds(events, "client_app_failed")
    assert [(e["node"], e["hung"]) for e in hung] == [("client3", True)]
    close = kinds(events, "round_close")[0]
    assert close["timed_out"] and close["clients"] == ["client1", "client2"]
    assert close["t"] == pytest.approx(2.0, abs=0.01)  # the round's timeout, on the emulated clock


def test_a_client_offline_for_a_round_misses_it_and_comes_back(tmp_path):
    raw = toy(fl={"barrier_require": "min_clients", "barrier_timeout_s": 0.1, "round_timeout_s": 1.0},
              faults={"offline": [{"node": "client2", "start_s": 0.0, "end_s": 0.5}]})
    summary, events = run(tmp_path, raw)
    closes = kinds(events, "round_close")
    assert closes[0]["clients"] == ["client1", "client3"] and closes[0]["timed_out"]
    assert closes[1]["clients"] == ["client1", "client2", "client3"]
    assert summary["rounds"] == 2 and audit(tmp_path / "run")["problems"] == []


def test_a_straggler_is_slower_in_emulated_time(tmp_path):
    fast, _ = run(tmp_path, toy())
    slow, _ = run(tmp_path, toy(compute={"nodes": {"client3": {"slowdown": 10.0}}}), name="slow")
    # client3's 30 examples x 1 ms, 9 times more, in each of 2 rounds
    assert slow["time_s"] - fast["time_s"] == pytest.approx(2 * 0.27, abs=0.005)
    assert slow["model_sha256"] == fast["model_sha256"]


def test_availability_decides_who_is_sent_to(tmp_path):
    raw = toy(fl={"availability": {"kind": "onoff", "mean_on_s": 0.05, "mean_off_s": 0.05},
                  "round_timeout_s": 0.2})
    summary, events = run(tmp_path, raw)
    sent = kinds(events, "flower_sent")
    assert sum(e["unavailable"] for e in sent) == summary["updates"].get("unavailable")
    assert summary["updates"]["unavailable"] > 0 and summary["stop_reason"] == "done"


def test_a_sealed_run_trains_the_open_runs_model(tmp_path):
    open_, _ = run(tmp_path, toy())
    sealed, _ = run(tmp_path, toy(), name="sealed", key=b"k" * 32)
    assert sealed["sealed"] and not open_["sealed"]
    assert sealed["model_sha256"] == open_["model_sha256"]


def test_a_serverapp_that_raises_ends_the_run_with_its_traceback(tmp_path):
    with pytest.raises(AppError, match="ValueError: the server app gives up"):
        run(tmp_path, toy({"server-raises": True}))
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    failed = kinds(events, "server_app_failed")
    assert "Traceback" in failed[0]["traceback"] and "flower_toy.py" in failed[0]["traceback"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "the ServerApp raised" in summary["stop_reason"]


def test_emu_exits_6_when_the_serverapp_raises(tmp_path, capsys):
    from dtemu.emu.cli import main

    path = tmp_path / "s.json"
    path.write_text(json.dumps(toy({"server-raises": True})))
    assert main(["run", str(path), "--out", str(tmp_path / "r"), "--no-tui"]) == 6
    assert "the ServerApp raised ValueError" in capsys.readouterr().err


@pytest.mark.parametrize("change, key", [
    ({"flower": {"server_app": None, "client_app": None}}, "flower"),
    ({"fl": {"codec": "q8"}}, "fl.codec"),
    ({"fl": {"algorithm": "fedadam"}}, "fl.algorithm"),
    ({"faults": {"crashes": [{"node": "server", "at": "mid_round", "round": 1}]}}, "faults.crashes[0].at"),
])
def test_what_a_flower_run_cannot_do_is_refused_at_load(change, key):
    raw = toy()
    for section, value in change.items():
        raw[section] = {**raw.get(section, {}), **value}
    with pytest.raises(ScenarioError) as err:
        parse_scenario(raw)
    assert err.value.path == key


def test_no_code_refuses_a_flower_app_and_a_bad_app_is_a_scenario_error(tmp_path):
    from dtemu.host.scenario_file import refuse_code
    from dtemu.host.flower_app import load_app

    with pytest.raises(ScenarioError, match="names code"):
        refuse_code(parse_scenario(toy()))
    raw = toy()
    raw["flower"]["client_app"] = "tests.flower_toy:server"
    with pytest.raises(ScenarioError, match="not a Flower ClientApp"):
        load_app(parse_scenario(raw))
    raw["flower"]["client_app"], raw["flower"]["server_app"] = TOY["client_app"], "tests.flower_toy:legacy_server"
    with pytest.raises(ScenarioError, match="legacy ServerApp"):
        load_app(parse_scenario(raw))
    raw["flower"]["server_app"] = TOY["server_app"]
    raw["flower"]["client_app"] = "tests.no_such_module:client"
    with pytest.raises(ScenarioError, match="cannot be imported"):
        load_app(parse_scenario(raw))


APP_TOML = """
[tool.flwr.app.components]
serverapp = "tests.flower_toy:server"
clientapp = "tests.flower_toy:client"

[tool.flwr.app.config]
num-server-rounds = 2
lr = 0.1

[tool.flwr.app.config.model]
name = "cnn"
width = 8
"""


def _app_scenario(tmp_path, run_config: str = "") -> Path:
    """An app folder with a nested run config, and a scenario beside it naming it relative to itself."""
    (tmp_path / "apps" / "myapp").mkdir(parents=True)
    (tmp_path / "apps" / "myapp" / "pyproject.toml").write_text(APP_TOML)
    path = tmp_path / "apps" / "run.yaml"
    path.write_text("name: myapp\nmode: flower\nflower:\n  app_dir: myapp\n" + run_config
                    + "fl: {clients: 2}\ncompute: {default: {train_s_per_sample: 0.001}}\n")
    return path


def test_the_run_config_is_flat_as_flowers_and_app_dir_is_relative_to_the_scenario(tmp_path, monkeypatch):
    from dtemu.host.flower_app import load_app
    from dtemu.host.scenario_file import load_scenario

    path = _app_scenario(tmp_path, "  run_config: {model: {width: 16}}\n")
    monkeypatch.chdir(tmp_path)   # another working directory than the repository's
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))   # (tests.flower_toy)
    s = load_scenario(path, ["flower.run_config.lr=0.2"])
    assert Path(s.flower.app_dir) == (tmp_path / "apps" / "myapp").resolve()
    assert s.flower.run_config == {"model.width": 16, "lr": 0.2}
    app = load_app(s)
    assert app.client_context(1).run_config == {"num-server-rounds": 2, "lr": 0.2, "model.name": "cnn",
                                                "model.width": 16}
    # where it lies is not what it trains: the digest is the app's, wherever the checkout is
    assert s.digest() == load_scenario(path, ["flower.run_config.lr=0.2", f"flower.app_dir={tmp_path}/x/myapp"]).digest()
    with pytest.raises(ScenarioError) as err:
        load_app(load_scenario(path, ["flower.run_config.model.depth=3"]))
    assert err.value.path == "flower.run_config.model.depth" and "model.name, model.width" in str(err.value)


def test_a_nested_run_config_ships_to_worker_processes(tmp_path, monkeypatch):
    from dtemu.host.flower_jobs import context_bytes, context_from_bytes
    from dtemu.host.flower_app import load_app
    from dtemu.host.scenario_file import load_scenario

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))
    context = load_app(load_scenario(_app_scenario(tmp_path))).client_context(1)
    assert context_from_bytes(context_bytes(context)).run_config["model.name"] == "cnn"


def test_without_the_extra_the_run_is_refused_naming_it(monkeypatch):
    import importlib.util

    from dtemu.host import flower_app

    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flwr" else real_find(name, *a))
    with pytest.raises(ScenarioError, match=r"dtemu\[flower\]"):
        flower_app.load_app(parse_scenario(toy()))


def _instruction(dst: int, arrays=None):
    import numpy as np
    from flwr.app import ArrayRecord, Message, RecordDict

    from dtemu.core.flower.server import _identify

    _identify()
    msg = Message(RecordDict({"arrays": ArrayRecord([np.zeros(3, np.float32) if arrays is None else arrays])}),
                  dst, "train")
    msg.metadata.__dict__["_message_id"] = "dtemu-1"
    return msg


def test_the_inbox_answers_what_every_reply_is():
    import numpy as np
    from flwr.app import ArrayRecord, Message, RecordDict

    from dtemu.core.flower import wire
    from dtemu.core.flower.server import Asked, reply_inbox
    from dtemu.core.runtime.verdict import ACCEPTED, DUPLICATE, LATE, REFUSED
    from dtemu.core.wire.auth import Sealer

    ins = _instruction(7)
    inbox = reply_inbox(Sealer(None, "server"), check_arrays=True)
    ask = lambda: inbox.ask("dtemu-1", None, about=Asked("client1", 1, "train", wire.arrays_of(ins)),  # noqa: E731
                            sender="client1")
    ask()

    def reply(values):
        return wire.encode(wire.REPLY, Message(RecordDict({"arrays": ArrayRecord([values])}), reply_to=ins))

    offer = inbox.offer
    assert offer("client1", b"DTFW\x01\x02garbage").reason == "malformed"
    assert offer("client1", b"junk").reason == "malformed"
    assert offer("client1", wire.encode(wire.STOP)).reason == "not_a_reply"
    assert offer("client2", reply(np.ones(3, np.float32))).reason == "wrong_sender"
    assert offer("client1", reply(np.ones(4, np.float32))).kind == REFUSED  # not the shape it was sent
    ask()   # (a fresh instruction)
    assert offer("client1", reply(np.ones(3, np.float32))).kind == ACCEPTED
    assert offer("client1", reply(np.ones(3, np.float32))).kind == DUPLICATE
    ask()
    inbox.close(["dtemu-1"])
    assert inbox.unanswered(["dtemu-1"]) == ["dtemu-1"]   # closed, with no answer: the call timed out
    assert offer("client1", reply(np.ones(3, np.float32))).kind == LATE
    assert offer("client1", reply(np.ones(3, np.float32))).kind == DUPLICATE
    other = _instruction(7)
    other.metadata.__dict__["_message_id"] = "dtemu-9"   # never sent
    assert offer("client1", wire.encode(wire.REPLY, Message(RecordDict(), reply_to=other))).reason == "not_asked"
    sealed = reply_inbox(Sealer(b"k" * 32, "server"))
    assert sealed.offer("client1", reply(np.ones(3, np.float32))).reason == "unsigned"


def test_a_replys_arrays_are_the_apps_to_judge_unless_dtemu_is_asked_to_check_them():
    """As Flower delivers them: another dtype (FedAdam's float64 under NumPy 2, answered in float32),
    another shape, NaN, part of the model.  flower.check_arrays refuses them, as before."""
    import numpy as np
    from flwr.app import ArrayRecord, Message, RecordDict

    from dtemu.core.flower import wire
    from dtemu.core.flower.server import Asked, reply_inbox
    from dtemu.core.runtime.verdict import ACCEPTED, REFUSED
    from dtemu.core.wire.auth import Sealer

    ins = _instruction(7, np.zeros(3, np.float64))
    odd = [np.ones(3, np.float32), np.ones(4, np.float64), np.array([np.nan, 1.0, 2.0])]
    for check, verdict in ((False, ACCEPTED), (True, REFUSED)):
        for values in odd:
            inbox = reply_inbox(Sealer(None, "server"), check_arrays=check)
            inbox.ask("dtemu-1", None, about=Asked("client1", 1, "train", wire.arrays_of(ins)), sender="client1")
            reply = wire.encode(wire.REPLY, Message(RecordDict({"arrays": ArrayRecord([values])}), reply_to=ins))
            got = inbox.offer("client1", reply)
            assert got.kind == verdict, (check, values.dtype, values.shape, got.error)
            assert check or got.message.content.array_records["arrays"]  # the app gets them as sent


def test_the_dashboard_reads_every_event_of_a_flower_run(tmp_path):
    from rich.console import Console

    from dtemu.host.dashboard import DashboardState, render

    s = parse_scenario(toy({"bad": "raise", "bad-client": 0, "bad-round": 2}))
    run_emulation(s, tmp_path / "run")
    state = DashboardState.from_scenario(s)
    for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines():
        state.observe(json.loads(line))
    assert state.bad_events == 0 and state.accepted == 5
    console = Console(record=True, width=200)
    console.print(render(state, "test"))
    assert "round 2/2" in console.export_text()


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_clientapp_calls_in_worker_processes_give_the_same_run(tmp_path, executor):
    """--jobs 2: each call runs in a worker as soon as its instruction is sent, with the client's Context
    shipped there and back; the events (but the calls' wall and CPU times) and the model are a serial run's."""
    raw = toy({"bad": "raise", "bad-client": 1, "bad-round": 2, "num-server-rounds": 3},
              faults={"crashes": [{"node": "client3", "round": 2, "at": "during_train", "restart_after_s": 0.0}]})
    if executor == "ray":
        pytest.importorskip("ray", reason="Ray is not installed (pip install 'dtemu[ray]')")
    serial, one = run(tmp_path, raw, name="serial")
    pooled, two = run(tmp_path, raw, name="pooled", jobs=2, executor=executor)
    assert pooled["emu"]["executor"]["kind"] == executor and pooled["emu"]["executor"]["jobs"] == 2
    strip = lambda events: [{k: v for k, v in e.items() if k not in ("wall_s", "cpu_s")} for e in events]  # noqa: E731
    assert strip(one) == strip(two) and pooled["model_sha256"] == serial["model_sha256"]
    assert kinds(two, "client_app_failed") and kinds(two, "node_down")


def test_dropouts_and_a_partition_cost_their_updates_and_are_accounted_for(tmp_path):
    raw = toy({"num-server-rounds": 3}, fl={"round_timeout_s": 1.0},
              faults={"dropout_p": 0.3, "partitions": [{"nodes": ["client1"], "start_s": 0.0, "end_s": 1.5}]})
    summary, events = run(tmp_path, raw)
    dropped = kinds(events, "dropout")
    assert dropped and all(e["node"] != "server" for e in dropped)
    cut = [e for e in kinds(events, "fault") if e["fault"] == "partition"]
    assert cut and {e["node"] for e in cut} <= {"server", "client1"}
    assert summary["stop_reason"] == "done" and summary["rounds"] + summary["rounds_failed"] == 3
    assert summary["updates"]["accepted"] <= 9 - len(dropped) - 1  # the dropouts and client1's cut round
    assert audit(tmp_path / "run")["problems"] == []


def test_emu_report_reads_a_flower_run(tmp_path):
    from dtemu.emu.cli import main

    run(tmp_path, toy())
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "report")]) == 0
    table = (tmp_path / "report" / "report.md").read_text()
    assert "| flower | emu | 2 | 0.6000 |" in table


def test_the_serverapps_own_work_is_charged_to_the_server_by_the_arrays_it_handled(tmp_path):
    free, events = run(tmp_path, toy())
    gaps = kinds(events, "server_app", "server")
    assert [g["call"] for g in gaps] == ["send_and_receive"] * 4  # train and evaluate, two rounds
    assert all(g["wall_s"] >= 0 and g["cpu_s"] >= 0 for g in gaps)
    # what it sends (the model once: one content for every node) and the replies it was last given
    # (three trained models after a train call; none after an evaluate call)
    model = gaps[0]["nbytes"]
    assert model > 0 and [g["nbytes"] for g in gaps] == [model, 4 * model, model, 4 * model]
    costs = {"train_s_per_sample": 0.001, "app_s_per_mb": 2000.0}   # 2 ms per kB: visible at this size
    priced, _ = run(tmp_path, toy(compute={"default": costs}), name="priced")
    assert priced["time_s"] - free["time_s"] == pytest.approx(sum(g["nbytes"] for g in gaps) * 2000.0 / 1e6)
    assert priced["model_sha256"] == free["model_sha256"]
    slow, _ = run(tmp_path, toy(compute={"default": costs, "nodes": {"server": {"slowdown": 2.0}}}), name="slow")
    assert slow["time_s"] - free["time_s"] == pytest.approx(2 * (priced["time_s"] - free["time_s"]))


def test_calibrate_prices_an_apps_calls_and_its_serverapps_work():
    from dtemu.emu.costs import flower_sets

    sets = dict(a.split("=") for a in flower_sets(parse_scenario(toy()), reps=3))
    assert set(sets) == {f"compute.default.{k}" for k in ("train_s_per_sample", "eval_s_per_sample", "app_s_per_mb")}
    assert all(float(v) > 0 for v in sets.values())


def test_an_apps_calls_are_priced_in_cpu_seconds_over_the_share(monkeypatch):
    """emu calibrate under a share: the calls' CPU seconds (flower_sets) in the share's seconds, per
    example too, times the reference model's contention; the messages' prices, already in the share's
    seconds (emu.calibrate._message_sets), only times the contention."""
    from dtemu.emu import calibrate

    monkeypatch.setattr("dtemu.emu.costs.flower_sets", lambda scenario, reps: [
        "compute.default.train_s_per_sample=1.0e-03", "compute.default.app_s_per_mb=2.0e-03"])
    monkeypatch.setattr(calibrate, "_message_sets", lambda share=None, over="shm": ["compute.default.recv_s_per_mb=4.0e-03"])
    monkeypatch.setattr(calibrate, "_app_contention", lambda *a: (1.5, {"model": "small_cnn"}))
    monkeypatch.setattr("dtemu.emu.costs.seal_cost", lambda reps: 0.0)
    sets = calibrate.measure(parse_scenario(toy()), reps=1, together=True, share=0.25)["sets"]
    assert sets["compute.default.train_s_per_sample"] == pytest.approx(1e-3 / 0.25 * 1.5)
    assert sets["compute.default.app_s_per_mb"] == pytest.approx(2e-3 / 0.25 * 1.5)
    assert sets["compute.default.recv_s_per_mb"] == pytest.approx(4e-3 * 1.5)


def _toy_app_folder(tmp_path: Path, federation: str = "") -> Path:
    folder = tmp_path / "toy_app"
    folder.mkdir()
    (folder / "pyproject.toml").write_text(
        '[project]\nname = "toy-app"\n\n[tool.flwr.app.components]\nserverapp = "tests.flower_toy:server"\n'
        'clientapp = "tests.flower_toy:client"\n\n[tool.flwr.app.config]\nnum-server-rounds = 2\n' + federation)
    return folder


def test_emu_runs_a_flower_app_folder_without_a_scenario_and_says_what_to_change(tmp_path, capsys):
    from dtemu.emu.cli import main

    folder = _toy_app_folder(tmp_path, '\n[tool.flwr.federations]\ndefault = "local"\n\n'
                                       '[tool.flwr.federations.local]\noptions.num-supernodes = 3\n')
    assert main(["run", "--flower-app", str(folder), "--out", str(tmp_path / "runs" / "one"), "--no-tui"]) == 0
    said = capsys.readouterr().out
    written = tmp_path / "runs" / "toy-app.yaml"
    assert f"emu run {written}" in said and "network.default" in said and "fl.clients" in said
    raw = yaml.safe_load(written.read_text())
    assert raw["mode"] == "flower" and raw["fl"]["clients"] == 3   # the app's own federation
    assert set(raw["compute"]["default"]) == {"train_s_per_sample", "eval_s_per_sample", "app_s_per_mb"}
    summary = json.loads((tmp_path / "runs" / "one" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["stop_reason"] == "done"
    # the file it wrote runs as it is, from anywhere, to the same model
    assert main(["run", str(written), "--out", str(tmp_path / "again"), "--no-tui"]) == 0
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["model_sha256"] == summary["model_sha256"]


def test_a_run_takes_a_scenario_or_a_flower_app_and_a_folder_that_is_no_app_is_refused(tmp_path, capsys):
    from dtemu.emu.cli import main
    from dtemu.real.cli import main as real

    assert main(["run", "--no-tui"]) == 2 and "one of them" in capsys.readouterr().err
    assert real(["launch", "--no-tui"]) == 2 and "one of them" in capsys.readouterr().err
    assert main(["run", "--flower-app", str(tmp_path), "--no-tui"]) == 2
    assert "no Flower app" in capsys.readouterr().err


def test_an_apps_own_model_is_followed_by_the_reference_models_step():
    """A Flower app's model is its own: the step its prices move with is small_cnn's, timed as its
    clients train (here one alone)."""
    from dtemu.emu.calibrate import _app_contention

    contention, reference = _app_contention(parse_scenario(toy()), False, None, 1)
    assert contention == 1.0 and reference["model"] == "small_cnn" and reference["ranks"] == 1
    assert reference["s_per_sample"] > 0
