"""``fl.algorithm``: the FL controller's strategy (core.fl.strategy), built from the scenario.

Synchronous rounds, FedAvg's aggregation (core.fl.aggregate) unless a server optimizer steps
(core.fl.server_opt):

- fedavg; fedprox (the difference is in the clients' loss, core.ml);
- fedadam, fedyogi, fedadagrad;
- feddrop: a round closes once all but ``fl.feddrop.k_hat`` of the clients asked have answered;
- tifl: the clients asked are one tier's (``fl.tifl``), the tiers measured in the first round;
- esync: each client trains until the state server says SYNC (``fl.esync``, core.fl.esync), so
  fast clients run more local iterations than slow ones and all arrive about together.

One update at a time (core.fl.fedasync): fedasync, asgd and dcasgd, the rules ps has too, built
from the same classes.
"""

from __future__ import annotations

from dtemu.core.fl.aggregate import FedAvg
from dtemu.core.fl.server_opt import SECOND_MOMENTS, ServerOptimizer
from dtemu.core.fl.strategy import ASGD, DCASGD, ChoosesByTier, FedAsync, Strategy, Tiers, drop_quorum

ASYNCHRONOUS = ("fedasync", "asgd", "dcasgd")
# Rules that bring a state server (a node of its own, "ss", after the clients): esync's clients ask
# it after each local iteration whether to train once more (core.fl.esync); its aggregation is FedAvg's.
STATE_SERVER = ("esync",)


class FedDrop(FedAvg):
    def __init__(self, server_lr: float, k_hat: int):
        super().__init__(server_lr)
        self.k_hat = k_hat

    def quorum(self, expected: int) -> int:
        return drop_quorum(expected, self.k_hat)


class TiFL(ChoosesByTier, FedAvg):
    """FedAvg over the clients of one tier a round (core.fl.strategy.Tiers); the first round asks
    as any round would, and its answers make the tiers."""

    def __init__(self, server_lr: float, tiers: Tiers):
        super().__init__(server_lr)
        self.tiers = tiers


def fl_strategy(scenario) -> Strategy:
    fl = scenario.fl
    if fl.algorithm in SECOND_MOMENTS:
        o = fl.server_opt
        return ServerOptimizer(fl.algorithm, o.eta, o.beta1, o.beta2, o.tau)
    if fl.algorithm == "feddrop":
        return FedDrop(fl.server_lr, fl.feddrop.k_hat)
    if fl.algorithm == "tifl":
        t = fl.tifl
        return TiFL(fl.server_lr, Tiers(scenario.client_names, t.tiers, t.tier_probs, t.credits,
                                        fl.asked_per_round, scenario.seed))
    if fl.algorithm == "fedasync":
        a = fl.fedasync
        return FedAsync(a.alpha, a.staleness, a.poly_a, a.hinge_a, a.hinge_b)
    if fl.algorithm == "asgd":
        return ASGD(fl.server_lr)
    if fl.algorithm == "dcasgd":
        return DCASGD(fl.server_lr, fl.lr, fl.dcasgd_lambda)
    return FedAvg(server_lr=fl.server_lr)   # fedavg, fedprox, esync
