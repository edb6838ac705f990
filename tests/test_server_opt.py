"""The FL update rules beyond FedAvg, checked by hand on small vectors, and in emulated runs with
every codec, sampling and sealing (the StandIn workload: no PyTorch)."""

import math

import numpy as np
import pytest
import torch

from dtemu.core.errors import ScenarioError
from dtemu.core.fl.aggregate import FedAvg, Update
from dtemu.core.fl.rules import fl_strategy
from dtemu.core.fl.server_opt import ServerOptimizer
from dtemu.core.compression.codecs import Dense
from dtemu.core.ml.train import train_local
from dtemu.core.scenario import parse_scenario
from dtemu.core.wire.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from dtemu.emu.run import run_emulation
from dtemu.host.rundir import read_events
from tests.test_fl_protocol import StandIn

X = np.array([1.0, -2.0, 0.5], np.float64)
D1 = np.array([0.2, -0.4, 0.0])   # the first round's mean delta
D2 = np.array([-0.1, 0.3, 0.05])  # the second's
ETA, B1, B2, TAU = 0.1, 0.9, 0.99, 1e-3


def two_steps(rule):
    opt = ServerOptimizer(rule, ETA, B1, B2, TAU)
    x1 = opt.step(X, D1).astype(np.float64)
    return x1, opt.step(x1, D2).astype(np.float64)


def by_hand(second_moment):
    m, v, x, out = np.zeros(3), np.full(3, TAU**2), X.copy(), []
    for d in (D1, D2):
        m = B1 * m + (1 - B1) * d
        v = np.array([second_moment(vi, di * di) for vi, di in zip(v, d)])
        x = (x + ETA * m / (np.sqrt(v) + TAU)).astype(np.float32).astype(np.float64)
        out.append(x)
    return out


@pytest.mark.parametrize("rule, moment", [
    ("fedadam", lambda v, d2: B2 * v + (1 - B2) * d2),
    ("fedadagrad", lambda v, d2: v + d2),
    ("fedyogi", lambda v, d2: v - (1 - B2) * d2 * math.copysign(1.0, v - d2) if v != d2 else v),
])
def test_a_server_optimizer_steps_as_reddi_et_al_write_it(rule, moment):
    x1, x2 = two_steps(rule)
    h1, h2 = by_hand(moment)
    np.testing.assert_allclose(x1, h1, rtol=1e-6)
    np.testing.assert_allclose(x2, h2, rtol=1e-6)


def test_fedadam_first_step_is_eta_times_the_sign_when_tau_is_small():
    # m = (1-β1)Δ, v ≈ (1-β2)Δ²: the step is η(1-β1)/√(1-β2)·sign(Δ) ≈ η·sign(Δ)
    opt = ServerOptimizer("fedadam", 0.01, 0.9, 0.99, 1e-9)
    x = opt.step(np.zeros(3), np.array([3.0, -0.002, 0.0])).astype(np.float64)
    np.testing.assert_allclose(x, [0.01, -0.01, 0.0], rtol=1e-5)


def test_the_rule_aggregates_as_fedavg_then_steps():
    ups = [Update("client1", 1, "delta", Dense(np.array([1.0, 0.0], np.float32))),
           Update("client2", 3, "delta", Dense(np.array([0.0, 2.0], np.float32)))]
    w = np.zeros(2, np.float32)
    assert np.array_equal(FedAvg().aggregate(w, ups), [0.25, 1.5])
    adam = ServerOptimizer("fedadam", 0.01, 0.9, 0.99, 1e-3)
    mean = np.array([0.25, 1.5])
    m, v = 0.1 * mean, 0.99 * 1e-6 + 0.01 * mean**2
    np.testing.assert_allclose(adam.aggregate(w, ups), 0.01 * m / (np.sqrt(v) + 1e-3), rtol=1e-6)


def test_fedprox_adds_mu_times_the_distance_to_the_global_model():
    """train_local's proximal term equals FedProx's loss term μ/2·||w − w₀||² built into autograd."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    mu, lr = 0.5, 0.1

    def model():
        torch.manual_seed(1)
        return torch.nn.Linear(4, 3)

    ours = model()
    train_local(ours, x, y, np.arange(32), epochs=1, batch_size=8, lr=lr, seed=3, proximal_mu=mu)
    ref = model()
    start = [p.detach().clone() for p in ref.parameters()]
    order = torch.from_numpy(np.arange(32)[np.random.default_rng([3, 0]).permutation(32)])
    for i in range(0, 32, 8):
        idx = order[i:i + 8]
        ref.zero_grad()
        loss = torch.nn.functional.cross_entropy(ref(x[idx]), y[idx])
        loss = loss + mu / 2 * sum(((p - p0) ** 2).sum() for p, p0 in zip(ref.parameters(), start))
        loss.backward()
        with torch.no_grad():
            for p in ref.parameters():
                p -= lr * p.grad
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    plain = model()
    train_local(plain, x, y, np.arange(32), epochs=1, batch_size=8, lr=lr, seed=3)
    assert not torch.allclose(plain.weight, ours.weight)  # the term did something


def test_the_checkpoint_keeps_the_optimizer_state():
    opt = fl_strategy(parse_scenario({"name": "a", "fl": {"algorithm": "fedyogi"}}))
    w = opt.step(X, D1)
    data = encode_checkpoint(Checkpoint(1, w, "d", {}, opt.state()))
    back = decode_checkpoint(data, expected_dim=3)
    assert set(back.state) == {"m", "v"} and np.array_equal(back.state["v"], opt.v)
    again = fl_strategy(parse_scenario({"name": "a", "fl": {"algorithm": "fedyogi"}}))
    again.restore(back.state)
    assert np.array_equal(again.step(w, D2), opt.step(w, D2))
    with pytest.raises(Exception, match="state"):
        decode_checkpoint(data[:-1] + bytes([data[-1] ^ 1]))


@pytest.mark.parametrize("sets, path", [
    ({"fl.algorithm": "fedsgd"}, "fl.algorithm"),
    ({"fl.algorithm": "fedprox"}, "fl.proximal_mu"),
    ({"fl.proximal_mu": 0.1}, "fl.proximal_mu"),
    ({"fl.algorithm": "fedadam", "fl.server_lr": 0.5}, "fl.server_lr"),
    ({"fl.algorithm": "fedadam", "fl.server_opt.beta1": 1.0}, "fl.server_opt.beta1"),
    ({"fl.algorithm": "fedyogi", "fl.server_opt.tau": 0}, "fl.server_opt.tau"),
    ({"fl.server_opt.eta": -1}, "fl.server_opt.eta"),
])
def test_a_bad_rule_is_refused_with_its_key(sets, path):
    with pytest.raises(ScenarioError) as err:
        parse_scenario({"name": "bad"}, [f"{k}={v}" for k, v in sets.items()])
    assert err.value.path == path


def test_fedavg_scenarios_keep_their_digest():
    plain = parse_scenario({"name": "a"})
    assert plain.digest() == parse_scenario({"name": "a", "fl": {"algorithm": "fedavg"}}).digest()
    assert plain.digest() != parse_scenario({"name": "a", "fl": {"algorithm": "fedadam"}}).digest()


# --- every rule with every codec, sampling and seal, in emu ------------------------------------

KEY = b"k" * 32


def fl_scenario(**sets):
    raw = {"name": "matrix", "seed": 3,
           "fl": {"clients": 6, "rounds": 3, "subset": 100, "round_timeout_s": 2.0, "min_clients": 1},
           "network": {"default": {"up_mbps": 1000, "down_mbps": 1000, "latency_ms": 1}}}
    return parse_scenario(raw, [f"{k}={v}" for k, v in sets.items()])


RULES = {"fedavg": {}, "fedprox": {"fl.proximal_mu": 0.01}, "fedadam": {}, "fedyogi": {}, "fedadagrad": {}}


@pytest.mark.parametrize("sealed", [False, True], ids=["open", "sealed"])
@pytest.mark.parametrize("sample", [None, 0.5], ids=["all", "sampled"])
@pytest.mark.parametrize("codec", ["fp32", "q8", "s4", "sq8"])
@pytest.mark.parametrize("rule", list(RULES))
def test_every_rule_runs_with_every_codec_sampling_and_seal(tmp_path, rule, codec, sample, sealed):
    sets = {"fl.algorithm": rule, "fl.codec": codec, "fl.error_feedback": codec != "fp32", **RULES[rule]}
    if sample:
        sets["fl.sample"] = sample
    sc = fl_scenario(**sets)
    summary = run_emulation(sc, tmp_path / "run", work=StandIn(), key=KEY if sealed else None)
    assert summary["rounds"] == 3 and summary["rounds_failed"] == 0
    assert summary["updates"] == {"accepted": 3 * sc.fl.asked_per_round}
    events = read_events(tmp_path / "run")
    assert [e["authenticated"] for e in events if e["kind"] == "run_start"] == [sealed]
    shas = [e["model_sha256"] for e in events if e["kind"] == "aggregated"]
    assert len(set(shas)) == 3  # every round moved the model
    # the same scenario, run again, makes the same model
    again = run_emulation(sc, tmp_path / "again", work=StandIn(), key=KEY if sealed else None)
    assert again["model_sha256"] == summary["model_sha256"]


@pytest.mark.parametrize("rule", ["fedadam", "fedyogi", "fedadagrad"])
def test_a_resumed_server_optimizer_makes_the_uninterrupted_model(tmp_path, rule):
    full = run_emulation(fl_scenario(**{"fl.algorithm": rule, "fl.rounds": 4}), tmp_path / "full", work=StandIn())
    run_emulation(fl_scenario(**{"fl.algorithm": rule, "fl.rounds": 2}), tmp_path / "part", work=StandIn())
    init = (tmp_path / "part" / "checkpoint.dtck").read_bytes()
    resumed = run_emulation(fl_scenario(**{"fl.algorithm": rule, "fl.rounds": 4}), tmp_path / "resumed",
                            init=init, work=StandIn())
    assert resumed["model_sha256"] == full["model_sha256"]


# --- fedasync: each update as it comes ----------------------------------------------------------

@pytest.mark.parametrize("function, a, b, staleness, want", [
    ("constant", 0.5, 4, 7, 1.0), ("poly", 0.5, 4, 3, 0.5), ("hinge", 10, 4, 4, 1.0), ("hinge", 10, 4, 6, 1 / 21)])
def test_staleness_functions_by_hand(function, a, b, staleness, want):
    from dtemu.core.fl.staleness import staleness_factor

    assert staleness_factor(function, staleness, a, a, b) == pytest.approx(want)


@pytest.mark.parametrize("sealed", [False, True], ids=["open", "sealed"])
@pytest.mark.parametrize("codec", ["fp32", "q8", "sq8"])
def test_fedasync_mixes_each_update_with_its_staleness(tmp_path, codec, sealed):
    sc = fl_scenario(**{"fl.algorithm": "fedasync", "fl.codec": codec, "fl.sample": 3, "fl.rounds": 8,
                        "fl.fedasync.staleness": "poly", "fl.error_feedback": codec != "fp32",
                        "compute.nodes.client2.slowdown": 4})
    summary = run_emulation(sc, tmp_path / "run", work=StandIn(), key=KEY if sealed else None)
    assert summary["rounds"] == 8 and summary["updates"] == {"accepted": 8}
    events = read_events(tmp_path / "run")
    taken = [e for e in events if e["kind"] == "update_accepted"]
    assert [e["round"] for e in taken] == list(range(1, 9))
    assert max(e["staleness"] for e in taken) > 0          # the slow client's update is stale
    assert len({e["client"] for e in taken}) > 3            # the freed places went to other clients
    from dtemu.report.audit_fl import check_fl

    assert check_fl(events, summary, True, sc.to_dict())[1] == []
    again = run_emulation(sc, tmp_path / "again", work=StandIn(), key=KEY if sealed else None)
    assert again["model_sha256"] == summary["model_sha256"]


def test_fedasync_mixing_by_hand(tmp_path):
    """Two clients, constant s: every update is x ← (1 − α)·x + α·(x_τ + Δ) with the StandIn's Δ."""
    sc = fl_scenario(**{"fl.algorithm": "fedasync", "fl.clients": 1, "fl.rounds": 3, "fl.fedasync.alpha": 0.5})
    summary = run_emulation(sc, tmp_path / "run", work=StandIn())
    x = np.zeros(16, np.float32)
    for _ in range(3):   # one client: never stale, always trained from the newest model (Δ = 1/100)
        x = ((1 - 0.5) * x + 0.5 * (x + np.float32(0.01))).astype(np.float32)
    from dtemu.core.ml.params import sha256_of

    assert summary["model_sha256"] == sha256_of(x)


def test_fedasync_refuses_a_compressed_downlink():
    with pytest.raises(ScenarioError) as err:
        parse_scenario({"name": "a", "fl": {"algorithm": "fedasync", "downlink_codec": "q8"}})
    assert err.value.path == "fl.downlink_codec"


def test_dcasgd_compensation_by_hand():
    """g' = g + λ·g⊙g⊙(w_now − w_then), elementwise, in float32 (ps dcasgd and geo's MixedSync)."""
    from dtemu.core.fl.staleness import compensated

    g = np.array([1.0, -2.0, 0.5], np.float32)
    now, then = np.array([0.3, 0.0, -1.0], np.float32), np.array([0.1, 0.5, -1.0], np.float32)
    out = compensated(g, 0.5, now, then)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [1.0 + 0.5 * 1 * 0.2, -2.0 + 0.5 * 4 * -0.5, 0.5], rtol=1e-6)


@pytest.mark.parametrize("sets, path", [
    (["fl.algorithm=fedmagic"], "fl.algorithm"),
    (["fl.algorithm=fedyogi", "fl.server_opt.beta2=1.5"], "fl.server_opt.beta2"),
    (["fl.algorithm=fedasync", "fl.downlink_codec=s4"], "fl.downlink_codec"),
])
def test_the_cli_refuses_a_bad_rule_with_its_key_and_exit_2(tmp_path, capsys, sets, path):
    from dtemu.emu.cli import main

    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: bad-rule\n")
    args = ["run", str(scenario), "--no-tui", "--out", str(tmp_path / "run")]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    assert path in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
