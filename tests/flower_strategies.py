"""A numpy-only Flower app for the strategy matrix (tests/test_flower_strategies.py), in the shapes
Flower's documentation shows: the ServerApp runs the strategy its run config names (``strategy``)
with ``strategy.start`` on a two-array model; the ClientApp moves each array part of the way to a
target of its own (its partition) and reports its examples, a train loss and an accuracy.

Three ClientApps: ``client`` plain, and ``client_fixed`` / ``client_adaptive`` behind Flower's own
client-side clipping mods (what the client-side DP wrappers need), plus ``client_own_mod`` behind a
mod written here.  The ServerApp seeds numpy before it starts (the DP wrappers draw their noise
from it) and writes its final arrays to the run config's ``final-path`` (np.savez), if set.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp import strategy as flower

MODEL = {"w": np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3), "b": np.zeros(3, dtype=np.float32)}


def _base(cls, clients: int, **kw):
    return cls(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=clients, min_evaluate_nodes=clients,
               min_available_nodes=clients, **kw)


def build(name: str, clients: int):
    """The strategy ``name`` of flwr.serverapp.strategy, for ``clients`` clients all asked each round."""
    wrapped = {"DifferentialPrivacyServerSideFixedClipping": dict(clipping_norm=1.0),
               "DifferentialPrivacyClientSideFixedClipping": dict(clipping_norm=1.0),
               "DifferentialPrivacyServerSideAdaptiveClipping": {},
               "DifferentialPrivacyClientSideAdaptiveClipping": {}}
    if name in wrapped:
        return getattr(flower, name)(_base(flower.FedAvg, clients), noise_multiplier=0.01,
                                     num_sampled_clients=clients, **wrapped[name])
    own = {"QFedAvg": dict(client_learning_rate=0.1), "FedAvgM": dict(server_momentum=0.9),
           "FedProx": dict(proximal_mu=0.1), "FedTrimmedAvg": dict(beta=0.2),
           "MultiKrum": dict(num_nodes_to_select=3), "Krum": dict(num_malicious_nodes=1),
           "Bulyan": dict(num_malicious_nodes=0)}
    return _base(getattr(flower, name), clients, **own.get(name, {}))


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    np.random.seed(int(config.get("numpy-seed", 0)))
    strategy = build(str(config["strategy"]), len(list(grid.get_node_ids())))
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({k: Array(v.copy()) for k, v in MODEL.items()}),
                            num_rounds=int(config["num-server-rounds"]), train_config=ConfigRecord({"lr": 0.5}))
    path = str(config.get("final-path", ""))
    if path:   # the arrays, and what the last round's train metrics say of a mod's calls (-1: none)
        last = result.train_metrics_clientapp.get(int(config["num-server-rounds"]), {})
        np.savez(path, mod_calls=np.float64(last.get("mod-calls", -1)),
                 **{k: result.arrays[k].numpy() for k in MODEL})


def _target(context: Context) -> float:
    return 0.25 * (int(context.node_config["partition-id"]) + 1)


def _train(msg: Message, context: Context) -> Message:
    k = int(context.node_config["partition-id"])
    lr = float(msg.content["config"].get("lr", 0.5))
    arrays = {name: a.numpy() for name, a in msg.content["arrays"].items()}
    new = {name: Array((a + lr * (_target(context) - a)).astype(np.float32)) for name, a in arrays.items()}
    loss = float(np.mean([np.abs(_target(context) - a).mean() for a in arrays.values()]))
    content = RecordDict({"arrays": ArrayRecord(new),
                          "metrics": MetricRecord({"num-examples": 10 * (k + 1), "train_loss": loss})})
    return Message(content=content, reply_to=msg)


def _evaluate(msg: Message, context: Context) -> Message:
    k = int(context.node_config["partition-id"])
    arrays = [a.numpy() for a in msg.content["arrays"].values()]
    accuracy = float(1.0 / (1.0 + np.mean([np.abs(_target(context) - a).mean() for a in arrays])))
    return Message(content=RecordDict({"metrics": MetricRecord({"num-examples": 10 * (k + 1),
                                                                "eval_acc": accuracy})}), reply_to=msg)


def _app(mods=(), train_mods=()) -> ClientApp:
    """``mods`` wrap every call; ``train_mods`` the train calls alone (Flower's clipping mods take
    train messages only, as its docs place them: ``@app.train(mods=[...])``)."""
    app = ClientApp(mods=list(mods))
    app.train(mods=list(train_mods))(_train)
    app.evaluate()(_evaluate)
    return app


def tagging_mod(msg: Message, context: Context, call_next) -> Message:
    """A user's own mod: counts its calls in the Context's state and tags every reply's metrics."""
    seen = context.state.config_records.get("mod", ConfigRecord({"calls": 0}))
    seen["calls"] = int(seen["calls"]) + 1
    context.state.config_records["mod"] = seen
    reply = call_next(msg, context)
    if reply.has_content() and "metrics" in reply.content:
        reply.content["metrics"]["mod-calls"] = int(seen["calls"])
    return reply


client = _app()
client_fixed = _app(train_mods=[fixedclipping_mod])
client_adaptive = _app(train_mods=[adaptiveclipping_mod])
client_own_mod = _app([tagging_mod])


# --- XGBoost (FedXgbBagging, FedXgbCyclic): the model is a booster's bytes, one uint8 array ------------
XGB_PARAMS = {"objective": "binary:logistic", "eta": 0.3, "max_depth": 3, "nthread": 1, "seed": 0,
              "tree_method": "hist"}

server_xgb = ServerApp()


@server_xgb.main()
def main_xgb(grid: Grid, context: Context) -> None:
    config = context.run_config
    clients = len(list(grid.get_node_ids()))
    if config["strategy"] == "FedXgbCyclic":
        strategy = flower.FedXgbCyclic(fraction_train=1.0, fraction_evaluate=1.0, min_available_nodes=clients)
    else:
        strategy = _base(flower.FedXgbBagging, clients)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord([np.frombuffer(b"", dtype=np.uint8)]),
                            num_rounds=int(config["num-server-rounds"]))
    path = str(config.get("final-path", ""))
    if path:
        np.savez(path, mod_calls=np.float64(-1), booster=result.arrays["0"].numpy())


def _xgb_data(context: Context):
    import xgboost as xgb

    rng = np.random.default_rng(int(context.node_config["partition-id"]))
    x = rng.standard_normal((200, 5)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0, 1.5]) + 0.3 * rng.standard_normal(200) > 0).astype(np.float32)
    return xgb.DMatrix(x, label=y), x, y


def _booster(msg: Message):
    import xgboost as xgb

    raw = msg.content["arrays"]["0"].numpy().tobytes()
    if not raw:
        return None
    bst = xgb.Booster(params=XGB_PARAMS)
    bst.load_model(bytearray(raw))
    return bst


def _xgb_train(msg: Message, context: Context) -> Message:
    import xgboost as xgb

    data, _, _ = _xgb_data(context)
    bst = _booster(msg)
    if bst is None:
        bst = xgb.train(XGB_PARAMS, data, num_boost_round=1)
    else:   # one more tree on the local data; bagging sends that tree alone, as Flower's example does
        bst.update(data, bst.num_boosted_rounds())
        if "FedXgbBagging" == str(context.run_config["strategy"]):
            bst = bst[bst.num_boosted_rounds() - 1: bst.num_boosted_rounds()]
    model = np.frombuffer(bytes(bst.save_raw("json")), dtype=np.uint8)
    k = int(context.node_config["partition-id"])
    return Message(content=RecordDict({"arrays": ArrayRecord([model]),
                                       "metrics": MetricRecord({"num-examples": 200 + k})}), reply_to=msg)


def _xgb_evaluate(msg: Message, context: Context) -> Message:
    import xgboost as xgb

    data, _, y = _xgb_data(context)
    bst = _booster(msg)
    accuracy = float(((bst.predict(data) > 0.5) == y).mean()) if bst is not None else 0.0
    return Message(content=RecordDict({"metrics": MetricRecord({"num-examples": 200, "eval_acc": accuracy})}),
                   reply_to=msg)


client_xgb = ClientApp()
client_xgb.train()(_xgb_train)
client_xgb.evaluate()(_xgb_evaluate)


# --- a ServerApp that drives the grid by hand: push, pull, send_and_receive, query messages -------
server_by_hand = ServerApp()


@server_by_hand.main()
def main_by_hand(grid: Grid, context: Context) -> None:
    """Asks every node for its partition (a query, pushed, then pulled until all are in), then trains
    twice with send_and_receive, keeping its own count of rounds in ``context.state``."""
    nodes = sorted(grid.get_node_ids())
    queries = [Message(RecordDict({"config": ConfigRecord({"ask": "partition"})}), node, "query") for node in nodes]
    ids, answers, pulls = list(grid.push_messages(queries)), {}, 0
    while len(answers) < len(ids) and pulls < 1000:   # (a pull with nothing in waits on the runtime's clock)
        pulls += 1
        for reply in grid.pull_messages(ids):
            answers[reply.metadata.reply_to_message_id] = int(reply.content["answer"]["partition"])
    model = ArrayRecord({k: Array(v.copy()) for k, v in MODEL.items()})
    for _ in range(int(context.run_config["num-server-rounds"])):
        done = context.state.config_records.get("rounds", ConfigRecord({"n": 0}))
        done["n"] = int(done["n"]) + 1
        context.state.config_records["rounds"] = done
        content = RecordDict({"arrays": model, "config": ConfigRecord({"lr": 0.5, "server-round": int(done["n"])})})
        replies = grid.send_and_receive([Message(content, node, "train") for node in nodes])
        model = ArrayRecord({k: Array(np.mean([r.content["arrays"][k].numpy() for r in replies], axis=0)
                                      .astype(np.float32)) for k in MODEL})
    path = str(context.run_config.get("final-path", ""))
    if path:
        np.savez(path, mod_calls=np.float64(-1), partitions=np.array(sorted(answers.values())),
                 rounds=np.int64(context.state.config_records["rounds"]["n"]),
                 **{k: model[k].numpy() for k in MODEL})


@client.query()
def _query(msg: Message, context: Context) -> Message:
    answer = ConfigRecord({"partition": int(context.node_config["partition-id"])})
    return Message(content=RecordDict({"answer": answer}), reply_to=msg)
