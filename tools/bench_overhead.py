"""Emulator overhead: wall time of ``emu run`` against the same SGD steps in a bare loop.

    python -m tools.bench_overhead scenarios/fl_codecs.yaml [--set k=v]... [--repeat 2]

The bare loop does what the emulated clients do and nothing else: for every
round and client, load the global weights, run the same mini-batches of SGD
over the same samples, and average the results; one evaluation at the end, as
the emulated run is told to do (``fl.eval_every`` = rounds).  The ratio is
emu wall time / bare wall time; both include the final evaluation and neither
includes loading the data set, which both do once.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

from dtemu.core.ml.data import round_subset
from dtemu.core.ml.models import build_model
from dtemu.core.ml.params import flatten, load_flat
from dtemu.host.scenario_file import load_scenario
from dtemu.core.ml.evaluation import evaluate
from dtemu.core.ml.workload import Workload, round_seed
from dtemu.host.datasets import load_for
from dtemu.emu.run import run_emulation


def bare_loop(scenario, work: Workload) -> float:
    """Seconds for the same SGD steps as the emulated clients, plus one evaluation."""
    fl = scenario.fl
    model = build_model(scenario.model_spec, seed=scenario.seed)
    x, y = work.dataset.x_train, work.dataset.y_train
    weights = flatten(model)
    start = time.perf_counter()
    for round_ in range(1, fl.rounds + 1):
        seed = round_seed(scenario.seed, round_)
        deltas = []
        for client in range(1, fl.clients + 1):
            load_flat(model, weights)
            opt = torch.optim.SGD(model.parameters(), lr=fl.lr, momentum=fl.momentum)
            idx = round_subset(work.partitions[client - 1], fl.subset, seed, round_, client)
            order = torch.from_numpy(np.random.default_rng(seed).permutation(idx))
            model.train()
            for _ in range(fl.epochs):
                for i in range(0, len(order), fl.batch_size):
                    batch = order[i : i + fl.batch_size]
                    opt.zero_grad()
                    F.nll_loss(model(x[batch]), y[batch]).backward()
                    opt.step()
            deltas.append(flatten(model) - weights)
        weights = weights + np.mean(deltas, axis=0)
    load_flat(model, weights)
    n = work.test_size
    evaluate(model, work.dataset.x_test[:n], work.dataset.y_test[:n])
    return time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--repeat", type=int, default=2, help="best of N for each side")
    args = p.parse_args(argv)
    scenario = load_scenario(args.scenario, args.overrides)
    scenario = dataclasses.replace(scenario, fl=dataclasses.replace(scenario.fl, eval_every=scenario.fl.rounds))
    torch.set_num_threads(scenario.threads)
    work = Workload(scenario, load_for(scenario))
    work.dataset, work.partitions  # load once, outside both timings
    emu_times, bare_times = [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            run_emulation(scenario, out, work=work)
            emu_times.append(time.perf_counter() - t0)
        bare_times.append(bare_loop(scenario, work))
    emu_s, bare_s = min(emu_times), min(bare_times)
    print(f"scenario {scenario.name} ({scenario.model}, {scenario.fl.clients} clients x {scenario.fl.rounds} rounds, "
          f"codec {scenario.fl.codec}), best of {args.repeat}")
    print(f"emu run : {emu_s:7.2f} s")
    print(f"bare    : {bare_s:7.2f} s")
    print(f"overhead: {emu_s / bare_s:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
