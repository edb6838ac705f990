"""Training cost of the built-in tasks beyond MNIST: dtemu's virtual clients against a bare loop.

    python -m tools.bench_tasks [--task cifar10_resnet18] [--clients 4] [--samples 64] [--threads 1]
                                [--device cpu|cuda]

For the task, on its own data (CIFAR-10 needs its archive, or ``--synthetic``
for random images in its shape), it times:

- a bare PyTorch loop: ``torch.optim.SGD`` steps of the task's loss over the
  same batches, one client after another, nothing else;
- ``emu run`` of one FedAvg round of ``--clients`` virtual clients training
  ``--samples`` samples each (``--jobs 1``: one after another in one process),
  wall time from the run's summary, less the evaluation it makes.

and prints samples per second of each, their ratio (the emulator's overhead
around the training) and the reference cost per sample a task may declare
(``train_s_per_sample``).  ``--device cuda``: both on the GPU (the scenario's ``device: cuda``;
the bare loop's data there too, its time waited for with torch.cuda.synchronize).  Best of ``--repeat`` runs: other load only slows one down.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def bare_loop(task, data, clients: int, samples: int, batch: int, seed: int = 1, device: str = "cpu") -> float:
    """Seconds for ``clients`` x ``samples`` samples of plain SGD on the task's loss."""
    from dtemu.core.ml.models import build_model

    data = data.to(device)
    model = build_model("task:" + task, seed).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    from dtemu.core.ml.task import task_of

    loss_fn = task_of("task:" + task).loss
    t0 = time.perf_counter()
    for c in range(clients):
        idx = torch.arange(c * samples, (c + 1) * samples) % len(data.y_train)
        for start in range(0, samples, batch):
            b = idx[start:start + batch]
            opt.zero_grad()
            loss_fn(model(data.x_train[b]), data.y_train[b]).backward()
            opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def emu_round(task: str, clients: int, samples: int, batch: int, threads: int, device: str = "cpu") -> dict:
    from dtemu.core.scenario import parse_scenario
    from dtemu.emu.run import run_emulation

    s = parse_scenario({"name": "bench-task", "seed": 1, "task": task, "threads": threads, "device": device,
                        "data": {"partition": "iid", "test_samples": batch},
                        "compute": {"default": {"train_s_per_sample": 1e-3}},
                        "fl": {"clients": clients, "rounds": 1, "subset": samples, "batch_size": batch,
                               "min_clients": clients, "lr": 0.01, "momentum": 0.9}})
    with tempfile.TemporaryDirectory() as out:
        summary = run_emulation(s, Path(out) / "run")
        events = [json.loads(line) for line in (Path(out) / "run" / "events.jsonl").read_text().splitlines()]
    return {"wall_s": summary["wall_time_s"], "events": len(events)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="cifar10_resnet18")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--samples", type=int, default=64, help="per client")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--synthetic", action="store_true", help="CIFAR-10: random images in a temporary archive")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.synthetic:
        import os
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from test_builtin_tasks import synthetic_batches  # noqa: E402

        from dtemu.core.ml import cifar

        root = Path(tempfile.mkdtemp(prefix="dtemu-cifar-"))
        (root / cifar.FOLDER).mkdir()
        # enough records that every client trains --samples of its own (five training files)
        per_file = -(-args.clients * args.samples // 5) + args.batch
        for name, blob in synthetic_batches(per_file).items():
            (root / cifar.FOLDER / name).write_bytes(blob)
        os.environ["DTEMU_DATA"] = str(root)
    from dtemu.core.ml.task import load_task
    from dtemu.host.datasets import load_task_data

    data = load_task_data(args.task)
    n = args.clients * args.samples
    if args.device == "cuda":
        from dtemu.host.devices import prepare

        prepare("cuda")   # (the emulated run asks for the same)
    bare = min(bare_loop(args.task, data, args.clients, args.samples, args.batch, device=args.device)
               for _ in range(args.repeat))
    emu = min(emu_round(args.task, args.clients, args.samples, args.batch, args.threads, args.device)["wall_s"]
              for _ in range(args.repeat))
    declared = load_task(args.task).train_s_per_sample
    print(json.dumps({"task": args.task, "device": args.device, "threads": args.threads, "clients": args.clients, "samples": args.samples,
                      "batch": args.batch, "bare_samples_per_s": round(n / bare, 1),
                      "emu_samples_per_s": round(n / emu, 1), "emu_over_bare": round(emu / bare, 3),
                      "bare_s_per_sample": float(np.float32(bare / n)), "declared_s_per_sample": declared},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
