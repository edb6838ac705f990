"""One DGC bucket per step, or one message per tensor? Measured over DDS on loopback.

    python -m tools.bench_bucket [--world 2] [--repeats 200] [--fp16]

Each of ``--world`` processes allgathers, per step, the DGC payload of the
1.2M-parameter CNN after warm-up (density 0.001; the sizes come from a real
``DGCCompressor`` bucket): either as one bucket (what ``DGCExchange`` does) or
as one message per tensor (eight allgathers started together, then waited
for). The time of a step is the slowest rank's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import traceback

from tools.bench_collectives import _one_thread, _run_world


def payload_sizes(fp16: bool) -> tuple[int, list[int]]:
    """(bucket bytes, per-tensor bytes) of one step after warm-up."""
    import torch

    from dtemu.core.wire.bucket import encode_bucket
    from dtemu.core.compression.dgc import DGCCompressor, DGCConfig, param_shapes
    from dtemu.core.ml.models import build_model

    model = build_model("mnist_cnn", seed=0)
    shapes = param_shapes(model)
    comp = DGCCompressor(shapes, DGCConfig(density=0.001, fp16_values=fp16), world_size=2, rank=0)
    bucket = comp.compress([torch.randn(s) for _, s in shapes], step=0)
    value_bytes = 2 if fp16 else 4
    per_tensor = [len(p.values) * value_bytes + (0 if p.indices is None else 4 * len(p.indices))
                  for p in bucket.payloads]
    return len(encode_bucket(bucket)), per_tensor


def _role(ctx, rank, names, bucket_bytes, tensor_bytes, repeats, warmup):
    from dtemu.core.ddp.collectives import Collective

    coll = Collective(ctx, rank, names)
    yield from coll.barrier(ctx.now() + 60)
    times = {"bucket": [], "per_tensor": []}
    rnd = 0
    for i in range(warmup + repeats):
        for mode in ("bucket", "per_tensor"):
            rnd += 1
            yield from coll.allgather(rnd, "sync", b"s", ctx.now() + 60)
            t0 = time.perf_counter()
            if mode == "bucket":
                yield from coll.allgather(rnd, "bucket", bytes(bucket_bytes), ctx.now() + 60)
            else:
                handles = []
                for j, n in enumerate(tensor_bytes):
                    handles.append((yield from coll.start_allgather(rnd, f"t{j}", bytes(n))))
                for h in handles:
                    yield from coll.wait(h, ctx.now() + 60)
                    coll.collect(h)
            if i >= warmup:
                times[mode].append(time.perf_counter() - t0)
    yield from coll.allgather(rnd + 1, "sync", b"s", ctx.now() + 60)
    return times


def _worker(rank, world, domain, bucket_bytes, tensor_bytes, repeats, warmup, queue):
    try:
        _one_thread()
        from dtemu.core.wire.topics import COLL_FRAMES
        from dtemu.host.rundir import RunDir
        from dtemu.core.runtime.driver import run_blocking
        from dtemu.real.node import real_driver
        from dtemu.real.transport import DdsTransport

        names = [f"bench{r}" for r in range(world)]
        with tempfile.TemporaryDirectory(prefix="bench-bucket-") as tmp:
            run = RunDir(tmp)
            try:
                with DdsTransport(names[rank], domain_id=domain, subscribe=[COLL_FRAMES]) as transport:
                    node = real_driver(names[rank], transport, run, publishes=[COLL_FRAMES])
                    result = run_blocking(node.run(_role(node, rank, names, bucket_bytes, tensor_bytes, repeats, warmup)))
                    transport.flush(timeout_s=5.0)
            finally:
                run.close()
        queue.put((rank, result, {}))
    except BaseException:
        queue.put((rank, None, {"error": traceback.format_exc()}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--domain", type=int, default=211)
    args = p.parse_args(argv)
    bucket_bytes, tensor_bytes = payload_sizes(args.fp16)
    res = _run_world(_worker, args.world, lambda r: (r, args.world, args.domain, bucket_bytes, tensor_bytes,
                                                      args.repeats, args.warmup), 600)
    print(f"DGC payload of mnist_cnn at density 0.001 ({'fp16' if args.fp16 else 'fp32'} values), "
          f"{args.world} processes on loopback, {args.repeats} steps")
    print(f"one bucket: {bucket_bytes:,} bytes; per tensor: {tensor_bytes} ({sum(tensor_bytes):,} bytes)")
    print("| exchange | median ms | p90 ms |")
    print("|---|---|---|")
    for mode in ("bucket", "per_tensor"):
        slowest = [max(ts) for ts in zip(*(res[r][0][mode] for r in sorted(res)))]
        slowest.sort()
        print(f"| {mode.replace('_', ' ')} | {statistics.median(slowest) * 1e3:.2f} | "
              f"{slowest[int(0.9 * (len(slowest) - 1))] * 1e3:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
