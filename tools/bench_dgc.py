"""DGC's cost per step on the 1.2M-parameter CNN, on this machine.

    python -m tools.bench_dgc [--steps 60] [--threads 2] [--workers 3] [--fp16]

Times, per step and after warm-up (density 0.001): compress (momentum
correction, clipping, sampled threshold, masking) plus encoding the bucket; and
the receiving side's decode + average of ``--workers`` buckets + the DGCSGD
step.  Gradients are real: forward/backward passes of MNIST batches (set
DTEMU_DATA), so their distribution is the one DGC meets in training.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dtemu.core.wire.bucket import decode_bucket, encode_bucket
from dtemu.host.datasets import load_dataset, resolve_root
from dtemu.core.compression.dgc import DGCSGD, DGCCompressor, DGCConfig, average_buckets, param_shapes
from dtemu.core.ml.models import build_model
from dtemu.core.ml.train import compute_gradients

DENSE_BYTES = 4 * 1_199_882


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--fp16", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load_dataset("mnist", resolve_root(None))
    model = build_model("mnist_cnn", seed=0)
    shapes = param_shapes(model)
    config = DGCConfig(density=0.001, momentum=0.9, clip_norm=2.0, weight_decay=1e-4,
                       warmup_steps_per_stage=0, fp16_values=args.fp16, seed=0)
    compressors = [DGCCompressor(shapes, config, args.workers, r) for r in range(args.workers)]
    opt = DGCSGD(shapes, config)
    params = list(model.parameters())
    rng = np.random.default_rng(0)
    compress_ms, apply_ms, sizes = [], [], []
    for step in range(args.steps):
        buckets = []
        for rank, comp in enumerate(compressors):
            batch = rng.choice(len(data.y_train), 64, replace=False)
            compute_gradients(model, data.x_train, data.y_train, batch, seed=step * 100 + rank)
            t0 = time.perf_counter()
            payload = encode_bucket(comp.compress([q.grad for q in params], step))
            if rank == 0:
                compress_ms.append((time.perf_counter() - t0) * 1e3)
            buckets.append(payload)
            sizes.append(len(payload))
        t0 = time.perf_counter()
        decoded = [decode_bucket(b, shapes, world_size=args.workers) for b in buckets]
        opt.step(params, average_buckets(decoded, shapes, args.workers), lr=0.01)
        apply_ms.append((time.perf_counter() - t0) * 1e3)
    warm = slice(5, None)  # the first steps pay for allocations
    c, a = np.array(compress_ms[warm]), np.array(apply_ms[warm])
    size = float(np.mean(sizes))
    print(f"mnist_cnn (1,199,882 params), density 0.001, {'fp16' if args.fp16 else 'fp32'} values + int32 "
          f"indices, {args.threads} threads, {args.steps - 5} steps")
    print("| part | median ms | p90 ms |")
    print("|---|---|---|")
    print(f"| compress + encode (one rank) | {np.median(c):.2f} | {np.percentile(c, 90):.2f} |")
    print(f"| decode + average {args.workers} buckets + DGCSGD step | {np.median(a):.2f} | {np.percentile(a, 90):.2f} |")
    print(f"bucket: {size:,.0f} bytes per step per rank; dense fp32: {DENSE_BYTES:,}; "
          f"ratio {DENSE_BYTES / size:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
