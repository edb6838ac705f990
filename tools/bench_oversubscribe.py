"""What N training processes of T torch threads cost each on this machine's cores, per OpenMP wait policy.

    python -m tools.bench_oversubscribe [--procs 1,2,4] [--threads 1,2] [--policies default,PASSIVE,spin0]
                                        [--model small_cnn] [--batch 32] [--steps 40]

Each cell starts ``procs`` fresh processes with the policy in their environment
(OpenMP reads it once, when torch loads), lets them train the model together
after a barrier, and prints the median ms per sample per process.  Policies:
``default`` (the OpenMP runtime's own: libgomp spins a while, then sleeps),
``PASSIVE`` / ``ACTIVE`` (``OMP_WAIT_POLICY``), ``spinN`` (``OMP_WAIT_POLICY``
unset, ``GOMP_SPINCOUNT=N``).  Other load on the box only slows a cell down.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from dtemu.host.cpu_arith import cpu_model

_CHILD = r"""
import os, sys, time
from dtemu.host import cpu_arith
cpu_arith.fix()
import torch, torch.nn.functional as F
from dtemu.core.ml.models import build_model
model_name, batch, steps, threads, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(threads)
model = build_model(model_name, seed=0)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
def step():
    opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()
for _ in range(3):
    step()
open(go + f".{os.getpid()}", "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
t0 = time.perf_counter()
for _ in range(steps):
    step()
print((time.perf_counter() - t0) / (steps * batch))
"""


def policy_env(policy: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy in ("PASSIVE", "ACTIVE"):
        env["OMP_WAIT_POLICY"] = policy
    elif policy.startswith("spin"):
        env["GOMP_SPINCOUNT"] = policy[4:]
    elif policy != "default":
        raise SystemExit(f"unknown policy {policy!r}")
    return env


def cell(procs: int, threads: int, policy: str, model: str, batch: int, steps: int) -> float:
    """Median seconds per sample per process with ``procs`` processes training at once."""
    with tempfile.TemporaryDirectory() as tmp:
        go = os.path.join(tmp, "go")
        children = [subprocess.Popen([sys.executable, "-c", _CHILD, model, str(batch), str(steps), str(threads), go],
                                     stdout=subprocess.PIPE, text=True, env=policy_env(policy))
                    for _ in range(procs)]
        deadline = time.monotonic() + 120
        while sum(name.startswith("go.") for name in os.listdir(tmp)) < procs:
            if time.monotonic() > deadline or any(c.poll() not in (None, 0) for c in children):
                for c in children:
                    c.kill()
                raise SystemExit("a measuring process failed or did not start")
            time.sleep(0.01)
        open(go, "w").close()
        costs = sorted(float(c.communicate(timeout=600)[0]) for c in children)
    return costs[len(costs) // 2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", default="1,2,4")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--policies", default="default,PASSIVE,spin0")
    p.add_argument("--model", default="small_cnn")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args(argv)
    print(f"host: {cpu_model()}, {os.cpu_count()} cores; {args.model}, batch {args.batch}, {args.steps} steps")
    print("| processes x threads | policy | ms/sample/process |\n|---|---|---:|")
    for procs in map(int, args.procs.split(",")):
        for threads in map(int, args.threads.split(",")):
            for policy in args.policies.split(","):
                ms = cell(procs, threads, policy, args.model, args.batch, args.steps) * 1e3
                print(f"| {procs} x {threads} | {policy} | {ms:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
