"""A small PyTorch Flower app, in the shape of Flower's quickstart-pytorch: an MLP with a BatchNorm
layer (its ``num_batches_tracked`` is an int64 buffer), trained by FedAdam (the ServerApp calls
``flwr.serverapp.strategy.FedAdam(...).start()``; under NumPy 2 its arithmetic sends float64 arrays
from round 2 on, and the clients answer in float32).  Synthetic data, seeded by the partition: no
archive needed.  The ServerApp writes its final arrays to ``final-path`` (np.savez) if set.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAdam


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.fc2 = torch.nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def _data(partition: int, n: int = 96):
    g = torch.Generator().manual_seed(100 + partition)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 1).long()
    return x, y


def _load(msg: Message) -> Net:
    torch.manual_seed(0)
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict(), strict=True)
    return net


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    torch.manual_seed(0)
    strategy = FedAdam(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=2, min_evaluate_nodes=2,
                       min_available_nodes=2, eta=0.05)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()),
                            num_rounds=int(context.run_config["num-server-rounds"]))
    path = str(context.run_config.get("final-path", ""))
    if path:
        np.savez(path, **{k: result.arrays[k].numpy() for k in result.arrays})


client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    net = _load(msg)
    x, y = _data(int(context.node_config["partition-id"]))
    torch.manual_seed(int(context.node_config["partition-id"]))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net.train()
    loss = torch.tensor(0.0)
    for i in range(0, len(x), 32):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x[i:i + 32]), y[i:i + 32])
        loss.backward()
        opt.step()
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(x), "train_loss": float(loss.detach())})})
    return Message(content=content, reply_to=msg)


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    net = _load(msg)
    x, y = _data(1000 + int(context.node_config["partition-id"]), 64)
    net.eval()
    with torch.no_grad():
        accuracy = float((net(x).argmax(dim=1) == y).float().mean())
    return Message(content=RecordDict({"metrics": MetricRecord({"num-examples": len(x), "eval_acc": accuracy})}),
                   reply_to=msg)
