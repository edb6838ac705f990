"""emu validate's comparison: each mode's units (core.modes.units) and the errors over them
(emu.fidelity); the rows of docs/fidelity.md (tools/fidelity.py)."""

import json

import pytest

from dtemu.host.scenario_file import load_scenario
from dtemu.core.modes import units
from dtemu.emu.fidelity import compare
from dtemu.host.resolve import resolve


def _flat(u: dict) -> dict:
    return {k: pytest.approx(v) for k, v in u.items()}


def test_fl_rounds_run_from_close_to_close_less_the_slowest_training_they_took():
    events = [{"kind": "round_close", "node": "controller", "round": r, "t": 3.0 * r,
               "clients": ["client1", "client2"] if r == 2 else []} for r in (1, 2, 3)]
    events += [{"kind": "train_start", "node": c, "round": 2, "t": 3.5} for c in ("client1", "client2")]
    events += [{"kind": "upload_start", "node": "client1", "round": 2, "t": 4.5},
               {"kind": "upload_start", "node": "client2", "round": 2, "t": 5.5}]
    assert units.leader_rounds(events, "controller") == {2: (3.0, 1.0), 3: (3.0, 3.0)}


def test_an_asynchronous_version_takes_the_training_of_the_update_it_applied():
    # FedAsync: version 5 closes at 10.0 with client2's update, trained on version 3 from 8.0 to 9.5
    events = [{"kind": "round_close", "node": "controller", "round": 4, "t": 9.0, "clients": ["client1"]},
              {"kind": "round_close", "node": "controller", "round": 5, "t": 10.0, "clients": ["client2"]},
              {"kind": "train_start", "node": "client2", "round": 3, "t": 8.0},
              {"kind": "upload_start", "node": "client2", "round": 3, "t": 9.5}]
    assert units.leader_rounds(events, "controller") == _flat({5: (1.0, -0.5)})


def test_an_asynchronous_versions_communication_is_its_updates_trip():
    """FedAsync: version 5 took client2's update from version 3 (staleness 1, command round 4); its
    communication is that update's way up and the way down of the model it trained from, each one
    message's comm_s (no two clocks compared), not the version's time less a training."""
    events = [{"kind": "round_close", "node": "controller", "round": 4, "t": 9.0, "clients": ["client1"]},
              {"kind": "deliver", "node": "client2", "topic": "train/model_blob", "t": 7.0, "comm_s": 0.3},
              {"kind": "deliver", "node": "client2", "topic": "train/model_blob", "t": 7.9, "comm_s": 0.4},
              {"kind": "train_start", "node": "client2", "round": 4, "t": 8.0},
              {"kind": "upload_start", "node": "client2", "round": 4, "t": 9.5},
              {"kind": "deliver", "node": "client2", "topic": "train/model_blob", "t": 9.8, "comm_s": 0.9},
              {"kind": "update_accepted", "node": "controller", "client": "client2", "round": 5, "staleness": 1,
               "comm_s": 0.25, "t": 9.9},
              {"kind": "round_close", "node": "controller", "round": 5, "t": 10.0, "clients": ["client2"]}]
    assert units.leader_rounds(events, "controller") == _flat({5: (1.0, 0.65)})



def test_the_model_an_update_trained_from_is_the_last_to_arrive_not_the_last_taken():
    """A real client may take its command first and a model that arrived with it only after training
    (its deliver event's time): the trip counts the model by its arrival, sent_at + comm_s (the
    receiver's received_at, so still no two clocks compared), as emu's client, which took it first."""
    events = [{"kind": "round_close", "node": "controller", "round": 4, "t": 9.0, "clients": ["client1"]},
              {"kind": "deliver", "node": "client2", "topic": "train/model_blob", "t": 7.0, "sent_at": 6.7,
               "comm_s": 0.3},
              {"kind": "train_start", "node": "client2", "round": 4, "t": 8.0},
              {"kind": "upload_start", "node": "client2", "round": 4, "t": 9.5},
              # arrived at 7.9, before the training began; taken at 9.7, after it
              {"kind": "deliver", "node": "client2", "topic": "train/model_blob", "t": 9.7, "sent_at": 7.5,
               "comm_s": 0.4},
              {"kind": "update_accepted", "node": "controller", "client": "client2", "round": 5, "staleness": 1,
               "comm_s": 0.25, "t": 9.9},
              {"kind": "round_close", "node": "controller", "round": 5, "t": 10.0, "clients": ["client2"]}]
    assert units.leader_rounds(events, "controller") == _flat({5: (1.0, 0.65)})

def test_ddp_steps_are_the_workers_mean():
    events = [{"kind": "step", "node": w, "step": 1, "compute_s": 0.2, "compress_s": c, "comm_s": m}
              for w, c, m in (("worker1", 0.0, 0.5), ("worker2", 0.1, 0.3))]
    assert units.ddp_steps(events, "worker1") == _flat({1: (0.65, 0.4)})


def test_geo_rounds_are_the_root_ps_closes():
    events = [{"kind": "geo_round", "node": "global-ps", "round": r, "t": r * 0.8} for r in (1, 2, 3)]
    events += [{"kind": "geo_round", "node": "a-ps", "round": 2, "t": 99.0, "role": "local_ps", "wan_s": 0.1}]
    events += [{"kind": "geo_step", "node": "a-w0", "round": 2, "compute_s": 0.3}]
    assert units.geo_rounds(events, "master") == _flat({2: (0.8, 0.5), 3: (0.8, 0.8)})


def test_every_mode_names_its_units():
    for path in ("scenarios/fl_codecs.yaml", "scenarios/ddp_baseline.yaml", "scenarios/esync.yaml",
                 "scenarios/geo_hips.yaml"):
        assert callable(resolve(load_scenario(path).kind.units))


def _folder(tmp_path, name, close_every, sha, testbed=None):
    folder = tmp_path / name
    folder.mkdir()
    events = [{"kind": "round_close", "node": "controller", "round": r, "t": close_every * r} for r in range(1, 5)]
    folder.joinpath("events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    folder.joinpath("summary.json").write_text(json.dumps({"model_sha256": sha, **({"testbed": testbed} if testbed else {})}))
    return folder


def test_errors_are_emu_against_real_with_the_testbeds_verdict(tmp_path):
    s = load_scenario("scenarios/fl_codecs.yaml")
    real = _folder(tmp_path, "real", 2.0, "abc", {"faithful": True, "why": []})
    emu = _folder(tmp_path, "emu", 2.1, "abc")
    r = compare(s, real, emu)
    assert r["units"] == 3 and r["unit"] == "round"
    assert r["time_error"] == pytest.approx(0.05) and r["comm_error"] == pytest.approx(0.05)
    assert r["same_model"] and r["faithful"] and r["within_targets"]   # (5.0% is within 5%)
    # (its rounds took no training: each was its deadline, and the record says so)
    assert len(r["warnings"]) == 1 and r["warnings"][0].startswith("no unit of either run took any training")
    r = compare(s, _folder(tmp_path, "real2", 2.0, "abc", {"faithful": False, "why": ["x"]}),
                _folder(tmp_path, "emu2", 2.0, "abd"))
    assert r["time_error"] == 0.0 and not r["same_model"] and not r["faithful"] and r["testbed_why"] == ["x"]
    # its errors are within the targets, but an unfaithful testbed's result does not count
    assert r["errors_within_targets"] and not r["within_targets"]


def test_several_draws_of_emus_timing_predict_each_unit_by_their_mean_and_show_their_band(tmp_path):
    """emu validate --draws: one draw of the machines' variation can land 8% either side of the next
    (FedAsync's comm, notebook entry 48); the prediction is the draws' mean, their spread the band."""
    s = load_scenario("scenarios/fl_codecs.yaml")
    real = _folder(tmp_path, "real", 2.0, "abc", {"faithful": True, "why": []})
    draws = [_folder(tmp_path, "emu", 1.8, "abc"), _folder(tmp_path, "emu-draw1", 2.3, "abd"),
             _folder(tmp_path, "emu-draw2", 2.05, "abd")]
    r = compare(s, real, draws)
    assert r["emu_s"] == pytest.approx(2.05) and r["time_error"] == pytest.approx(0.025)
    assert [u["emu_s"] for u in r["per_unit"]] == pytest.approx([2.05] * 3)
    assert r["draws"]["count"] == 3 and r["draws"]["emu_s"] == pytest.approx([1.8, 2.3, 2.05])
    assert r["draws"]["time_error"] == pytest.approx([-0.1, 0.15, 0.025])
    assert r["same_model"]   # the seed's own draw's model (the first)
    # one folder, or a list of one, is the plain comparison, without a band
    one = compare(s, real, draws[0])
    assert "draws" not in one and one == compare(s, real, [draws[0]])


def test_the_rows_of_the_issue():
    from tools.fidelity import ROWS

    assert list(ROWS) == ["fl_fp32", "fl_q8_sampled_sealed", "fedasync", "ddp_dense", "ddp_dgc", "esync",
                          "geo_hips", "geo_bisparse_fp16", "flower"]
    for row in ROWS.values():
        load_scenario(row.scenario, row.sets)   # each row's settings are a valid scenario


def test_the_held_out_rows_are_valid_and_not_the_tables():
    from tools.fidelity import HELD_OUT, ROWS

    assert HELD_OUT and not set(HELD_OUT) & set(ROWS)
    for row in HELD_OUT.values():
        load_scenario(row.scenario, row.sets)


def test_no_warning_where_a_unit_trained():
    from dtemu.emu.fidelity import _warnings

    rows = [{"unit": 2, "real_s": 1.0, "emu_s": 1.0, "real_comm_s": 0.4, "emu_comm_s": 1.0}]
    assert _warnings(rows) == [] and _warnings([]) == []


def test_a_miss_that_sits_in_the_first_unit_is_said_and_still_counted(tmp_path):
    """The first compared round 40% slow on the testbed, the rest as emu says: the verdict counts it,
    and the record says where the miss sits."""
    s = load_scenario("scenarios/fl_codecs.yaml")

    def folder(name, closes):
        f = tmp_path / name
        f.mkdir()
        events = [{"kind": "round_close", "node": "controller", "round": r, "t": t} for r, t in enumerate(closes, 1)]
        f.joinpath("events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        f.joinpath("summary.json").write_text(json.dumps({"model_sha256": "a", "testbed": {"faithful": True}}))
        return f

    r = compare(s, folder("real", [1.0, 2.4, 3.4, 4.4, 5.4]), folder("emu", [1.0, 2.0, 3.0, 4.0, 5.0]))
    assert not r["within_targets"] and r["miss_in_first_unit"]
    assert r["without_first_unit"] == {"first_unit": 2, "time_error": 0.0, "comm_error": 0.0}
    assert any(w.startswith("the miss sits in the first compared round (round 2") for w in r["warnings"])
    r = compare(s, folder("real2", [1.0, 2.0, 3.0, 4.0, 5.0]), folder("emu2", [1.0, 2.0, 3.0, 4.0, 5.0]))
    assert r["within_targets"] and not r["miss_in_first_unit"]


def test_the_why_it_misses_column_appears_only_where_a_row_missed():
    from tools.fidelity import markdown

    def rec(i, comm):
        return {"repetition": i, "unit": "round", "units": 5, "real_s": 2.0, "emu_s": 2.0, "real_comm_s": 1.0,
                "emu_comm_s": 1.0 + comm, "time_error": 0.0, "comm_error": comm, "same_model": True, "faithful": True,
                "within_targets": abs(comm) <= 0.05, "draws": {"comm_error": [comm]}}

    met = markdown({"fl_fp32": [rec(1, 0.01), rec(2, -0.02)]})
    assert "why it misses" not in met and met.splitlines()[2].endswith("**2 of 2** |")
    missed = markdown({"fl_fp32": [rec(1, 0.01)], "geo_hips": [rec(1, 0.08)]})
    head, _, hit, miss = missed.splitlines()
    assert head.endswith("| why it misses |") and hit.endswith("**1 of 1** |  |")
    assert miss.endswith("comm emu 1.080 vs 1.000 |")
