"""``mode: ps``, the parameter-server form of a scenario, read as the FL scenario it is.

ESync and its baselines were once a mode of their own (a parameter server, a state server and
workers).  Each is an FL rule now (core.fl.rules), so a ``ps:`` scenario keeps loading: its keys
are checked as they always were (``PSSpec``, errors named ``ps.*``) and then written in FL's form,
which is what runs.  ``ps_as_fl`` says, in notes the CLIs print, what each key became:

- the parameter server is the controller (rank 0), worker<k> is client<k> (rank k), and ESync's
  state server is the node ``ss`` after the clients (it was rank 1);
- a worker's local iterations are a client's local steps: one iteration a round (ssgd, asgd,
  dcasgd) or ``ps.fixed_iterations`` of them is ``fl.subset`` of that many batches, drawn afresh
  each round; ``ps.local_epochs`` is ``fl.epochs``;
- ``ps.global_lr`` is ``fl.server_lr``, ``ps.min_workers`` ``fl.min_clients``, ``ps.init``
  ``fl.init``, ``ps.max_time_s`` ``fl.max_time_s``; the rules' keys go to their FL sections.

A ps run's model is not the FL run's: a worker read its data as one stream of epochs, where a
client draws its samples each round, and FedAvg sums its shares in another order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dtemu.core.errors import ScenarioError
from dtemu.core.fl.names import CONTROLLER, STATE_SERVER_NODE
from dtemu.core.fl.strategy import check_tiers
from dtemu.core.schema import U16, U32, between, build, check, non_negative, positive, probability

@dataclass(frozen=True)
class PSSpec:
    """The ``ps:`` keys, as they always were (docs/scenarios.md, "mode ps")."""

    workers: int = field(default=4, metadata=check(between(1, U16 - 2, "ranks are 16 bits on the wire")))
    algorithm: Literal["esync", "ssgd", "asgd", "dcasgd", "fedavg", "fedasync", "feddrop", "tifl"] = "esync"
    rounds: int = field(default=20, metadata=check(between(1, U32, "a round is 32 bits on the wire")))
    max_time_s: float | None = field(default=None, metadata=check(positive))
    batch_size: int = field(default=32, metadata=check(positive))
    lr: float = field(default=0.05, metadata=check(positive))
    global_lr: float = field(default=1.0, metadata=check(positive))
    init: Literal["seeded", "xavier"] = "xavier"
    fixed_iterations: int | None = field(default=None, metadata=check(positive))
    max_local_iterations: int | None = field(default=None, metadata=check(positive))
    local_epochs: int = field(default=1, metadata=check(between(1, U16)))
    eval_every: int = field(default=1, metadata=check(positive))
    eval_every_s: float | None = field(default=None, metadata=check(positive))
    round_timeout_s: float = field(default=600.0, metadata=check(positive))
    min_workers: int = field(default=1, metadata=check(positive))
    query_timeout_s: float = field(default=5.0, metadata=check(positive))
    barrier_timeout_s: float = field(default=60.0, metadata=check(positive))
    dcasgd_lambda: float = field(default=0.04, metadata=check(non_negative))
    fedasync_alpha: float = field(default=0.6, metadata=check(probability))
    staleness: Literal["constant", "poly", "hinge"] = "constant"
    poly_a: float = field(default=0.5, metadata=check(non_negative))
    hinge_a: float = field(default=10.0, metadata=check(non_negative))
    hinge_b: float = field(default=4.0, metadata=check(non_negative))
    feddrop_k_hat: int = field(default=0, metadata=check(non_negative))
    tifl_tiers: int = field(default=2, metadata=check(positive))
    tifl_tier_probs: list[float] = field(default_factory=list)
    tifl_credits: list[int] = field(default_factory=list)
    tifl_workers_per_round: int = field(default=4, metadata=check(positive))


def _check(ps: PSSpec) -> None:
    """The checks across ``ps`` keys that mode ps made (FL's own checks follow on the FL form)."""
    if ps.min_workers > ps.workers:
        raise ScenarioError("ps.min_workers", f"{ps.min_workers} is more than ps.workers ({ps.workers})")
    if ps.feddrop_k_hat >= ps.workers:
        raise ScenarioError("ps.feddrop_k_hat", f"must leave at least one of the {ps.workers} workers")
    adaptive = ps.algorithm == "esync" and ps.fixed_iterations is None
    if ps.max_local_iterations is not None and not adaptive:
        raise ScenarioError("ps.max_local_iterations", "bounds ESync's adaptive rounds only "
                                                       "(ps.algorithm: esync without ps.fixed_iterations)")
    check_tiers(("ps.tifl_tiers", "ps.tifl_tier_probs", "ps.tifl_credits"), ps.tifl_tiers, ps.tifl_tier_probs,
                ps.tifl_credits, ps.workers, "workers")


# Iterations a round where the rule fixes them (None: epochs over the data, or ESync's state server).
_ONE_ITERATION = ("ssgd", "asgd", "dcasgd")


def _fl_section(ps: PSSpec, notes: list[str]) -> dict:
    algorithm = {"ssgd": "fedavg"}.get(ps.algorithm, ps.algorithm)
    fl = {"clients": ps.workers, "rounds": ps.rounds, "batch_size": ps.batch_size, "lr": ps.lr,
          "init": ps.init, "eval_every": ps.eval_every, "round_timeout_s": ps.round_timeout_s,
          "min_clients": ps.min_workers, "barrier_timeout_s": ps.barrier_timeout_s}
    if ps.max_time_s is not None:
        fl["max_time_s"] = ps.max_time_s
    iterations = ps.fixed_iterations or (1 if ps.algorithm in _ONE_ITERATION else None)
    if iterations is not None:
        if ps.algorithm == "esync":   # a fixed schedule asks the state server nothing
            algorithm = "fedavg"
        fl["subset"] = iterations * ps.batch_size
        notes.append(f"{iterations} local iteration(s) a round: fl.subset {fl['subset']} "
                     f"({iterations} batch(es) of {ps.batch_size}, drawn each round)")
    else:
        fl["epochs"] = ps.local_epochs
    if algorithm == "fedasync":
        if ps.global_lr != 1.0:
            notes.append(f"ps.global_lr ({ps.global_lr:g}) is not FedAsync's: its mixing is fl.fedasync.alpha")
        fl["fedasync"] = {"alpha": ps.fedasync_alpha, "staleness": ps.staleness, "poly_a": ps.poly_a,
                          "hinge_a": ps.hinge_a, "hinge_b": ps.hinge_b}
    else:
        fl["server_lr"] = ps.global_lr
    if algorithm == "esync":
        fl["esync"] = {"max_iterations": ps.max_local_iterations, "query_timeout_s": ps.query_timeout_s}
    elif algorithm == "dcasgd":
        fl["dcasgd_lambda"] = ps.dcasgd_lambda
    elif algorithm == "feddrop":
        if ps.feddrop_k_hat == 0:   # dropping none is FedAvg
            algorithm = "fedavg"
        else:
            fl["feddrop"] = {"k_hat": ps.feddrop_k_hat}
    elif algorithm == "tifl":
        fl["tifl"] = {"tiers": ps.tifl_tiers, "tier_probs": ps.tifl_tier_probs, "credits": ps.tifl_credits}
        fl["sample"] = min(ps.tifl_workers_per_round, ps.workers)
    if ps.eval_every_s is not None:
        notes.append(f"ps.eval_every_s ({ps.eval_every_s:g}) has no FL form: evaluations follow "
                     f"fl.eval_every ({ps.eval_every}) alone")
    fl["algorithm"] = algorithm
    return fl


def _renamer(workers: int, esync: bool):
    """A ps node's FL name (None: the node is gone: a state server no rule asks)."""
    names = {"ps": CONTROLLER, "ss": STATE_SERVER_NODE if esync else None}
    names.update({f"worker{k}": f"client{k}" for k in range(1, workers + 1)})
    return lambda name: names.get(name, name) if isinstance(name, str) else name


def _rename_nodes(raw: dict, rename, notes: list[str]) -> None:
    """Every place a scenario names a node, in FL's names."""
    def mapping(key):   # (one that is not a mapping is left as it is: the schema refuses it by its key)
        return raw.get(key) if isinstance(raw.get(key), dict) else {}

    for section in ("network", "compute"):
        nodes = mapping(section).get("nodes")
        if isinstance(nodes, dict):
            renamed = {}
            for name, value in nodes.items():
                if (new := rename(name)) is None:
                    notes.append(f"{section}.nodes.{name}: no state server under this rule; dropped")
                else:
                    renamed[new] = value
            raw[section]["nodes"] = renamed
    sites = mapping("network").get("sites")
    for site in (sites.values() if isinstance(sites, dict) else ()):
        if isinstance(site, dict) and isinstance(site.get("nodes"), list):
            site["nodes"] = [n for n in map(rename, site["nodes"]) if n is not None]
    faults = mapping("faults")

    def listed(kind):
        return faults.get(kind) if isinstance(faults.get(kind), list) else ()

    for kind in ("offline", "crashes", "corrupt"):
        kept = []
        for item in listed(kind):
            if isinstance(item, dict) and "node" in item:
                if (new := rename(item["node"])) is None:
                    notes.append(f"faults.{kind}: {item['node']}'s: no state server under this rule; dropped")
                    continue
                item["node"] = new
            kept.append(item)
        if isinstance(faults.get(kind), list):
            faults[kind] = kept
    for item in listed("partitions"):
        if isinstance(item, dict) and isinstance(item.get("nodes"), list):
            item["nodes"] = [n for n in map(rename, item["nodes"]) if n is not None]


def ps_as_fl(raw: dict) -> list[str]:
    """Rewrite ``raw`` (a scenario's mapping, overrides applied) from the ps form to FL's, in place;
    the notes that say what became what."""
    if raw.get("fl") is not None:
        raise ScenarioError("fl", "mode ps takes its keys from ps:; write the scenario as mode fl instead")
    ps = build(PSSpec, raw.pop("ps", None) or {}, "ps")
    _check(ps)
    notes: list[str] = []
    fl = _fl_section(ps, notes)
    notes.insert(0, f"mode ps is read as mode fl, fl.algorithm {fl['algorithm']} (docs/scenarios.md, \"mode ps\"): "
                    "the parameter server is the controller (rank 0), worker<k> is client<k> (rank k)"
                    + (", the state server is ss (the last rank)" if fl["algorithm"] == "esync" else ""))
    raw["mode"], raw["fl"] = "fl", fl
    _rename_nodes(raw, _renamer(ps.workers, fl["algorithm"] == "esync"), notes)
    return notes
