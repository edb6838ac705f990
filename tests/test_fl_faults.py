"""The FL fault matrix in emu: each fault at a protocol point, in virtual time, exact.

Three clients, four rounds, the stand-in workload of test_fl_protocol (training
takes 1 s of virtual time, a round times out at 2 s).  Each test states what
must hold afterwards: rounds completed, updates accepted / rejected / late, and
whether the final model is the fault-free one (it must be wherever the fault
should not change it: nothing is lost and nothing counted twice).
"""

import pytest

from dtemu.core.errors import DtemuError
from dtemu.host.rundir import read_events
from dtemu.core.scenario import parse_scenario
from dtemu.emu.run import run_emulation
from test_fl_protocol import StandIn, of

BASE = {
    "name": "faults",
    "fl": {"clients": 3, "rounds": 4, "subset": 1000, "round_timeout_s": 2.0, "min_clients": 1},
    "network": {"default": {"up_mbps": 1000, "down_mbps": 1000, "latency_ms": 1}},
}


def scenario(faults=None, **sets):
    return parse_scenario({**BASE, "faults": faults or {}}, [f"{k}={v}" for k, v in sets.items()])


def run(tmp_path, sc, name="run"):
    out = tmp_path / name
    summary = run_emulation(sc, out, work=StandIn())
    return summary, read_events(out)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    summary, _ = run(tmp_path_factory.mktemp("clean"), scenario())
    assert summary["rounds"] == 4 and summary["updates"] == {"accepted": 12}
    return summary


def crash(node, round_, at, restart_after_s=0.2):
    return {"crashes": [{"node": node, "round": round_, "at": at, "restart_after_s": restart_after_s}]}


def contributors(events, round_):
    return of(events, "round_close", round=round_)[-1]["clients"]


@pytest.mark.parametrize("at", ["before_train", "during_train", "mid_upload"])
def test_client_crash_loses_its_round_and_rejoins(tmp_path, at):
    summary, events = run(tmp_path, scenario(crash("client2", 2, at)))
    assert summary["rounds"] == 4 and summary["updates"] == {"accepted": 11}
    assert contributors(events, 2) == ["client1", "client3"]  # round 2 closed at its timeout without it
    assert of(events, "round_close", round=2)[0]["timed_out"]
    assert "client2" in contributors(events, 3)  # back with the latest model one round later
    assert len(of(events, "node_up", node="client2")) == 2


def test_crash_mid_upload_leaves_half_an_update_on_the_wire(tmp_path):
    sc = scenario(crash("client2", 2, "mid_upload"), **{"network.default.up_mbps": 0.01})  # 16 floats: ~70 ms
    summary, events = run(tmp_path, sc)
    start = of(events, "upload_start", node="client2", round=2)[0]
    down = [e for e in of(events, "node_down", node="client2") if e["t"] >= start["t"]][0]
    assert 0 < down["t"] - start["t"] < start["bytes"] * 8 / 1e4  # before the upload could end
    assert not of(events, "update_accepted", client="client2", round=2)


def test_client_crash_after_upload_loses_nothing_it_sent(tmp_path):
    summary, events = run(tmp_path, scenario(crash("client2", 2, "after_upload")))
    assert "client2" in contributors(events, 2)  # its update was on the wire: it counts
    # down when round 3's command went out (2 ms later), back for round 4
    assert "client2" not in contributors(events, 3) and "client2" in contributors(events, 4)
    assert summary["updates"] == {"accepted": 11}


def test_client_that_never_comes_back(tmp_path):
    summary, events = run(tmp_path, scenario(crash("client3", 1, "during_train", None)))
    assert summary["rounds"] == 4 and summary["updates"] == {"accepted": 8}
    assert all(contributors(events, r) == ["client1", "client2"] for r in (1, 2, 3, 4))


@pytest.mark.parametrize("at", ["mid_round", "before_checkpoint", "after_checkpoint"])
def test_controller_killed_and_restarted_from_its_checkpoint(tmp_path, clean, at):
    """No completed round lost or counted twice: the final model is the fault-free one."""
    summary, events = run(tmp_path, scenario(crash("controller", 2, at, restart_after_s=0.5)))
    assert summary["rounds"] == 4 and summary["rounds_failed"] == 0
    assert summary["model_sha256"] == clean["model_sha256"]
    assert len(of(events, "node_up", node="controller")) == 2
    assert [e["round"] for e in of(events, "checkpoint")] == [1, 2, 3, 4]  # each round saved once
    resumed = of(events, "resume")[0]["round"]
    assert resumed == (2 if at == "after_checkpoint" else 1)
    if at == "mid_round":
        # the clients re-send the update the dead controller never saw
        assert len(of(events, "update_resent", round=2)) == 3


def test_controller_that_never_restarts_is_reported(tmp_path):
    with pytest.raises(DtemuError, match="crashed and was not restarted"):
        run(tmp_path, scenario(crash("controller", 2, "mid_round", None)))


def test_duplicated_and_reordered_messages_change_nothing(tmp_path, clean):
    sc = scenario({"duplicate_p": 0.5, "reorder_s": 0.05})
    summary, events = run(tmp_path, sc)
    dups = of(events, "fault", fault="duplicate")
    assert len(dups) > 5
    assert summary["rounds"] == 4 and summary["updates"]["accepted"] == 12
    # copies that arrive in their round are duplicates, later ones late; none is used twice
    assert summary["updates"]["duplicate"] + summary["updates"].get("late", 0) >= 1
    assert summary["model_sha256"] == clean["model_sha256"]


def test_message_loss_costs_rounds_never_hangs(tmp_path):
    summary, events = run(tmp_path, scenario({"message_loss": 0.2}, **{"fl.rounds": 10}))
    lost = of(events, "fault", fault="message_lost")
    assert lost and summary["rounds"] + summary["rounds_failed"] == 10
    accepted = summary["updates"]["accepted"]
    assert accepted == len(of(events, "update_accepted")) < 30
    assert accepted == sum(e["ready"] for e in of(events, "round_close"))


def test_late_update_from_an_earlier_round_is_counted_not_used(tmp_path):
    summary, events = run(tmp_path, scenario({"corrupt": [{"node": "client3", "kind": "stale", "rounds": [3]}]}))
    assert summary["updates"] == {"accepted": 11, "late": 1}
    assert contributors(events, 3) == ["client1", "client2"]


def test_partition_isolates_a_client_for_two_rounds(tmp_path):
    # client3 is cut off from 0.9 s to 5.1 s: rounds 1 (its update), 2 and 3 go on without it.
    summary, events = run(tmp_path, scenario({"partitions": [{"nodes": ["client3"], "start_s": 0.9, "end_s": 5.1}]}))
    assert summary["rounds"] == 4
    cut = [r for r in (1, 2, 3, 4) if "client3" not in contributors(events, r)]
    assert cut == [1, 2, 3]
    assert of(events, "fault", fault="partition") and of(events, "fault", fault="partition_end")
    assert "client3" in contributors(events, 4)  # the next model and command reach it once healed


def test_every_client_gone_for_a_round_is_retried(tmp_path):
    offline = [{"node": f"client{i}", "start_s": 0.5, "end_s": 1.9} for i in (1, 2, 3)]
    sc = scenario({"offline": offline}, **{"fl.on_failed_round": "retry"})
    summary, events = run(tmp_path, sc)
    assert [e["attempt"] for e in of(events, "round_start", round=1)] == [0, 1]
    assert summary["rounds"] == 4 and summary["rounds_failed"] == 1


def test_every_client_gone_for_good_stops_with_a_clear_reason(tmp_path):
    offline = [{"node": f"client{i}", "start_s": 0.5} for i in (1, 2, 3)]
    sc = scenario({"offline": offline}, **{"fl.on_failed_round": "retry", "fl.max_retries": 2})
    summary, _ = run(tmp_path, sc)
    # three attempts at round 1, then the policy's limit: go on, nothing to aggregate
    assert summary["rounds"] == 0 and summary["rounds_failed"] == 3 + 3 + 3 + 3


@pytest.mark.parametrize("kind, counted", [("nan", "rejected"), ("inf", "rejected"), ("garbage", "rejected"),
                                           ("scale", "rejected")])
def test_corrupt_updates_are_rejected_and_counted(tmp_path, clean, kind, counted):
    sc = scenario({"corrupt": [{"node": "client2", "kind": kind, "rounds": [2, 3]}]}, **{"fl.max_update_norm": 10})
    summary, events = run(tmp_path, sc)
    assert summary["rounds"] == 4 and summary["updates"] == {"accepted": 10, counted: 2}
    assert [e["round"] for e in of(events, "update_rejected", client="client2")] == [2, 3]


def test_fault_runs_are_deterministic(tmp_path):
    faults = {"message_loss": 0.1, "duplicate_p": 0.2, "reorder_s": 0.02,
              **crash("client1", 2, "mid_upload"), "partitions": [{"nodes": ["client2"], "start_s": 3, "end_s": 4}]}
    a, _ = run(tmp_path, scenario(faults), "a")
    b, _ = run(tmp_path, scenario(faults), "b")
    assert (tmp_path / "a" / "events.jsonl").read_bytes() == (tmp_path / "b" / "events.jsonl").read_bytes()
    assert {k: v for k, v in a.items() if k != "wall_time_s"} == {k: v for k, v in b.items() if k != "wall_time_s"}


@pytest.mark.parametrize("faults, path", [
    ({"crashes": [{"node": "client1", "round": 1, "at": "mid_round"}]}, "faults.crashes[0].at"),
    ({"crashes": [{"node": "controller", "round": 1, "at": "mid_upload"}]}, "faults.crashes[0].at"),
    ({"crashes": [{"node": "client9", "round": 1}]}, "faults.crashes[0].node"),
    ({"crashes": [{"node": "client1", "round": 9}]}, "faults.crashes[0].round"),
    ({"partitions": [{"nodes": ["client1"], "start_s": 3, "end_s": 2}]}, "faults.partitions[0].end_s"),
    ({"partitions": [{"nodes": ["controller", "client1", "client2", "client3"], "start_s": 0, "end_s": 2}]},
     "faults.partitions[0].nodes"),
    ({"corrupt": [{"node": "controller"}]}, "faults.corrupt[0].node"),
    ({"corrupt": [{"node": "client1", "rounds": [0]}]}, "faults.corrupt[0].rounds[0]"),
    ({"message_loss": 1.5}, "faults.message_loss"),
])
def test_fault_specs_that_cannot_work_are_refused(faults, path):
    from dtemu.core.errors import ScenarioError
    with pytest.raises(ScenarioError) as info:
        scenario(faults)
    assert info.value.path == path


def test_a_crash_and_an_offline_window_that_overlap(tmp_path):
    """Down from a crash, 'crashed' again by a window, restarted by whichever ends first: one node."""
    faults = {**crash("client2", 2, "before_train", restart_after_s=2.0),
              "offline": [{"node": "client2", "start_s": 1.5, "end_s": 2.5}]}
    summary, events = run(tmp_path, scenario(faults))
    assert summary["rounds"] == 4
    ups = [e["t"] for e in of(events, "node_up", node="client2")]
    assert len(ups) == 2 and ups[1] == pytest.approx(2.5)


def test_crash_during_training_lands_halfway_through_the_job(tmp_path):
    """One behaviour in both runtimes: the node dies after half the job's modelled duration,
    and the job (whose result dies with it) is not run."""
    trained = []

    class Counting(StandIn):
        def train(self, weights, cmd, client):
            trained.append((client, cmd.round))
            return super().train(weights, cmd, client)

    out = tmp_path / "run"
    run_emulation(scenario(crash("client2", 2, "during_train")), out, work=Counting())
    events = read_events(out)
    fault = of(events, "fault", node="client2", fault="crash")[0]
    start = of(events, "train_start", node="client2", round=2)[0]
    down = [e for e in of(events, "node_down", node="client2") if e["t"] >= fault["t"]][0]
    modelled = start["samples"] * StandIn.reference_cost
    assert down["t"] == pytest.approx(fault["t"] + modelled / 2, abs=1e-9)
    assert (2, 2) not in trained and (2, 3) in trained
