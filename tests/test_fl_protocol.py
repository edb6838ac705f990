"""The controller's timeout / quorum logic in virtual time, with a stand-in workload.

The stand-in trains instantly and deterministically (weights + client/100), so
these tests are exact about *when* things happen: compute time is modelled as
samples * cost * slowdown, network time by emu.network.
"""

from dataclasses import dataclass

import numpy as np
import pytest

from dtemu.core.errors import BarrierTimeout, CheckpointError
from dtemu.host.rundir import read_events, read_summary
from dtemu.core.scenario import parse_scenario
from dtemu.emu.run import run_emulation

COST = 0.001  # modelled seconds per sample


@dataclass
class _Result:
    samples: int
    steps: int
    mean_loss: float


class StandIn:
    """The Workload interface, with no PyTorch."""

    dim = 16
    test_size = 100
    reference_cost = COST

    def __init__(self):
        self.initial_weights = np.zeros(self.dim, np.float32)

    def subset_size(self, client, subset):
        return subset or 1000

    def train(self, weights, cmd, client):
        n = self.subset_size(client, cmd.subset) * cmd.epochs
        return weights + np.float32(client / 100), _Result(n, n // 10, 1.0 / cmd.round)

    def evaluate(self, weights):
        return float(weights.mean())

    def local_training(self, weights, cmd, client):
        return _Steps(weights, client, self.subset_size(client, cmd.subset))


class _Steps:
    """ESync's training a step at a time (core.ml.train.LocalTraining's interface): each step of
    batches of 100 adds client/1000."""

    def __init__(self, weights, client, n):
        self.w, self.client, self.indices, self.steps = weights.copy(), client, np.arange(n), 0
        self.next_batch = min(100, n)

    def run(self, steps):
        self.w += np.float32(self.client / 1000) * steps
        self.steps += steps

    def weights(self):
        return self.w

    def result(self):
        return _Result(self.steps * self.next_batch, self.steps, 1.0)


def scenario(**sets):
    raw = {
        "name": "proto",
        "fl": {"clients": 3, "rounds": 3, "subset": 1000, "round_timeout_s": 2.0, "min_clients": 1},
        # fast links: 1 Gbit/s, 1 ms latency; 16 floats travel in ~2 ms
        "network": {"default": {"up_mbps": 1000, "down_mbps": 1000, "latency_ms": 1}},
    }
    return parse_scenario(raw, [f"{k}={v}" for k, v in sets.items()])


def run(tmp_path, sc, init=None, name="run"):
    out = tmp_path / name
    summary = run_emulation(sc, out, init=init, work=StandIn())
    return summary, read_events(out)


def of(events, kind, **match):
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


def test_all_in_time_every_round_complete(tmp_path):
    summary, events = run(tmp_path, scenario())
    assert summary["rounds"] == 3 and summary["rounds_failed"] == 0
    assert summary["updates"] == {"accepted": 9}
    for close in of(events, "round_close"):
        assert close["ready"] == 3 and not close["timed_out"]
        assert close["note"] == "final-ready=3/3 (min=1)"
    # each client trains 1000 samples at 1 ms: a round takes 1 s plus a few ms of network
    start, close = of(events, "round_start", round=1)[0], of(events, "round_close", round=1)[0]
    assert 1.0 < close["t"] - start["t"] < 1.05
    # weights moved by the sample-weighted mean of the clients' deltas, 3 rounds of (1+2+3)/3/100
    assert summary["final_accuracy"] == pytest.approx(0.06, abs=1e-6)


def test_straggler_dropped_at_exactly_the_timeout(tmp_path):
    # client3 needs 3 s per round; the round closes at 2 s with the other two.
    sc = scenario(**{"compute.nodes.client3.slowdown": 3})
    summary, events = run(tmp_path, sc)
    for r in (1, 2, 3):
        start, close = of(events, "round_start", round=r)[0], of(events, "round_close", round=r)[0]
        assert close["t"] == pytest.approx(start["t"] + 2.0, abs=1e-9)
        assert close["ready"] == 2 and close["timed_out"] and close["clients"] == ["client1", "client2"]
        assert close["note"] == "final-ready=2/3 (min=1)"
    # its round-1 update arrives during round 2 and is discarded as late
    late = of(events, "update_late", client="client3")
    assert late and late[0]["round"] == 1 and late[0]["current"] == 2
    assert summary["updates"]["late"] == len(late)
    assert summary["rounds"] == 3


def test_late_straggler_skips_overtaken_commands(tmp_path):
    # client3 needs 5 s per round, rounds close every 2 s
    sc = scenario(**{"compute.nodes.client3.slowdown": 5, "fl.rounds": 5})
    summary, events = run(tmp_path, sc)
    trained = [e["round"] for e in of(events, "train_start") if e["node"] == "client3"]
    # busy with round 1 until 5 s; by then the commands of rounds 2 and 3 and the model of
    # round 2 are queued: it skips round 2 and trains round 3 from the newest model
    assert trained[:2] == [1, 3]
    assert [e["round"] for e in of(events, "cmd_skipped", node="client3")][0] == 2
    assert summary["updates"]["late"] >= 1  # its round-1 update came after round 1 closed


def test_round_with_no_update_continues(tmp_path):
    sc = scenario(**{"compute.default.slowdown": 5})  # everyone needs 5 s, timeout 2 s
    summary, events = run(tmp_path, sc)
    assert summary["rounds"] == 0 and summary["rounds_failed"] == 3
    assert [e["ready"] for e in of(events, "round_failed")] == [0, 0, 0]
    assert summary["final_accuracy"] == 0.0  # the model never moved


def test_round_with_no_update_can_stop_the_run(tmp_path):
    sc = scenario(**{"compute.default.slowdown": 5, "fl.on_failed_round": "stop"})
    summary, events = run(tmp_path, sc)
    assert summary["rounds_failed"] == 1 and "round 1 got 0" in summary["stop_reason"]
    assert of(events, "run_end")[0]["reason"] == summary["stop_reason"]


def test_failed_round_is_retried_with_a_new_seed(tmp_path):
    # quorum 3 but client3 is too slow: round 1 fails, is retried max_retries times, then skipped
    sc = scenario(**{"compute.nodes.client3.slowdown": 3, "fl.min_clients": 3, "fl.rounds": 1,
                     "fl.on_failed_round": "retry", "fl.max_retries": 2})
    summary, events = run(tmp_path, sc)
    assert [e["attempt"] for e in of(events, "round_start")] == [0, 1, 2]
    assert summary["rounds_failed"] == 3
    # the first attempt's late updates never count toward the retry
    assert all(e["round"] == 1 for e in of(events, "update_late"))


def test_barrier_names_who_is_missing(tmp_path):
    sc = parse_scenario({"name": "b", "fl": {"clients": 3, "barrier_timeout_s": 5},
                         "faults": {"offline": [{"node": "client2", "start_s": 0, "end_s": 50}]}})
    with pytest.raises(BarrierTimeout) as info:
        run(tmp_path, sc)
    assert info.value.missing == ["client2"]


def test_barrier_waits_for_a_late_joiner(tmp_path):
    sc = scenario(**{"faults.offline": '[{node: client2, start_s: 0, end_s: 3}]', "fl.barrier_timeout_s": 5})
    summary, events = run(tmp_path, sc)
    barrier = of(events, "barrier")[0]
    assert barrier["missing"] == [] and barrier["t"] == pytest.approx(3.0)
    assert summary["rounds"] == 3 and summary["updates"]["accepted"] == 9


def test_barrier_can_start_with_a_quorum(tmp_path):
    sc = scenario(**{"faults.offline": "[{node: client2, start_s: 0}]", "fl.barrier_timeout_s": 5,
                     "fl.barrier_require": "min_clients"})
    summary, events = run(tmp_path, sc)
    assert of(events, "barrier")[0]["missing"] == ["client2"]
    assert summary["rounds"] == 3


def test_crashed_client_rejoins_with_the_latest_model(tmp_path):
    # client2 crashes mid-training in round 2 (t=1.5) and is back at 3.5, in round 3
    sc = scenario(**{"fl.rounds": 5, "faults.offline": "[{node: client2, start_s: 1.5, end_s: 3.5}]"})
    summary, events = run(tmp_path, sc)
    closes = {e["round"]: e for e in of(events, "round_close")}
    assert "client2" not in closes[2]["clients"]
    assert "client2" in closes[5]["clients"]
    # after the restart it received a model blob before training again
    restart_t = [e["t"] for e in of(events, "node_up") if e["node"] == "client2"][-1]
    blob = [e for e in of(events, "deliver", topic="train/model_blob") if e["node"] == "client2" and e["t"] >= restart_t]
    train = [e for e in of(events, "train_start") if e["node"] == "client2" and e["t"] >= restart_t]
    assert blob and train and blob[0]["t"] <= train[0]["t"]
    assert summary["rounds"] == 5


def test_dropout_is_deterministic_and_logged(tmp_path):
    sc = scenario(**{"faults.dropout_p": 0.5, "fl.rounds": 6})
    s1, e1 = run(tmp_path, sc, name="a")
    s2, e2 = run(tmp_path, sc, name="b")
    drops = of(e1, "dropout")
    assert drops and drops == of(e2, "dropout")
    for d in drops:
        close = of(e1, "round_close", round=d["round"])[0]
        assert d["node"] not in close["clients"]


def test_resume_from_checkpoint_matches_uninterrupted(tmp_path):
    full, _ = run(tmp_path, scenario(**{"fl.rounds": 4}), name="full")
    run(tmp_path, scenario(**{"fl.rounds": 2}), name="part")
    init = (tmp_path / "part" / "checkpoint.dtck").read_bytes()
    sc4 = scenario(**{"fl.rounds": 4})
    resumed, events = run(tmp_path, sc4, init=init, name="resumed")
    assert of(events, "resume")[0]["round"] == 2
    assert [e["round"] for e in of(events, "round_start")] == [3, 4]
    assert resumed["model_sha256"] == full["model_sha256"]
    assert resumed["rounds"] == 4


def test_checkpoint_of_another_scenario_is_refused(tmp_path):
    run(tmp_path, scenario(), name="a")
    init = (tmp_path / "a" / "checkpoint.dtck").read_bytes()
    with pytest.raises(CheckpointError, match="different scenario"):
        run(tmp_path, scenario(**{"fl.lr": 0.5}), init=init, name="b")


def test_same_seed_same_files(tmp_path):
    sc = scenario(**{"faults.dropout_p": 0.3, "compute.default.jitter": 0.5, "network.default.loss": 0.01})
    run(tmp_path, sc, name="a")
    run(tmp_path, sc, name="b")
    assert (tmp_path / "a" / "events.jsonl").read_bytes() == (tmp_path / "b" / "events.jsonl").read_bytes()
    a, b = read_summary(tmp_path / "a"), read_summary(tmp_path / "b")
    a.pop("wall_time_s"), b.pop("wall_time_s")
    assert a == b
