"""Which of torch's CPU kernel choices move a trained model: one short training per setting.

    python -m tools.cpu_arith_probe

Each line trains the 1.2M CNN and the small CNN for one epoch of 2,048 random
images (batch 64, 2 threads, fixed seeds) in a fresh interpreter under one
setting, and prints the models' hashes, what a warm step costs under it, and
the arithmetic's fingerprint (host.arith_fingerprint).  "native" is what the libraries choose
on this host; each other line caps one library (or all three, as dtemu does by
default: host.cpu_arith).  A hash that differs from "native" means that choice
changes the arithmetic, so a host whose widest vector unit differs (AVX-512
against AVX2) would train another model unless the choice is fixed.
"""

from __future__ import annotations

import os
import subprocess
import sys

from dtemu.host import cpu_arith
from dtemu.host.cpu_arith import cpu_model

TRAIN = r"""
import sys, time
import numpy as np
import torch
from dtemu.core.ml.models import build_model
from dtemu.core.ml.params import flatten, sha256_of
from dtemu.core.ml.train import train_local

torch.set_num_threads(int(sys.argv[1]))
g = torch.Generator().manual_seed(0)
x = torch.randn(2048, 1, 28, 28, generator=g)
y = torch.randint(0, 10, (2048,), generator=g)
hashes, costs = [], []
for spec in ("mnist_cnn", "small_cnn"):
    model = build_model(spec, 1)
    train_local(model, x, y, np.arange(2048), epochs=1, batch_size=64, lr=0.05, seed=3)
    hashes.append(sha256_of(flatten(model))[:12])
    t0 = time.perf_counter()  # a second epoch, warm, for the setting's cost
    train_local(model, x, y, np.arange(2048), epochs=1, batch_size=64, lr=0.05, seed=4)
    costs.append(f"{(time.perf_counter() - t0) / 32 * 1e3:.1f}")
from dtemu.host.arith_fingerprint import fingerprint
print(torch.backends.cpu.get_cpu_capability(), *hashes, *costs, fingerprint())
"""

MOST_PORTABLE = cpu_arith.SETTINGS["exact"]
SETTINGS = [
    ("native (the libraries choose)", {}),
    ("ATen: ATEN_CPU_CAPABILITY=default", {"ATEN_CPU_CAPABILITY": "default"}),
    ("oneDNN: ONEDNN_MAX_CPU_ISA=AVX", {"ONEDNN_MAX_CPU_ISA": "AVX"}),
    ("oneDNN: ONEDNN_MAX_CPU_ISA=SSE41", {"ONEDNN_MAX_CPU_ISA": "SSE41"}),
    ("MKL: MKL_CBWR=COMPATIBLE", {"MKL_CBWR": "COMPATIBLE"}),
    ("MKL: MKL_CBWR=AVX2", {"MKL_CBWR": "AVX2"}),
    ("dtemu's default (all three at AVX2)", dict(cpu_arith.PORTABLE)),
    ("DTEMU_CPU_ARITH=exact (every library at its most portable)", MOST_PORTABLE),
    # cheaper than exact if it also holds across vendors (not yet measured on an Intel host)
    ("candidate: ATen default, oneDNN AVX2, MKL COMPATIBLE",
     {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
      "MKL_CBWR": "COMPATIBLE"}),
]
EXTRA_1_THREAD = [("native", {}), ("DTEMU_CPU_ARITH=exact (every library at its most portable)", MOST_PORTABLE)]


def run(env: dict, threads: int = 2) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in (*cpu_arith.KNOBS, cpu_arith.SWITCH)}
    done = subprocess.run([sys.executable, "-c", TRAIN, str(threads)], capture_output=True, text=True,
                          env={**clean, cpu_arith.SWITCH: "native", **env}, timeout=600)
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def main() -> int:
    print(f"host: {cpu_model()}\n")
    print("| setting | ATen capability | mnist_cnn | small_cnn | ms/step mnist_cnn | ms/step small_cnn "
          "| fingerprint |\n|---|---|---|---|---|---|---|")
    lines = [(name, env, 2) for name, env in SETTINGS] + [(name + ", 1 thread", env, 1) for name, env in EXTRA_1_THREAD]
    for name, env, threads in lines:
        cap, a, b, ta, tb, fp = (run(env, threads).split() + ["?"] * 6)[:6]
        print(f"| {name} | {cap} | `{a}` | `{b}` | {ta} | {tb} | `{fp}` |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
