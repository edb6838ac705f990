"""A small Flower app for the Flower tests (numpy only): FedAvg over a four-number model; client k adds
(k + 1) / 100 times the calls it has had (its Context's state) and reports 10 (k + 1) examples; evaluate reports eval_acc 0.5 + k / 10.  Variants
misbehave on purpose (names below)."""

from __future__ import annotations

import time

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

client = ClientApp()


def _partition(context: Context) -> int:
    return int(context.node_config["partition-id"])


def _misbehaves(context: Context, msg: Message) -> str:
    """What the run config asks this client to do wrong this round ("" for nothing)."""
    who = context.run_config.get("bad-client", -1)
    when = context.run_config.get("bad-round", -1)
    round_ = int(msg.content["config"]["server-round"]) if "config" in msg.content else 0
    if _partition(context) == who and round_ in (when, -1) or (who == -2):
        return str(context.run_config.get("bad", ""))
    return ""


@client.train()
def train(msg: Message, context: Context) -> Message:
    bad = _misbehaves(context, msg)
    if bad == "raise":
        raise RuntimeError("boom in train")
    if bad == "hang":
        time.sleep(float(context.run_config.get("hang-s", 5.0)))
    if bad == "wrong_type":
        return {"not": "a message"}  # type: ignore[return-value]
    k = _partition(context)
    # the client's state counts its calls (Flower keeps a node's Context between calls), and the step
    # grows with it: a run that lost a Context on the way would train another model
    calls = int(context.state["calls"]["n"]) + 1 if "calls" in context.state else 1
    context.state["calls"] = MetricRecord({"n": calls})
    arrays = [a + np.float32((k + 1) * calls / 100) for a in msg.content["arrays"].to_numpy_ndarrays()]
    if bad == "nan":
        arrays = [a * np.float32("nan") for a in arrays]
    return Message(RecordDict({"arrays": ArrayRecord(arrays),
                               "metrics": MetricRecord({"num-examples": 10 * (k + 1), "train_loss": 1.0 / (k + 1)})}),
                   reply_to=msg)


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    k = _partition(context)
    return Message(RecordDict({"metrics": MetricRecord({"num-examples": 5, "eval_acc": 0.5 + k / 10})}),
                   reply_to=msg)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    if context.run_config.get("server-raises"):
        raise ValueError("the server app gives up")
    strategy = FedAvg(fraction_train=float(context.run_config.get("fraction-train", 1.0)), fraction_evaluate=1.0,
                      min_available_nodes=1, min_train_nodes=1, min_evaluate_nodes=1)
    strategy.start(grid=grid, initial_arrays=ArrayRecord([np.zeros(4, dtype=np.float32)]),
                   num_rounds=int(context.run_config.get("num-server-rounds", 2)))


# A legacy ServerApp (flwr.server's Strategy through server_fn): refused at load (its clients are
# driven from a thread pool); never run.
legacy_server = ServerApp(server_fn=lambda context: None)
