"""Training cost per sample of the registered models: the emulator's reference costs.

    python -m tools.bench_train [--threads 2] [--steps 100] [--repeat 5]

The best of ``--repeat`` one-epoch runs of ``--steps`` steps at batch 64, after
a warm-up (other load only slows a run down). ``core/models.py`` stores what it
printed on the reference machine as each model's ``train_s_per_sample``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dtemu.core.ml.models import MODELS, build_model
from dtemu.core.ml.train import train_local


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    n = 64 * args.steps
    x, y, idx = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,)), np.arange(n)
    for name, info in MODELS.items():
        model = build_model(name, 0)
        train_local(model, x, y, idx, epochs=1, batch_size=64, lr=0.01, seed=0)  # warm-up
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            train_local(model, x, y, idx, epochs=1, batch_size=64, lr=0.01, seed=0)
            times.append(time.perf_counter() - t0)
        best = min(times)
        print(f"{name}: {best / n:.3g} s/sample ({best / args.steps * 1e3:.1f} ms/step); "
              f"stored: {info.train_s_per_sample:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
