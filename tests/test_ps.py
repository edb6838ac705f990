"""Mode ps (issue 10): ESync's state server, the parameter server and the workers, in emu.

A synthetic, learnable data set (class = brightest quadrant pattern) keeps these fast
and independent of the MNIST archives; virtual time is exact, so no sleeps.
"""

import json
import math

import numpy as np
import pytest
import torch

from dtemu.core import events as ev
from dtemu.core.errors import NotFiniteError, StateMessageError
from dtemu.core.ml.data import Dataset
from dtemu.core.ml.workload import Workload
from dtemu.core.ps import messages as sm
from dtemu.core.ps.state_server import state_server
from dtemu.core.ps.state_table import StateTable
from dtemu.core.runtime.compute import ComputeTimer
from dtemu.core.runtime.requests import Message, RecordingContext, Recv, Send
from dtemu.core.runtime.compute_spec import ComputeSpec, SlowdownStep, VaryingSlowdown
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


def scenario(**ps):
    slow = ps.pop("slow", 10.0)
    workers = ps.get("workers", 4)
    raw = {"name": "ps-test", "mode": "ps", "model": "small_cnn", "targets": [0.5, 0.9],
           "ps": {"workers": workers, "rounds": 4, "lr": 0.05, **ps},
           "network": {"default": {"latency_ms": 0.1}},
           "compute": {"nodes": {f"worker{k}": {"slowdown": slow} for k in range(workers // 2 + 1, workers + 1)}}}
    return parse_scenario(raw)


def run(tmp_path, s, name="run"):
    summary = run_emulation(s, tmp_path / name, work=Workload(s, DATA))
    events = [json.loads(line) for line in (tmp_path / name / "events.jsonl").read_text().splitlines()]
    assert ev.problems(events) == []
    return summary, events


# --- wire format -------------------------------------------------------------------


def test_state_message_round_trip_and_refusals():
    st = sm.Status(3, 7, 2, 0.0025, 0.0004, 12.5)
    msg = sm.StateMsg(sm.QUERY, 3, 1, st)
    data = sm.encode_state(msg)
    assert len(data) == sm.STATE_SIZE and sm.decode_state(data) == msg
    reply = sm.StateMsg(sm.RESPONSE, 1, 3, st, sm.SYNC)
    assert sm.decode_state(sm.encode_state(reply)).action == sm.SYNC
    bad = {
        "size": data[:-1],
        "magic": b"XXXX" + data[4:],
        "type": data[:5] + bytes([9]) + data[6:],
        "action": sm.encode_state(sm.StateMsg(sm.QUERY, 3, 1, st, sm.TRAIN)),  # an action on a QUERY
        "status": sm.encode_state(sm.StateMsg(sm.QUERY, 3, 1, sm.Status(3, 1, 0, math.nan, 0.0, 1.0))),
    }
    for reason, raw in bad.items():
        with pytest.raises(StateMessageError) as err:
            sm.decode_state(raw)
        assert err.value.reason == reason
    negative = sm.encode_state(sm.StateMsg(sm.REPORT, 3, 1, sm.Status(3, 0, 0, 0.1, -1.0, 1.0)))
    with pytest.raises(StateMessageError):
        sm.decode_state(negative)


# --- Algorithm 1 -----------------------------------------------------------------


def test_query_rule_lets_fast_workers_train_until_the_straggler_is_due():
    table = StateTable([2, 3])
    table.report(sm.Status(3, 0, 0, 1.0, 0.1, 0.0))  # the straggler: d = 1.1, due at 1.1
    table.report(sm.Status(2, 0, 0, 0.1, 0.1, 0.0))
    assert table.query(sm.Status(2, 0, 0, 0.1, 0.1, 0.0), now=0.0) == sm.TRAIN  # i = 0
    assert table.query(sm.Status(2, 4, 0, 0.1, 0.1, 0.4), now=0.4) == sm.TRAIN  # 0.4 + 0.2 <= 1.1
    assert table.query(sm.Status(2, 5, 0, 0.1, 0.1, 0.95), now=0.95) == sm.SYNC  # 0.95 + 0.2 > 1.1
    assert table.query(sm.Status(3, 1, 0, 1.0, 0.1, 1.0), now=1.0) == sm.SYNC  # the straggler itself
    # A worker already in the next round trains while the straggler is behind.
    table.report(sm.Status(2, 0, 1, 0.1, 0.1, 1.2))
    assert table.query(sm.Status(2, 3, 1, 0.1, 0.1, 1.5), now=1.5) == sm.TRAIN


def test_a_straggler_the_ps_declared_gone_no_longer_holds_the_others():
    table = StateTable([2, 3, 4])
    table.report(sm.Status(4, 0, 0, 5.0, 0.1, 0.0))  # crashed for good; its record stays
    table.report(sm.Status(2, 0, 1, 0.1, 0.1, 0.0))
    table.report(sm.Status(3, 0, 1, 0.2, 0.1, 0.0))
    assert table.query(sm.Status(2, 2, 1, 0.1, 0.1, 0.2), now=0.2) == sm.TRAIN  # r_k > r_s: forever, unless...
    table.leave(4)
    assert table.straggler()[0] == 3
    assert table.query(sm.Status(2, 3, 1, 0.1, 0.1, 0.3), now=0.3) == sm.SYNC  # 0.3 + 0.2 > 0.0 + 0.3



def test_the_straggler_is_the_max_of_d_over_live_records_ties_to_the_lowest_rank():
    """straggler() (a heap, kept as records change) is max((d, -k)) over the live records, or over
    all of them when none is live, on random tables with ties, through every way a record changes
    (report, query, leave, reset), long enough for the heap to be built again."""
    import random

    rng = random.Random(3)
    for _ in range(300):
        ranks = rng.sample(range(2, 30), rng.randint(1, 12))
        table = StateTable(ranks)
        for step in range(rng.randint(1, 200)):
            k, how = rng.choice(ranks), rng.random()
            st = sm.Status(k, rng.randint(0, 3), rng.randint(0, 2), rng.choice([0.0, 0.002, rng.random()]),
                           rng.choice([0.0, 0.0005]), float(step))
            if how < 0.3:
                table.report(st)
            elif how < 0.6:
                table.query(st, now=float(step))
            elif how < 0.9:
                table.leave(k)
            else:
                table.reset(k, rng.randint(0, 2), float(step))
            pool = [(k, r) for k, r in table.records.items() if r.live] or list(table.records.items())
            want = max(pool, key=lambda kv: (kv[1].c + kv[1].m, -kv[0]))
            got = table.straggler()
            assert got[0] == want[0] and got[1] is want[1]

def drive(role, inbox):
    """Run a role generator against a list of messages; returns what it sent and its result."""
    sent, value = [], None
    try:
        req = next(role)
        while True:
            if isinstance(req, Recv):
                req = role.send(inbox.pop(0) if inbox else Message("ps/state", "ps", sm.encode_state(
                    sm.StateMsg(sm.STOP, 0, 1, sm.Status(0, 0, 0, 0.0, 0.0, 0.0)))))
            elif isinstance(req, Send):
                sent.append(req)
                req = role.send(1)
            else:
                req = role.send(None)
    except StopIteration as stop:
        value = stop.value
    return sent, value


def test_state_server_refuses_bad_input_and_keeps_answering():
    names = ["ps", "ss", "worker1", "worker2"]

    def from_(src, kind, k, i=1, r=0, c=0.01, m=0.001, sender=None):
        st = sm.Status(k, i, r, c, m, 1.0)
        data = sm.encode_state(sm.StateMsg(kind, names.index(src) if sender is None else sender, 1, st))
        return Message("ps/state", src, data, received_at=1.0)

    inbox = [
        from_("ps", sm.RESET, 0, r=0),
        from_("worker1", sm.QUERY, 7),  # an unknown rank
        from_("worker1", sm.QUERY, 3),  # worker1 speaking for worker2
        from_("worker1", sm.QUERY, 2, sender=3),  # claims another sender
        from_("worker2", sm.REPORT, 3, i=0, r=5),  # a round the PS has not begun
        from_("worker1", sm.RESET, 2),  # only the PS resets
        Message("ps/state", "worker1", b"\x00" * 10),
        Message("ps/state", "worker1", sm.encode_state(sm.StateMsg(sm.QUERY, 2, 1, sm.Status(2, 1, 0, 0.1, 0.1, 1.0)))[:4]
                + b"\xff" * (sm.STATE_SIZE - 4)),
        from_("worker1", sm.QUERY, 2),  # a good one: answered
    ]
    ctx = RecordingContext(node="ss")
    sent, result = drive(state_server(ctx, names, [2, 3]), inbox)
    assert result.queries == 1 and len(sent) == 1 and sent[0].to == "worker1"
    assert sm.decode_state(sent[0].data).msg_type == sm.RESPONSE
    assert dict(result.rejected) == {"unknown_rank": 2, "sender": 1, "future_round": 1, "not_ps": 1,
                                     "size": 1, "version": 1}
    assert ctx.bytes_rejected > 0 and result.stopped


# --- whole runs (emu) ------------------------------------------------------------


def test_esync_fast_workers_fill_the_stragglers_time(tmp_path):
    s = scenario(algorithm="esync")
    summary, events = run(tmp_path, s)
    it = summary["iterations_per_round"]
    assert summary["rounds"] == 4 and summary["stop_reason"] == "done"
    assert it["worker3"] == it["worker4"] == 1.0  # the stragglers: one iteration a round
    assert it["worker1"] > 4 and it["worker2"] > 4  # fast ones: as many as fit (h_c = 10)
    assert set(summary["blocking_time_s"]) == {"worker1", "worker2", "worker3", "worker4"}
    assert summary["state_server"]["queries"] > 0 and summary["time_to_accuracy"].keys() == {"0.5", "0.9"}
    assert summary["samples_per_s"] > 0 and set(summary["bytes_per_node"]) == set(s.node_names)
    again, _ = run(tmp_path, s, "again")
    assert again["model_sha256"] == summary["model_sha256"]  # deterministic for a seed


def test_esync_beats_ssgd_in_time_and_blocks_less(tmp_path):
    esync, _ = run(tmp_path, scenario(algorithm="esync", rounds=6), "esync")
    ssgd, _ = run(tmp_path, scenario(algorithm="ssgd", rounds=6), "ssgd")
    assert all(v == 1.0 for v in ssgd["iterations_per_round"].values())
    assert esync["final_accuracy"] > ssgd["final_accuracy"]
    fast_wait = lambda s: s["blocking_time_s"]["worker1"]  # noqa: E731
    assert fast_wait(esync) < fast_wait(ssgd)


def test_a_cap_on_local_iterations_bounds_the_fast_workers_and_asks_less(tmp_path):
    free, _ = run(tmp_path, scenario(algorithm="esync"), "free")
    capped, _ = run(tmp_path, scenario(algorithm="esync", max_local_iterations=3), "capped")
    assert free["iterations_per_round"]["worker1"] > 3       # h_c = 10: more would fit
    it = capped["iterations_per_round"]
    assert 1 < it["worker1"] <= 3 and 1 < it["worker2"] <= 3 and it["worker3"] == it["worker4"] == 1.0
    assert capped["rounds"] == 4 and capped["stop_reason"] == "done"
    # the cap is the worker's own: at i = 3 it syncs without a query
    assert capped["state_server"]["queries"] < free["state_server"]["queries"]


@pytest.mark.parametrize("ps", [{"algorithm": "ssgd", "max_local_iterations": 3},
                                {"algorithm": "esync", "fixed_iterations": 2, "max_local_iterations": 3},
                                {"algorithm": "esync", "max_local_iterations": 0}])
def test_a_cap_without_esyncs_adaptive_rule_is_refused(ps):
    from dtemu.core.errors import ScenarioError
    with pytest.raises(ScenarioError, match="ps.max_local_iterations"):
        scenario(**ps)


def test_fixed_iterations_are_a_deterministic_schedule(tmp_path):
    summary, events = run(tmp_path, scenario(algorithm="esync", fixed_iterations=3))
    assert summary["local_iterations"] == {f"worker{k}": 12 for k in range(1, 5)}
    assert summary["state_server"].get("queries", 0) == 0  # nobody asks the state server


@pytest.mark.parametrize("algorithm", ["asgd", "dcasgd", "fedasync", "fedavg", "feddrop", "tifl"])
def test_every_baseline_runs(tmp_path, algorithm):
    extra = {"feddrop": {"feddrop_k_hat": 2}, "fedasync": {"staleness": "poly"},
             "tifl": {"tifl_workers_per_round": 2, "tifl_credits": [10, 1]}}.get(algorithm, {})
    summary, events = run(tmp_path, scenario(algorithm=algorithm, rounds=6, **extra))
    assert summary["rounds"] == 6 and summary["final_accuracy"] is not None
    if algorithm == "feddrop":  # the two stragglers never make a round after the first
        rounds = [e for e in events if e["kind"] == ev.PS_ROUND]
        assert all(e["updates"] == 2 for e in rounds)
    if algorithm == "tifl":
        rounds = [e for e in events if e["kind"] == ev.PS_ROUND][1:]
        slow = [e for e in rounds if "worker3" in e["selected"]]
        assert len(slow) <= 1 and all(len(e["selected"]) == 2 for e in rounds)  # the slow tier's 1 credit


def test_a_crashed_worker_does_not_hold_the_run(tmp_path):
    s = scenario(algorithm="esync", rounds=4, round_timeout_s=0.5, min_workers=2,
                 slow=10.0)
    raw = s.to_dict()
    raw["faults"]["offline"] = [{"node": "worker4", "start_s": 0.05}]
    s = parse_scenario(raw)
    summary, events = run(tmp_path, s)
    assert summary["rounds"] == 4 and summary["stop_reason"] == "done"
    closed = [e for e in events if e["kind"] == ev.PS_ROUND]
    late = [e for e in closed if e["timed_out"]]
    assert late and all(e["updates"] == 3 and e["aggregated"] for e in late)
    starts = {e["round"]: e["t"] for e in events if e["kind"] == ev.ROUND_START}
    for e in late:  # closed at its deadline to the nanosecond
        assert e["t"] == pytest.approx(starts[e["version"]] + 0.5, abs=1e-9)


# --- speeds that change ----------------------------------------------------------


def test_schedule_and_random_process_change_a_nodes_speed():
    spec = ComputeSpec(train_s_per_sample=0.001, slowdown=2.0,
                       schedule=[SlowdownStep(at_s=10.0, slowdown=5.0), SlowdownStep(at_s=20.0, slowdown=1.0)])
    timer = ComputeTimer(spec, None, seed=[0, 1])
    assert [timer.duration(10, now=t) for t in (0.0, 10.0, 25.0)] == pytest.approx([0.02, 0.05, 0.01])
    assert timer.stretch(now=12.0) == 5.0
    varying = ComputeTimer(ComputeSpec(train_s_per_sample=0.001, varying=VaryingSlowdown(period_s=1.0, low=1.0,
                                                                                     high=8.0)), None, seed=[0, 1])
    draws = [varying.slowdown_at(t + 0.5) for t in range(20)]
    assert all(1.0 <= d <= 8.0 for d in draws) and len(set(draws)) > 10
    assert draws == [varying.slowdown_at(t + 0.1) for t in range(20)]  # the same in a period, from the seed
    plain = ComputeTimer(ComputeSpec(train_s_per_sample=0.001, slowdown=3.0), None, seed=0)
    assert plain.duration(7, now=99.0) == 7 * 0.003 and not plain.changing


def test_esync_follows_a_speed_that_changes(tmp_path):
    s = scenario(algorithm="esync", rounds=8, slow=1.0)
    raw = s.to_dict()
    # worker4 becomes 10x slower at t = 0.02 s: from then on the others fill its time
    raw["compute"]["nodes"] = {"worker4": {"schedule": [{"at_s": 0.02, "slowdown": 10.0}]}}
    s = parse_scenario(raw)
    summary, events = run(tmp_path, s)
    rounds = [e for e in events if e["kind"] == ev.PS_ROUND]
    first, last = rounds[1]["iterations"], rounds[-1]["iterations"]
    assert first["worker1"] <= 2 and last["worker1"] >= 5 and last["worker4"] == 1


# --- the servers crash and restart (faults.offline: exact virtual times) ----------------


def with_offline(s, node, start_s, end_s):
    raw = s.to_dict()
    raw["faults"]["offline"] = [{"node": node, "start_s": start_s, "end_s": end_s}]
    return parse_scenario(raw)


def test_parameter_server_restarts_from_its_checkpoint(tmp_path):
    s = with_offline(scenario(algorithm="esync", rounds=6, round_timeout_s=1.0, query_timeout_s=0.05),
                     "ps", 0.07, 0.2)
    summary, events = run(tmp_path, s)
    assert summary["rounds"] == 6 and summary["stop_reason"] == "done"
    resume = [e for e in events if e["kind"] == ev.RESUME]
    up = [e for e in events if e["kind"] == ev.NODE_UP and e["node"] == "ps"]
    assert len(resume) == 1 and up[-1]["t"] == pytest.approx(0.2, abs=1e-9) and resume[0]["t"] == up[-1]["t"]
    closed = [e["version"] for e in events if e["kind"] == ev.PS_ROUND]
    assert closed == sorted(closed) and set(closed) == set(range(6))
    # the updates the old server took with it were sent again
    assert any(e["kind"] == ev.UPDATE_RESENT for e in events)
    assert all(e["updates"] == 4 for e in events if e["kind"] == ev.PS_ROUND)


def test_state_server_restarts_empty_and_the_run_goes_on(tmp_path):
    s = with_offline(scenario(algorithm="esync", rounds=6, query_timeout_s=0.05), "ss", 0.05, 0.1)
    summary, events = run(tmp_path, s)
    assert summary["rounds"] == 6 and summary["stop_reason"] == "done" and summary["rounds_failed"] == 0
    up = [e for e in events if e["kind"] == ev.NODE_UP and e["node"] == "ss"]
    assert up[-1]["t"] == pytest.approx(0.1, abs=1e-9)
    rounds = [e for e in events if e["kind"] == ev.PS_ROUND]
    assert rounds[-1]["iterations"]["worker1"] > 4  # after the restart, ESync again


def test_feddrops_own_quorum_aggregates_below_min_workers(tmp_path):
    # K - K_hat = 2 updates close a round; min_workers (3) is only the quorum of a timed-out round
    summary, events = run(tmp_path, scenario(algorithm="feddrop", feddrop_k_hat=2, min_workers=3, rounds=3,
                                             local_epochs=1))
    rounds = [e for e in events if e["kind"] == ev.PS_ROUND]
    assert all(e["aggregated"] and not e["timed_out"] and e["updates"] == 2 for e in rounds)
    assert summary["rounds_failed"] == 0


# --- a run that diverges ends at once, with its reason -------------------------------------


def test_not_finite_update_is_a_typed_report_on_the_wire():
    report = sm.NotFinite(version=7, worker=3, iterations=12)
    assert sm.decode_ps(sm.encode_ps(report), 10) == report
    nan = np.full(10, np.nan, dtype=np.float32)
    with pytest.raises(NotFiniteError) as err:  # an update sent anyway (a buggy or hostile worker)
        sm.decode_ps(sm.encode_ps(sm.Update(7, 3, 12, 384, 0.5, nan)), 10)
    assert err.value.report == report
    with pytest.raises(NotFiniteError) as err:  # a model is refused, with nothing to report
        sm.decode_ps(sm.encode_ps(sm.Model(7, nan)), 10)
    assert err.value.report is None


def diverging(**ps):
    """Deep linear layers at lr 2: updates turn non-finite within ~10 versions (tests/ps_models.py)."""
    raw = scenario(**{"lr": 2.0, "rounds": 400, "max_time_s": 100.0, **ps}).to_dict()
    raw["model"] = "tests.ps_models:deep_linear"
    raw["compute"]["default"] = {"train_s_per_sample": 1e-4}
    return parse_scenario(raw)


def test_an_asynchronous_run_whose_updates_are_not_finite_ends_when_they_all_are(tmp_path):
    # Only the final evaluation (eval_every 1000): the workers' NOT_FINITE reports say it first.
    summary, events = run(tmp_path, diverging(algorithm="asgd", eval_every=1000))
    version = summary["rounds"]
    assert summary["stop_reason"] == (f"diverged: 4 updates from version {version} were not finite; "
                                      f"the result is version {version}")
    assert 0 < version < 400 and summary["time_s"] < 0.1  # not at ps.max_time_s (100 s), not a hang
    refused = [e for e in events if e["kind"] == ev.UPDATE_REJECTED and e["node"] == "ps"]
    assert {e["reason"] for e in refused} == {"not_finite"} and summary["updates"]["not_finite"] == len(refused)
    # Each refused worker got the current model back and went on: the last 4 reports are about it.
    assert [e["round"] for e in refused[-4:]] == [version] * 4
    reported = [e for e in events if e["kind"] == ev.UPDATE_NOT_FINITE]
    assert len(reported) >= len(refused) and {e["src"] for e in refused} <= {e["node"] for e in reported}
    end = next(e for e in events if e["kind"] == ev.RUN_END)
    assert end["t"] == pytest.approx(refused[-1]["t"], abs=1e-6)  # the run ends as the 4th report lands
    assert end["t"] == pytest.approx(summary["time_s"], abs=1e-9)
    stops = [e for e in events if e["kind"] == ev.CLIENT_STOP]
    assert len(stops) == 4 and all(e["reason"] == "stop" and e["t"] < end["t"] + 0.01 for e in stops)
    assert summary["model_sha256"] == end["model_sha256"]


@pytest.mark.parametrize("algorithm, why", [
    ("dcasgd", "worker1's update from version 7 (staleness 1) gives a model that is not finite"),
    ("asgd", "version {v}'s test loss is not finite"),  # evaluated every version: the loss says it first
    ("ssgd", "4 updates from version 6 were not finite"),
    ("esync", "4 updates from version 6 were not finite"),
])
def test_every_kind_of_divergence_ends_the_run_with_its_reason(tmp_path, algorithm, why):
    summary, events = run(tmp_path, diverging(algorithm=algorithm, eval_every=1 if algorithm == "asgd" else 1000))
    version = summary["rounds"]
    assert summary["stop_reason"] == f"diverged: {why.format(v=version)}; the result is version {version}"
    assert summary["time_s"] < 0.5 and summary["final_accuracy"] is not None
    assert sum(e["kind"] == ev.CLIENT_STOP for e in events) == 4
    if algorithm == "dcasgd":  # the update that would have made the model not finite was not applied
        assert summary["updates"]["diverges"] == 1
    if algorithm in ("ssgd", "esync"):  # no round was cut by its deadline: the failures answered
        assert not any(e["timed_out"] for e in events if e["kind"] == ev.PS_ROUND)


def test_a_synchronous_round_does_not_wait_for_a_worker_whose_update_is_not_finite(tmp_path):
    # esync at lr 2 has rounds where some workers' updates are finite and some not: those rounds
    # close as soon as everyone answered, long before ps.round_timeout_s, and aggregate the rest.
    summary, events = run(tmp_path, diverging(algorithm="esync", eval_every=1000, round_timeout_s=50.0))
    mixed = [e for e in events if e["kind"] == ev.PS_ROUND and e.get("not_finite")]
    assert mixed and all(e["aggregated"] and not e["timed_out"] for e in mixed)
    assert all(e["updates"] + len(e["not_finite"]) == e["expected"] for e in mixed)
    assert summary["time_s"] < 1.0 and summary["rounds_failed"] == 0


def test_cnn4_is_four_convolutions_and_one_linear_layer():
    from dtemu.core.ml.models import build_model, model_cost

    m = build_model("cnn4", 0)
    layers = [type(x).__name__ for x in m.modules() if isinstance(x, (torch.nn.Conv2d, torch.nn.Linear))]
    assert layers == ["Conv2d"] * 4 + ["Linear"] and sum(p.numel() for p in m.parameters()) == 32_058
    out = m(torch.zeros(3, 1, 28, 28))
    assert out.shape == (3, 10) and torch.allclose(out.exp().sum(1), torch.ones(3), atol=1e-5)
    assert 2.5 < model_cost("cnn4") / model_cost("small_cnn") < 4  # measured: 3.2x a small_cnn step


def test_a_rounds_inbox_says_what_each_worker_message_is():
    """The parameter server's inbox (core.runtime.inbox with core.ps.inbox's reader), with no I/O:
    the server's synchronous round only acts on its verdicts."""
    import numpy as np

    from dtemu.core.ps import messages as pm
    from dtemu.core.ps.inbox import worker_inbox
    from dtemu.core.runtime.verdict import ACCEPTED, DUPLICATE, JOIN, LATE, NOT_FINITE
    from dtemu.core.wire.auth import Sealer

    names = {r: f"w{r}" for r in (2, 3, 4, 9)}
    inbox = worker_inbox(Sealer(None, "ps"), 2, names)
    inbox.ask_round({2, 3, 4}, 3)
    update = lambda worker, version=3: pm.encode_ps(  # noqa: E731
        pm.Update(version, worker, 1, 16, 0.5, np.zeros(2, np.float32)))
    offer = lambda worker, data: inbox.offer(f"w{worker}", data)  # noqa: E731
    assert offer(2, pm.encode_ps(pm.Join(2))).kind == JOIN and offer(2, b"junk").reason == "malformed"
    assert offer(3, update(2)).reason == "malformed"   # rank 2's update, sent by w3
    assert (offer(2, update(2, 2)).kind, offer(2, update(2, 2)).reason) == (LATE, "late")
    assert offer(2, update(2, 4)).reason == "future" and offer(9, update(9)).reason == "not_asked"
    assert offer(2, update(2)).kind == ACCEPTED and offer(2, update(2)).kind == DUPLICATE
    assert sorted(inbox.unanswered()) == [3, 4]
    nan = pm.encode_ps(pm.Update(3, 3, 1, 16, 0.5, np.array([np.nan, 0], np.float32)))
    assert offer(3, nan).kind == NOT_FINITE and offer(3, update(3)).kind == DUPLICATE
    assert offer(4, update(4)).kind == ACCEPTED and inbox.unanswered() == []


@pytest.mark.parametrize("algorithm", ["ssgd", "asgd"])
def test_pricing_the_servers_own_work_delays_its_versions(tmp_path, algorithm):
    """The server's rule costs ``sum`` per MB of the updates it takes, a checkpoint ``encode`` per MB of
    the model (its rates, emu.federation_costs.ps_server_costs), as FL's controller.  A synchronous round keeps
    its model (an asynchronous one may take its updates in another order)."""
    s = scenario(algorithm=algorithm, rounds=3)
    free, free_events = run(tmp_path, s, "free")
    priced, events = run(tmp_path, parse_scenario(s.to_dict(), [f"compute.nodes.ps.cpu.{op}_s_per_mb=0.05"
                                                                for op in ("sum", "encode")]), "priced")
    assert priced["rounds"] == free["rounds"] == 3
    if algorithm == "ssgd":
        assert priced["model_sha256"] == free["model_sha256"]
    last = [max(e["t"] for e in evs if e["kind"] == ev.PS_UPDATE) for evs in (free_events, events)]
    assert last[1] > last[0]


def test_calibrate_measures_the_servers_and_workers_costs():
    """emu calibrate's costs of mode ps (emu.federation_costs.ps_sets): each side's decoding, the server's own
    work, and real mode's transport."""
    from dtemu.emu.federation_costs import ps_sets

    sets = dict(a.split("=", 1) for a in ps_sets(scenario(algorithm="esync"), reps=1))
    for key in ("compute.default.decode_s_per_mb", "compute.nodes.ps.decode_s_per_mb",
                "compute.nodes.ps.cpu.sum_s_per_mb", "compute.nodes.ps.cpu.encode_s_per_mb"):
        assert float(sets[key]) > 0, key
    assert sets["network.framing"] == "rtps"
