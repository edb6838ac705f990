"""The same Flower app under Flower's own simulation (Ray) and under dtemu's ``emu run``.

    python -m tools.flower_compare [--clients 10] [--rounds 3] [--emu-jobs N] [--skip-emu] [--skip-flower] [--out DIR]

Each runtime runs in a subprocess with one torch thread (OMP_NUM_THREADS=1,
OMP_WAIT_POLICY=PASSIVE) and writes the app's final model (run config
``final-model-path``).  Per runtime: wall time, peak memory of the process tree,
and the final model's sha256 (its state_dict's tensors as float32 bytes, in
order); then the largest absolute difference between the two final models.
Flower's FedAvg sums the replies in the order they arrive, which under Ray varies
from run to run, so even two Flower runs differ in the last bits (about 1e-7) and
in sha256: the difference is the number to read, the hashes say whether it is 0.

Memory is polled from /proc over the subprocess and all its descendants (RSS every
0.2 s, PSS every 2 s: reading PSS is dear, ``PSS_EVERY``): Ray's gcs_server,
raylet and workers are descendants of the driver, not waited-for children, and getrusage(RUSAGE_CHILDREN) would give the largest
single process, not the sum.  This process makes itself a child subreaper, so a
Ray process whose parent exits stays in the tree.  The RSS sum counts shared pages
(torch's libraries, Ray's object store) once per process; the PSS sum splits them,
so it is the closer to what the run costs the host.

``python -m tools.flower_compare flower-sim --clients N --run-config 'k=v ...'`` is
the Flower half's subprocess: what ``flwr-simulation`` does once the app is installed
(flwr.simulation.app), minus the SuperLink.  Flower's public ``run_simulation``
cannot pass a run config (its contexts' run_config is empty), hence the internal
``_run_simulation``, pinned by flwr==1.42.0.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
APP_DIR = ROOT / "scenarios" / "examples" / "flower_quickstart"
SCENARIO = ROOT / "scenarios" / "examples" / "flower_quickstart.yaml"
EMU = Path(sys.executable).parent / "emu"
POLL_S = 0.2
# PSS every tenth poll (2 s): the kernel walks a process's page tables for smaps_rollup, about 5 ms
# of CPU a process, so reading it every 0.2 s took 12% of a core from the 2-core runs it measured
# (and more under Ray's ten processes); RSS (statm) is read at every poll.
PSS_EVERY = 10
PR_SET_CHILD_SUBREAPER = 36


# ---------------------------------------------------------------------------
# The Flower half, in its subprocess
# ---------------------------------------------------------------------------


def flower_sim(clients: int, run_config: list[str]) -> None:
    """Run the app in Flower's simulation (Ray backend), its run config fused with
    ``run_config`` (``k=v`` strings, as ``flwr run --run-config`` takes them)."""
    from flwr.app import Context, RecordDict
    from flwr.common.config import get_fused_config_from_dir, get_project_config, parse_config_args
    from flwr.server.superlink.linkstate.utils import generate_rand_int_from_bytes
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.telemetry import EventType

    components = get_project_config(APP_DIR)["tool"]["flwr"]["app"]["components"]
    run = Run.create_empty(run_id=generate_rand_int_from_bytes(8))
    run.override_config = parse_config_args(run_config)
    run.primary_task_id = generate_rand_int_from_bytes(8)
    run.federation_id = NOOP_FEDERATION_ID
    # The Grid stamps its messages with this identity: the SuperLink's node id.
    TaskIdentity.task_id, TaskIdentity.run_id = 1, run.run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    # The ServerApp's context; the ClientApps' get the same fused config from app_dir + run.
    context = Context(run_id=run.run_id, node_id=0, node_config={}, state=RecordDict(),
                      run_config=get_fused_config_from_dir(APP_DIR, run.override_config))
    _run_simulation(
        num_supernodes=clients,
        exit_event=EventType.FLWR_SIMULATION_RUN_LEAVE,
        server_app_attr=components["serverapp"],
        client_app_attr=components["clientapp"],
        backend_name="ray",
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        app_dir=str(APP_DIR),
        run=run,
        server_app_context=context,
        is_app=True,
    )


# ---------------------------------------------------------------------------
# Measuring a subprocess
# ---------------------------------------------------------------------------


@dataclass
class Measured:
    name: str
    rc: int
    wall_s: float
    peak_rss: int  # bytes, the largest sum over the tree at one poll
    peak_pss: int
    model: Path
    log: Path


def children_of() -> dict[int, list[int]]:
    """Every process's children, from /proc/<pid>/stat."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])  # the name may hold spaces or ')'
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, out, todo = children_of(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def tree_memory(pid: int, pss: bool = True) -> tuple[int, int]:
    """(RSS, PSS) in bytes, summed over ``pid`` and its descendants (PSS 0 unless ``pss``)."""
    rss = pss_sum = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for p in descendants(pid):
        try:
            if not pss:   # statm: a few microseconds a process
                rss += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * page
                continue
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:  # exited, or a zombie
            continue
        for line in rollup.splitlines():
            key, _, value = line.partition(":")
            if key == "Rss":
                rss += int(value.split()[0]) * 1024
            elif key == "Pss":
                pss_sum += int(value.split()[0]) * 1024
    return rss, pss_sum


def measure(name: str, cmd: list[str], model: Path, log: Path) -> Measured:
    """Run ``cmd`` to its end, polling its process tree's memory."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    model.unlink(missing_ok=True)  # a failed run must not show an earlier run's model
    peak_rss = peak_pss = 0
    t0 = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        polls = 0
        while proc.poll() is None:
            rss, pss = tree_memory(proc.pid, pss=polls % PSS_EVERY == 0)
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
            polls += 1
            time.sleep(POLL_S)
    wall = time.perf_counter() - t0
    reap_orphans()
    return Measured(name, proc.returncode, wall, peak_rss, peak_pss, model, log)


def reap_orphans() -> None:
    """Wait for the Ray processes that were reparented to this subreaper and have exited."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# ---------------------------------------------------------------------------
# The two runs
# ---------------------------------------------------------------------------


def run_flower(clients: int, rounds: int, out: Path) -> Measured:
    model = out / "flower_final.pt"
    overrides = f'num-server-rounds={rounds} final-model-path="{model}"'
    cmd = [sys.executable, "-m", "tools.flower_compare", "flower-sim",
           "--clients", str(clients), "--run-config", overrides]
    return measure("flower-sim (ray)", cmd, model, out / "flower.log")


def run_emu(clients: int, rounds: int, out: Path, jobs: int | None = None) -> Measured:
    model = out / "emu_final.pt"
    cmd = [str(EMU), "run", str(SCENARIO), *(["--jobs", str(jobs)] if jobs else []), "--set", f"fl.clients={clients}",
           "--set", f"flower.run_config.num-server-rounds={rounds}",
           "--set", f"flower.run_config.final-model-path={model}",
           "--out", str(out / "emu"), "--no-tui"]
    return measure(f"dtemu emu (--jobs {jobs or 'default'})", cmd, model, out / "emu.log")


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


def model_vector(path: Path) -> np.ndarray | None:
    """The state_dict's tensors, in order, as one float32 vector; None if there is no model."""
    import torch

    state = torch.load(path, map_location="cpu") if path.is_file() else {}
    if not state:  # no file, or a run whose rounds all failed saved an empty state_dict
        return None
    return np.concatenate([t.detach().float().numpy().ravel() for t in state.values()])


def sha256(vector: np.ndarray | None) -> str:
    return "-" if vector is None else hashlib.sha256(vector.astype("<f4").tobytes()).hexdigest()


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return "unknown"


def table(runs: list[Measured]) -> str:
    import torch

    mib = 1024 * 1024
    rows = [f"CPU: {cpu_model()} ({os.cpu_count()} cores); torch {torch.__version__}; "
            "1 torch thread per process", "",
            "| runtime | rc | wall (s) | peak RSS sum (MiB) | peak PSS sum (MiB) | final model sha256 |",
            "|---|---|---|---|---|---|"]
    vectors = []
    for r in runs:
        vec = model_vector(r.model)
        vectors.append(vec)
        rows.append(f"| {r.name} | {r.rc} | {r.wall_s:.1f} | {r.peak_rss / mib:.0f} | "
                    f"{r.peak_pss / mib:.0f} | {sha256(vec)[:16]} |")
    if len(vectors) == 2 and all(v is not None for v in vectors):
        a, b = vectors
        diff = float(np.abs(a - b).max()) if a.shape == b.shape else float("nan")
        rows += ["", f"max |flower - emu| over the final models: {diff:.3g}"]
    return "\n".join(rows)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["flower-sim"]:
        p = argparse.ArgumentParser(prog="flower_compare flower-sim")
        p.add_argument("--clients", type=int, required=True)
        p.add_argument("--run-config", default="")
        args = p.parse_args(argv[1:])
        flower_sim(args.clients, [args.run_config])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip-emu", action="store_true")
    p.add_argument("--skip-flower", action="store_true")
    p.add_argument("--emu-jobs", type=int, help="emu run --jobs (default: emu's, as many as the cores hold)")
    p.add_argument("--out", type=Path, default=Path("runs/flower_compare"))
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Keep Ray's processes in our tree (for the memory sum) even if their parent exits.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    runs = []
    if not args.skip_flower:
        runs.append(run_flower(args.clients, args.rounds, out))
    if not args.skip_emu:
        runs.append(run_emu(args.clients, args.rounds, out, args.emu_jobs))
    print(table(runs))
    for r in runs:
        if r.rc != 0:
            tail = r.log.read_text(errors="replace").splitlines()[-5:]
            print(f"\n{r.name} failed (rc {r.rc}); the end of {r.log}:", *tail, sep="\n  ")
    print(f"\nlogs and models: {out}")
    return max((r.rc for r in runs), default=0)


if __name__ == "__main__":
    raise SystemExit(main())
