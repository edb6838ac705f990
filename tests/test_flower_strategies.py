"""Every strategy of Flower's ``flwr.serverapp.strategy`` under emu, against Flower's semantics.

The matrix of docs/flower.md: each strategy the pinned Flower exports runs the numpy app of
tests/flower_strategies.py for two rounds under ``emu run``, and again under a grid that calls each
ClientApp in the order its messages were sent, with the Contexts Flower's simulation gives (no
network, no clock): what Flower's simulation gives when its clients answer in that order.  Every
reply must reach the strategy, and both must end with the same arrays, bit for bit.  The DP wrappers
draw their noise from numpy, which the app seeds.  Flower's own simulation needs Ray
(tools/flower_compare); its replies arrive in an order that varies run to run, so it is not the
reference here.
"""

from __future__ import annotations

import inspect
import random

import numpy as np
import pytest

flower = pytest.importorskip("flwr.serverapp.strategy", reason="Flower is an optional extra: "
                                                               "pip install 'dtemu[flower]'")

from dtemu.core.flower.app import node_id  # noqa: E402
from dtemu.core.scenario import parse_scenario  # noqa: E402
from dtemu.emu.run import run_emulation  # noqa: E402

CLIENTS, ROUNDS = 5, 2
NOT_STRATEGIES = {"Strategy", "Result"}
# The XGBoost strategies aggregate XGBoost models (a booster's bytes, whose length changes every
# round): their rows need xgboost (the xgboost-cpu wheel, in dtemu[flower]).
NEEDS_XGBOOST = {"FedXgbBagging", "FedXgbCyclic"}
ASKED = {"FedXgbCyclic": 1}   # clients asked a round (one at a time, in turn); the others ask every one
STRATEGIES = sorted(n for n, o in vars(flower).items() if inspect.isclass(o) and n not in NOT_STRATEGIES)


def server_app_for(name: str) -> str:
    return "tests.flower_strategies:server_xgb" if name in NEEDS_XGBOOST else "tests.flower_strategies:server"


def client_app_for(name: str) -> str:
    """The client-side DP wrappers need their clipping mods on the clients, as Flower's docs show; the
    XGBoost strategies a booster's bytes."""
    if name in NEEDS_XGBOOST:
        return "tests.flower_strategies:client_xgb"
    if name == "DifferentialPrivacyClientSideFixedClipping":
        return "tests.flower_strategies:client_fixed"
    if name == "DifferentialPrivacyClientSideAdaptiveClipping":
        return "tests.flower_strategies:client_adaptive"
    return "tests.flower_strategies:client"


def emu(tmp_path, name: str, client_app: str, server_app: str | None = None) -> tuple[dict, dict]:
    final = tmp_path / "emu.npz"
    raw = {"name": "strategy_matrix", "mode": "flower", "seed": 3,
           "flower": {"server_app": server_app or server_app_for(name), "client_app": client_app,
                      "run_config": {"num-server-rounds": ROUNDS, "strategy": name, "final-path": str(final)}},
           "fl": {"clients": CLIENTS, "round_timeout_s": 30.0},
           "compute": {"default": {"train_s_per_sample": 0.001}}}
    summary = run_emulation(parse_scenario(raw), tmp_path / "run")
    return summary, dict(np.load(final))


def reference(tmp_path, name: str, client_app: str, seed: int = 3, server_app: str | None = None,
              clients: int = CLIENTS, rounds: int = ROUNDS) -> dict:
    """The app with each ClientApp called in the order its messages were sent (see the docstring)."""
    from flwr.app import Context, Message, RecordDict
    from flwr.serverapp import Grid
    from flwr.supercore.run import Run

    from dtemu.core.flower.server import _identify
    from dtemu.host.flower_app import app_named

    server = app_named("flower.server_app", server_app or server_app_for(name), "ServerApp")
    client = app_named("flower.client_app", client_app, "ClientApp")
    final = tmp_path / "reference.npz"
    config = {"num-server-rounds": rounds, "strategy": name, "final-path": str(final)}
    ids = [node_id(i) for i in range(1, clients + 1)]
    contexts = {nid: Context(run_id=1, node_id=nid, node_config={"partition-id": i, "num-partitions": clients},
                             state=RecordDict(), run_config=dict(config)) for i, nid in enumerate(ids)}
    sent, pending = [0], {}

    class InOrder(Grid):
        run = Run.create_empty(1)

        def set_run(self, run):
            self.run = run

        def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
            return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

        def get_node_ids(self):
            return list(ids)

        def push_messages(self, messages):
            ids = []
            for message in messages:
                sent[0] += 1
                message.metadata.__dict__["_message_id"] = f"ref-{sent[0]}"
                ids.append(f"ref-{sent[0]}")
                pending[ids[-1]] = client(message, contexts[message.metadata.dst_node_id])
            return ids

        def pull_messages(self, message_ids):
            return [pending.pop(mid) for mid in message_ids if mid in pending]

        def send_and_receive(self, messages, *, timeout=None):
            return self.pull_messages(self.push_messages(messages))

    _identify()
    random.seed(seed)   # as emu seeds it: Flower's strategies sample with the random module
    server(InOrder(), Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=dict(config)))
    return dict(np.load(final))


@pytest.mark.parametrize("name", STRATEGIES)
def test_every_flower_strategy_runs_under_emu_with_flowers_model(tmp_path, name):
    if name in NEEDS_XGBOOST:
        pytest.importorskip("xgboost", reason=f"{name} aggregates XGBoost models: pip install xgboost")
    app = client_app_for(name)
    summary, got = emu(tmp_path, name, app)
    assert summary["stop_reason"] == "done" and summary["rounds"] == ROUNDS
    asked = ASKED.get(name, CLIENTS) * ROUNDS
    assert summary["updates"] == {"accepted": asked, "evaluated": asked}  # every reply reached the strategy
    want = reference(tmp_path, name, app)
    assert set(got) == set(want)
    for key in want:
        assert np.array_equal(got[key], want[key]), (key, got[key], want[key])
    if name in NEEDS_XGBOOST:
        assert got["booster"].size > 0   # a model of trees, grown from nothing
    else:
        assert not np.array_equal(got["w"], np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3))  # it trained


def test_a_users_own_client_mod_keeps_its_context_state_across_rounds(tmp_path):
    """A mod written here wraps every call; what it keeps in the Context's state lives on between calls."""
    summary, got = emu(tmp_path, "FedAvg", "tests.flower_strategies:client_own_mod")
    assert summary["updates"] == {"accepted": CLIENTS * ROUNDS, "evaluated": CLIENTS * ROUNDS}
    # each client's third call (train, evaluate, train) reports 3: the state survived between rounds
    assert float(got["mod_calls"]) == pytest.approx(3.0)  # (a mean weighted by examples)
    want = reference(tmp_path, "FedAvg", "tests.flower_strategies:client_own_mod")
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_a_serverapp_driving_the_grid_by_hand_gets_every_answer_and_keeps_its_state(tmp_path):
    """Queries pushed, then pulled until all are in; then send_and_receive; a count in Context.state."""
    by_hand = "tests.flower_strategies:server_by_hand"
    summary, got = emu(tmp_path, "by-hand", "tests.flower_strategies:client", by_hand)
    assert summary["stop_reason"] == "done" and summary["updates"]["accepted"] == CLIENTS * ROUNDS
    assert list(got["partitions"]) == list(range(CLIENTS)) and int(got["rounds"]) == ROUNDS
    want = reference(tmp_path, "by-hand", "tests.flower_strategies:client", server_app=by_hand)
    assert all(np.array_equal(got[k], want[k]) for k in ("w", "b", "partitions", "rounds"))


def test_a_pytorch_fedadam_app_with_batchnorm_uses_every_reply_and_ends_with_flowers_model(tmp_path):
    """The issue's app: FedAdam's float64 arrays answered in float32, and BatchNorm's int64 counter,
    all reach the strategy (three rounds), and the model is the in-order reference's."""
    app = {"server_app": "tests.flower_torch_app:server", "client_app": "tests.flower_torch_app:client"}
    final = tmp_path / "emu.npz"
    raw = {"name": "fedadam_torch", "mode": "flower", "seed": 3,
           "flower": {**app, "run_config": {"num-server-rounds": 3, "final-path": str(final)}},
           "fl": {"clients": 4, "round_timeout_s": 30.0}, "compute": {"default": {"train_s_per_sample": 0.001}}}
    summary = run_emulation(parse_scenario(raw), tmp_path / "run")
    assert summary["stop_reason"] == "done" and summary["rounds"] == 3
    assert summary["updates"] == {"accepted": 12, "evaluated": 12}
    got = dict(np.load(final))
    assert got["bn.num_batches_tracked"].dtype.kind in "if" and got["fc1.weight"].shape == (32, 16)
    want = reference(tmp_path, "FedAdam", app["client_app"], server_app=app["server_app"], clients=4, rounds=3)
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
