"""ps's rules in FL (core.fl.rules): FedDrop's quorum, TiFL's tiers, ASGD and DC-ASGD, built from
the parts ps's server uses too (core.fl.strategy), by hand on small vectors and in emulated runs
with every codec, sampling and seal (the StandIn workload: no PyTorch)."""

from __future__ import annotations

import numpy as np
import pytest

from dtemu.core.errors import ScenarioError
from dtemu.core.fl.strategy import ASGD, DCASGD, FedAsync, Tiers, drop_quorum
from dtemu.core.ml.params import sha256_of
from dtemu.emu.run import run_emulation
from dtemu.host.rundir import read_events
from dtemu.report.audit_fl import check_fl
from tests.test_fl_protocol import StandIn
from tests.test_server_opt import KEY, fl_scenario   # (6 clients, 3 rounds, fast links)

def of(events, kind):
    return [e for e in events if e["kind"] == kind]


# --- the parts, by hand ----------------------------------------------------------------------

def test_feddrop_quorum_by_hand():
    assert [drop_quorum(6, 2), drop_quorum(3, 2), drop_quorum(2, 5)] == [4, 1, 1]


def test_tiers_by_hand():
    tiers = Tiers(["a", "b", "c", "d"], 2, [], [1, 0], per_round=1, seed=7)
    assert tiers.pick(1, ["a", "b", "c", "d"]) is None            # no tiers before a round is seen
    tiers.observe({"a": 3.0, "b": 1.0, "d": 2.0})                 # c never answered: the slowest
    assert tiers.tiers == [["b", "d"], ["a", "c"]]
    assert tiers.pick(2, ["a", "b", "c", "d"]) in (("b",), ("d",))   # tier 1 has no credits: tier 0
    assert tiers.credits == [0, 0]
    assert tiers.pick(3, ["a", "c"]) in (("a",), ("c",))           # credits spent: every tier again
    assert tiers.pick(4, ["c"]) == ("c",)                           # the one tier with someone there
    assert tiers.pick(5, []) == ()                                  # no one there: no one asked
    back = Tiers(["a", "b", "c", "d"], 2, [], [1, 0], 1, 7)
    back.restore(tiers.state())
    assert back.tiers == tiers.tiers and back.credits == tiers.credits


def test_the_asynchronous_rules_by_hand():
    w = np.array([1.0, -2.0, 0.5], np.float32)
    base = np.array([0.5, -2.0, 1.0], np.float32)
    d = np.array([0.2, -0.4, 0.1], np.float32)
    np.testing.assert_allclose(ASGD(0.5).apply(w, d, 3, base), w + 0.5 * d, rtol=1e-6)
    eta, lam = 0.1, 0.04
    g = -d / eta
    g2 = g + lam * g * g * (w - base)
    np.testing.assert_allclose(DCASGD(0.5, eta, lam).apply(w, d, 3, base), w - 0.5 * eta * g2, rtol=1e-6)
    a = 0.6 * (3 + 1) ** -0.5   # poly, a = 0.5
    np.testing.assert_allclose(FedAsync(0.6, "poly", 0.5, 10, 4).apply(w, d, 3, base),
                               (1 - a) * w + a * (base + d), rtol=1e-6)


# --- every rule with every codec, sampling and seal, in emu ----------------------------------

RULES = {"feddrop": {"fl.feddrop.k_hat": 1}, "tifl": {"fl.tifl.tiers": 2}, "asgd": {"fl.server_lr": 0.5},
         "dcasgd": {"fl.dcasgd_lambda": 0.1}, "esync": {"fl.esync.max_iterations": 8}}


@pytest.mark.parametrize("sealed", [False, True], ids=["open", "sealed"])
@pytest.mark.parametrize("sample", [None, 0.5], ids=["all", "sampled"])
@pytest.mark.parametrize("codec", ["fp32", "q8", "s4", "sq8"])
@pytest.mark.parametrize("rule", list(RULES))
def test_every_rule_runs_with_every_codec_sampling_and_seal(tmp_path, rule, codec, sample, sealed):
    sets = {"fl.algorithm": rule, "fl.codec": codec, "fl.error_feedback": codec != "fp32", **RULES[rule],
            "compute.nodes.client5.slowdown": 3}
    if sample:
        sets["fl.sample"] = sample
    sc = fl_scenario(**sets)
    summary = run_emulation(sc, tmp_path / "run", work=StandIn(), key=KEY if sealed else None)
    events = read_events(tmp_path / "run")
    assert summary["rounds"] == 3 and summary["rounds_failed"] == 0 and summary["sealed"] is sealed
    assert len({e["model_sha256"] for e in of(events, "aggregated")}) == 3   # every round moved the model
    assert check_fl(events, summary, True, sc.to_dict())[1] == []
    again = run_emulation(sc, tmp_path / "again", work=StandIn(), key=KEY if sealed else None)
    assert again["model_sha256"] == summary["model_sha256"]


def test_feddrop_closes_a_round_once_all_but_k_hat_answered(tmp_path):
    sc = fl_scenario(**{"fl.algorithm": "feddrop", "fl.feddrop.k_hat": 2, "compute.nodes.client6.slowdown": 5})
    summary = run_emulation(sc, tmp_path / "run", work=StandIn())
    events = read_events(tmp_path / "run")
    closes = of(events, "round_close")
    assert [(e["ready"], e["expected"], e["timed_out"]) for e in closes] == [(4, 6, False)] * 3
    assert all("client6" not in e["clients"] for e in closes)   # the slow one is always dropped
    assert summary["updates"]["accepted"] == 12 and summary["updates"].get("late", 0) >= 1


def test_tifl_asks_one_tier_a_round_after_the_first(tmp_path):
    slow = {f"compute.nodes.client{i}.slowdown": 4 for i in (4, 5, 6)}
    sc = fl_scenario(**{"fl.algorithm": "tifl", "fl.rounds": 6, "fl.tifl.tier_probs": "[0.5, 0.5]", **slow})
    run_emulation(sc, tmp_path / "run", work=StandIn())
    events = read_events(tmp_path / "run")
    asked = [tuple(e["clients"]) for e in of(events, "sampled")]
    assert len(asked) == 5   # round 1 asks everyone, as any round would
    assert set(asked) <= {("client1", "client2", "client3"), ("client4", "client5", "client6")}
    assert len(set(asked)) == 2   # both tiers drawn over five rounds (this seed)


def test_tifl_draws_from_a_sampled_population_and_resumes_with_its_tiers(tmp_path):
    sets = {"fl.algorithm": "tifl", "fl.sample": 2, "fl.tifl.tiers": 3, "fl.tifl.credits": "[2, 1, 1]",
            "compute.nodes.client6.slowdown": 4}
    full = run_emulation(fl_scenario(**sets, **{"fl.rounds": 5}), tmp_path / "full", work=StandIn())
    events = read_events(tmp_path / "full")
    assert all(e["asked"] == 2 for e in of(events, "sampled"))
    run_emulation(fl_scenario(**sets, **{"fl.rounds": 2}), tmp_path / "part", work=StandIn())
    init = (tmp_path / "part" / "checkpoint.dtck").read_bytes()
    resumed = run_emulation(fl_scenario(**sets, **{"fl.rounds": 5}), tmp_path / "resumed", init=init,
                            work=StandIn())
    assert resumed["model_sha256"] == full["model_sha256"]


def test_asgd_by_hand_in_a_run(tmp_path):
    """One client, never stale: every update is x ← x + server_lr·Δ with the StandIn's Δ (1/100)."""
    sc = fl_scenario(**{"fl.algorithm": "asgd", "fl.clients": 1, "fl.server_lr": 0.5})
    summary = run_emulation(sc, tmp_path / "run", work=StandIn())
    x = np.zeros(16, np.float32)
    for _ in range(3):
        x = (x + 0.5 * np.float32(0.01)).astype(np.float32)
    assert summary["model_sha256"] == sha256_of(x)


@pytest.mark.parametrize("sets, path", [
    ({"fl.feddrop.k_hat": 1}, "fl.feddrop"),
    ({"fl.algorithm": "feddrop"}, "fl.feddrop.k_hat"),
    ({"fl.algorithm": "feddrop", "fl.feddrop.k_hat": 6}, "fl.feddrop.k_hat"),
    ({"fl.algorithm": "feddrop", "fl.sample": 2, "fl.feddrop.k_hat": 2}, "fl.feddrop.k_hat"),
    ({"fl.tifl.tiers": 3}, "fl.tifl"),
    ({"fl.algorithm": "tifl", "fl.tifl.tiers": 7}, "fl.tifl.tiers"),
    ({"fl.algorithm": "tifl", "fl.tifl.tiers": 4, "fl.min_clients": 2}, "fl.tifl.tiers"),   # a tier of 1
    ({"fl.algorithm": "tifl", "fl.tifl.tier_probs": "[1.0]"}, "fl.tifl.tier_probs"),
    ({"fl.algorithm": "tifl", "fl.tifl.credits": "[1, -1]"}, "fl.tifl.credits[1]"),
    ({"fl.dcasgd_lambda": 0.5}, "fl.dcasgd_lambda"),
    ({"fl.algorithm": "asgd", "fl.downlink_codec": "q8"}, "fl.downlink_codec"),
])
def test_a_bad_rule_is_refused_with_its_key(sets, path):
    with pytest.raises(ScenarioError) as err:
        fl_scenario(**sets)
    assert err.value.path == path


def test_a_rules_keys_count_in_the_digest_only_under_that_rule():
    plain = fl_scenario()
    assert plain.digest() == fl_scenario(**{"fl.algorithm": "fedavg"}).digest()
    assert fl_scenario(**{"fl.algorithm": "feddrop", "fl.feddrop.k_hat": 1}).digest() != fl_scenario(
        **{"fl.algorithm": "feddrop", "fl.feddrop.k_hat": 2}).digest()
