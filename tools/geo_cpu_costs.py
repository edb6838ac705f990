"""What geo's roles spend on this machine's CPU outside the gradient, per op, for emu's
``compute.default.cpu`` (core.runtime.compute.CPU_OPS; docs/scenarios.md).

    python -m tools.geo_cpu_costs --scenario scenarios/geo_bisparse_fp16.yaml [--set model=mnist_cnn]

Measured, not fitted: the code geo's roles run (core.geo.roles, core.geo.sums, core.geo.payload,
core.geo.bisparse) is timed here on vectors of the scenario's model with its settings (fp16,
density, dense_below, the optimizer), median of a few repetitions, in the scenario's torch
threads (the ranks run with ``threads``), one process:

* encode: a worker's push, ``encode_dense(grad_vector(model))`` (a PS's dense answer is the
  same encoding of one vector);
* sum: a local PS's share of its workers' dense gradients (``site_share``), per payload;
* sparsify: BiSparse at a local PS: the residual update, threshold and top-k, the encoding;
* merge: the global PS's sum by index of the sites' BiSparse payloads and its encoding, per payload;
* densify: a sparse aggregate made dense and encoded for a site's workers (``site_downlink``);
* apply: the aggregate into the model (``Applier.apply``: an SGD step).

Each in seconds per MB (1e6 bytes) of the model's fp32 vector (4 bytes a parameter), the unit of
``compute.cpu.<op>_s_per_mb``.  One thread on an idle core: what several ranks on fewer cores
cost each other is emu's ``compute.shared_cores``, not part of these rates.

``--messages``: also what one message costs whatever its size, ``compute.send_s_per_message`` and
``recv_s_per_message``, measured as tools.bench_small_messages does (48-byte messages 0.3 ms
apart over DDS on loopback, one writer, one reader process, geo's topics handed over by the
receive thread): the writer's CPU in ``send``, the reader process's CPU per message.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from dtemu.core.runtime.compute import CPU_OPS


def geo_cpu_costs(scenario, reps: int = 7) -> dict[str, float]:
    """{op: seconds per MB of the model's fp32 vector} for ``scenario``'s model and geo settings."""
    import torch

    from dtemu.core.geo.bisparse import ResidualSparsifier, whole_blocks
    from dtemu.core.geo.common import Applier, grad_vector, site_downlink, worker_optimizer_momentum
    from dtemu.core.geo.payload import decode, encode_dense, sum_sparse
    from dtemu.core.geo.roles import _encode_bisparse
    from dtemu.core.geo.sums import site_share
    from dtemu.core.ml.models import build_model
    from tools.transport_costs import _median_s

    torch.set_num_threads(scenario.threads)
    g = scenario.geo
    model = build_model(scenario.model, scenario.seed)
    sizes = [p.numel() for p in model.parameters()]
    dim = sum(sizes)
    mb = 4 * dim / 1e6
    rng = np.random.default_rng(0)

    def vec() -> np.ndarray:
        return (rng.standard_normal(dim) * 1e-2).astype(np.float32)

    for p in model.parameters():
        p.grad = torch.from_numpy(rng.standard_normal(p.numel()).astype(np.float32)).view_as(p)
    n = max(1, g.workers_per_site)
    pushes = {f"w{i}": (decode(encode_dense(1, vec(), g.fp16), dim), b"") for i in range(n)}
    costs = {
        "encode": _median_s(lambda: encode_dense(1, grad_vector(model), g.fp16), reps) / mb,
        "sum": _median_s(lambda: site_share(pushes, list(pushes), dim, 2 * n, n, g.sync), reps) / mb / n,
    }
    applier = Applier(model, g.lr_at, worker_optimizer_momentum(g), False)
    update = vec() * np.float32(1e-3)
    costs["apply"] = _median_s(lambda: applier.apply(update, 1), reps) / mb

    # BiSparse: each site's sparsifier after a few rounds (its residual is what it would be), the
    # sites' payloads as the global PS gets them, their merged aggregate as a local PS gets it.
    sites = 2
    blocks = whole_blocks(sizes, g.dense_below)
    sparsifiers = [ResidualSparsifier(sizes, g.density, g.sample_ratio, g.residual_momentum, scenario.seed, s,
                                      g.dense_below, g.momentum_masking, half_whole=g.fp16) for s in range(sites)]
    r = 5
    for r in range(1, 6):
        payloads = [decode(_encode_bisparse(r, dim, sp.blocks, *sp.compress(vec(), r, g.density), g.fp16), dim)
                    for sp in sparsifiers]
    share = vec()
    costs["sparsify"] = _median_s(lambda: _encode_bisparse(
        r, dim, sparsifiers[0].blocks, *sparsifiers[0].compress(share, r, g.density), g.fp16), reps) / mb
    costs["merge"] = _median_s(lambda: _encode_bisparse(r, dim, blocks, *sum_sparse(payloads, dim), g.fp16),
                               reps) / mb / sites
    merged = _encode_bisparse(r, dim, blocks, *sum_sparse(payloads, dim), g.fp16)
    pull = decode(merged, dim)
    costs["densify"] = _median_s(lambda: site_downlink(pull, merged, g.fp16), reps) / mb
    assert set(costs) == set(CPU_OPS)
    return costs


def message_costs(messages: int = 2000, gap_ms: float = 0.3, size: int = 48) -> dict[str, float]:
    """Seconds of CPU per message, whatever its size: the writer's ``send`` and the reader process
    (its receive thread, the hand-off, the thread in ``recv``), over DDS on loopback."""
    import os
    import subprocess
    import sys

    from tools.bench_small_messages import write

    domain = 140 + os.getpid() % 30
    rx = subprocess.Popen([sys.executable, "-m", "tools.bench_small_messages", "--read", "thread", "--domain",
                           str(domain), "--messages", str(messages)], stdout=subprocess.PIPE, text=True)
    try:
        if rx.stdout.readline().strip() != "ready":
            raise RuntimeError("the reader failed to start")
        wrote = write(domain, messages, size, gap_ms / 1000)
        read = json.loads(rx.communicate(timeout=120)[0].strip().splitlines()[-1])
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    return {"send": wrote["send_us"] * 1e-6, "recv": read["process_us"] * 1e-6}


def cpu_sets(costs: dict[str, float], shared_cores: int = 0, messages: dict[str, float] | None = None) -> list[str]:
    """emu --set overrides: every node's CPU rates (compute.default.cpu), the cost of a message
    (``message_costs``) and the shared cores."""
    # .6e: YAML reads 9e-05 as a string, 9.000000e-05 as a number
    sets = [f"compute.default.cpu.{op}_s_per_mb={costs[op]:.6e}" for op in CPU_OPS]
    if messages:
        sets += [f"compute.default.{side}_s_per_message={messages[side]:.6e}" for side in ("send", "recv")]
    if shared_cores:
        sets.append(f"compute.shared_cores={shared_cores}")
    return sets


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="geo_cpu_costs", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="scenarios/geo_hips.yaml")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--messages", action="store_true", help="also the CPU of one message over DDS (loopback)")
    args = p.parse_args(argv)
    from dtemu.host.scenario_file import load_scenario

    scenario = load_scenario(args.scenario, args.sets)
    costs = geo_cpu_costs(scenario, args.reps)
    print(json.dumps({"scenario": scenario.name, "model": scenario.model, "fp16": scenario.geo.fp16,
                      "s_per_mb": costs, "ms_per_model": {k: v * 4e-6 * _dim(scenario) * 1e3 for k, v in costs.items()},
                      **({"s_per_message": message_costs()} if args.messages else {})}, indent=2))
    return 0


def _dim(scenario) -> int:
    from dtemu.core.ml.models import build_model
    from dtemu.core.ml.params import num_params

    return num_params(build_model(scenario.model, scenario.seed))


if __name__ == "__main__":
    raise SystemExit(main())
