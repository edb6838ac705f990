"""real run's rank, world and peers from torchrun's or SLURM's environment (real/cluster_env.py), and a
three-namespace run started by torchrun's own launcher with no peers list (root, slow)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtemu.real import cluster_env
from dtemu.real.cluster_env import ClusterEnvError, expand_hostlist, placement

ROOT = Path(__file__).resolve().parent.parent


def test_slurm_host_lists_expand_as_slurm_writes_them():
    assert expand_hostlist("node1") == ["node1"]
    assert expand_hostlist("a[01-03,7],b") == ["a01", "a02", "a03", "a7", "b"]
    assert expand_hostlist("gpu[1-2]-ib,cpu[09-10]") == ["gpu1-ib", "gpu2-ib", "cpu09", "cpu10"]
    for bad in ("a[3-1]", "a[x]"):
        with pytest.raises(ClusterEnvError):
            expand_hostlist(bad)


class FakeStore:
    """torch's TCPStore as every rank sees it: what the others wrote is there."""

    def __init__(self, others: dict[int, str]):
        self.kv = {cluster_env.KEY.format(r): a.encode() for r, a in others.items()}

    def set(self, key, value):
        self.kv[key] = value.encode()

    def get(self, key):
        return self.kv[key]


def test_torchrun_ranks_meet_at_the_masters_store():
    env = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    p = placement(env, store=FakeStore({0: "10.0.0.1", 2: "10.0.0.3"}))
    assert (p.rank, p.world, p.launcher) == (1, 3, "torchrun")
    assert p.address == "127.0.0.1" and p.peers == ["10.0.0.1", "127.0.0.1", "10.0.0.3"]


def test_slurm_ranks_take_the_node_list():
    env = {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_NODELIST": "localhost", "SLURMD_NODENAME": "localhost"}
    p = placement(env)
    assert (p.rank, p.world, p.launcher, p.peers, p.address) == (2, 3, "slurm", ["127.0.0.1"], "127.0.0.1")
    assert placement({}) is None
    with pytest.raises(ClusterEnvError, match="RANK='x'"):
        placement({"RANK": "x", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1"})


def _real_run(env: dict, *args) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM"))}
    return subprocess.run([sys.executable, "-m", "dtemu.real.cli", "run", "scenarios/fl_codecs.yaml", "--no-tui", *args],
                          cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=120)


def test_without_a_rank_or_a_launcher_real_run_says_what_it_needs():
    p = _real_run({})
    assert p.returncode == 2 and "run needs --rank, or the environment of torchrun" in p.stderr
    p = _real_run({"SLURM_PROCID": "0", "SLURM_NTASKS": "5", "SLURM_NODELIST": "localhost"})
    assert p.returncode == 2 and "slurm started 5 processes; the scenario has 3 ranks" in p.stderr


@pytest.mark.slow
def test_three_namespaces_started_by_torchrun_find_each_other_without_a_peers_list(tmp_path):
    from helpers import HAVE_MNIST

    from dtemu.core.runtime.network_spec import LinkSpec
    from dtemu.host.testbed_check import unavailable
    from dtemu.real.machine_net import MachineNet

    why = unavailable()
    if why:
        pytest.skip(f"machines on one box: {why}")
    if not HAVE_MNIST:
        pytest.skip("MNIST archives not found (set DTEMU_DATA)")
    torchrun = Path(sys.executable).with_name("torchrun")
    sets = ["fl.rounds=2", "fl.subset=200", "data.test_samples=200", "threads=1"]
    env = dict(os.environ, DTEMU_DATA=os.environ.get("DTEMU_DATA", str(ROOT.parent / "shared" / "data")),
               OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    with MachineNet(f"dtm{os.getpid()}", [LinkSpec(100, 100, 0.0)] * 3) as net:
        procs = [subprocess.Popen(net.exec_prefix(i) + [
            str(torchrun), "--nnodes", "3", "--node-rank", str(i), "--nproc-per-node", "1",
            "--master-addr", net.addresses[0], "--master-port", "29511",
            "-m", "dtemu.real.cli", "run", "scenarios/fl_codecs.yaml", "--no-tui", "--out", str(tmp_path / f"rank{i}"),
            *[a for s in sets for a in ("--set", s)]], cwd=ROOT, env=env,
            stdout=open(tmp_path / f"node{i}.log", "wb"), stderr=subprocess.STDOUT) for i in range(3)]
        try:
            codes = [p.wait(timeout=300) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    assert codes == [0, 0, 0], [(tmp_path / f"node{i}.log").read_text()[-1500:] for i in range(3)]
    import json

    summary = json.loads((tmp_path / "rank0" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["updates"]["accepted"] == 4
