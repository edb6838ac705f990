"""Issue 43's FedAdam app (tests/flower_torch_app.py: an MLP with BatchNorm, FedAdam, 3 clients, 3 rounds)
under Flower's own simulation and under ``emu run``: the largest absolute difference between their final
models, pair by pair.

    python -m tools.flower_fedadam [--flower-runs 3] [--out DIR]      (Flower's simulation needs Ray)

Flower's simulation sums the replies in the order they arrive, which varies run to run, so its runs
differ among themselves in the last bits; that spread is the tolerance emu is held to.  Emu runs
under dtemu's default arithmetic (avx2) and under ``native``, the arithmetic Ray's workers use.
Each run is a subprocess with one torch thread.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CLIENTS, ROUNDS = 3, 3
PYPROJECT = f"""[project]
name = "fedadam-torch"
version = "1.0.0"

[tool.flwr.app]
publisher = "dtemu"

[tool.flwr.app.components]
serverapp = "tests.flower_torch_app:server"
clientapp = "tests.flower_torch_app:client"

[tool.flwr.app.config]
num-server-rounds = {ROUNDS}
final-path = ""
"""


def flower_sim(app_dir: Path, final: str) -> None:
    """One run of Flower's simulation (Ray backend), as tools.flower_compare runs it."""
    from flwr.app import Context, RecordDict
    from flwr.common.config import get_fused_config_from_dir, get_project_config, parse_config_args
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.server.superlink.linkstate.utils import generate_rand_int_from_bytes
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.telemetry import EventType

    components = get_project_config(app_dir)["tool"]["flwr"]["app"]["components"]
    run = Run.create_empty(run_id=generate_rand_int_from_bytes(8))
    run.override_config = parse_config_args([f'final-path="{final}"'])
    run.primary_task_id = generate_rand_int_from_bytes(8)
    run.federation_id = NOOP_FEDERATION_ID
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run.run_id, SUPERLINK_NODE_ID
    context = Context(run_id=run.run_id, node_id=0, node_config={}, state=RecordDict(),
                      run_config=get_fused_config_from_dir(app_dir, run.override_config))
    _run_simulation(num_supernodes=CLIENTS, exit_event=EventType.FLWR_SIMULATION_RUN_LEAVE,
                    server_app_attr=components["serverapp"], client_app_attr=components["clientapp"],
                    backend_name="ray", backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
                    app_dir=str(app_dir), run=run, server_app_context=context, is_app=True)


def emu(final: str) -> None:
    from dtemu.core.scenario import parse_scenario
    from dtemu.emu.run import run_emulation

    raw = {"name": "fedadam_torch", "mode": "flower", "seed": 3,
           "flower": {"server_app": "tests.flower_torch_app:server", "client_app": "tests.flower_torch_app:client",
                      "run_config": {"num-server-rounds": ROUNDS, "final-path": final}},
           "fl": {"clients": CLIENTS, "round_timeout_s": 30.0}, "compute": {"default": {"train_s_per_sample": 0.001}}}
    summary = run_emulation(parse_scenario(raw), final + ".run")
    assert summary["updates"] == {"accepted": CLIENTS * ROUNDS, "evaluated": CLIENTS * ROUNDS}, summary["updates"]


def largest_difference(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["flower-sim"]:
        flower_sim(Path(argv[1]), argv[2])
        return 0
    if argv[:1] == ["emu"]:
        emu(argv[1])
        return 0
    p = argparse.ArgumentParser(prog="python -m tools.flower_fedadam", description=__doc__.splitlines()[0])
    p.add_argument("--flower-runs", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("runs/flower_fedadam"))
    args = p.parse_args(argv)
    out = args.out.resolve()
    (out / "app").mkdir(parents=True, exist_ok=True)
    (out / "app" / "pyproject.toml").write_text(PYPROJECT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    runs = {}
    for i in range(1, args.flower_runs + 1):
        final = out / f"flower{i}.npz"
        done = subprocess.run([sys.executable, "-m", "tools.flower_fedadam", "flower-sim", str(out / "app"), str(final)],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:], sep="\n")
            return done.returncode
        runs[f"flower {i}"] = dict(np.load(final))
    for arith in ("avx2", "native"):
        final = out / f"emu_{arith}.npz"
        done = subprocess.run([sys.executable, "-m", "tools.flower_fedadam", "emu", str(final)], cwd=ROOT,
                              env={**env, "DTEMU_CPU_ARITH": arith}, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:], sep="\n")
            return done.returncode
        runs[f"emu {arith}"] = dict(np.load(final))
    names = list(runs)
    print("| | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for x in names:
        print(f"| {x} | " + " | ".join(f"{largest_difference(runs[x], runs[y]):.1e}" for y in names) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
