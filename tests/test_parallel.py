"""Clients' training in worker processes changes no result (issue 12): emu --jobs N, the Ray executor."""

import os
import signal

import pytest
import torch

from dtemu.core.runtime.requests import RecordingContext
from dtemu.core.scenario import parse_scenario
from dtemu.core.wire.messages import TrainCmd
from dtemu.emu import executor as executors
from dtemu.emu.run import run_emulation
from dtemu.host.datasets import load_for
from dtemu.host.rundir import read_events
from dtemu.core.ml.workload import Workload
from helpers import needs_mnist


def small(**sets):
    raw = {"name": "par", "seed": 3, "model": "small_cnn", "threads": 1,
           "data": {"partition": "dirichlet", "alpha": 0.5, "test_samples": 200},
           "fl": {"clients": 200, "sample": 5, "rounds": 2, "subset": 64, "batch_size": 16, "min_clients": 2}}
    return parse_scenario(raw, [f"{k}={v}" for k, v in sets.items()])


@needs_mnist
def test_two_workers_give_the_events_and_model_of_a_serial_run(tmp_path, monkeypatch):
    sc = small()
    work = Workload(sc, load_for(sc))
    serial = run_emulation(sc, tmp_path / "serial", work=work, jobs=1)
    # A worker killed by the OS in the middle: the pool is replaced and the jobs it owed run again.
    submit, submitted = executors.ProcessPool.submit, []

    def submit_then_kill(self, job):
        ticket = submit(self, job)
        submitted.append(ticket)
        if len(submitted) == 3:
            os.kill(self.worker_pids()[0], signal.SIGKILL)
        return ticket

    monkeypatch.setattr(executors.ProcessPool, "submit", submit_then_kill)
    pooled = run_emulation(sc, tmp_path / "pooled", work=work, jobs=2)
    assert pooled["model_sha256"] == serial["model_sha256"]
    assert pooled["emu"]["executor"]["restarts"] >= 1
    restarts = [e for e in read_events(tmp_path / "pooled") if e["kind"] == "executor_restart"]
    assert restarts and restarts[0]["rerun"] >= 1
    # Apart from the restart's own line, the event log is the serial run's, byte for byte.
    lines = [line for line in (tmp_path / "pooled" / "events.jsonl").read_text().splitlines()
             if '"executor_restart"' not in line]
    assert lines == (tmp_path / "serial" / "events.jsonl").read_text().splitlines()


@needs_mnist
def test_a_failing_job_raises_at_its_taker_and_the_pool_goes_on():
    import dataclasses

    import numpy as np

    sc = small()
    work = Workload(sc, load_for(sc))
    good = work.train_job(work.initial_weights, TrainCmd(1, 64, 1, 0.05, 99), 7)
    bad = dataclasses.replace(good, indices=np.array([10**9]))  # past the data set's end
    pool = executors.ProcessPool(2, work.dataset, threads=1)
    try:
        tickets = [pool.submit(j) for j in (good, bad, good, good)]
        pool.forget(tickets[3])  # its node crashed: the result is dropped, nothing waits for it
        assert (pool.result(tickets[0])[0] == pool.result(tickets[2])[0]).all()
        with pytest.raises(IndexError):
            pool.result(tickets[1])
        assert (pool.result(pool.submit(good))[0] == pool.result(pool.submit(good))[0]).all()
        assert pool.restarts == 0 and pool.describe()["busy_s"] > 0
    finally:
        pool.close()
    assert all(not w.process.is_alive() for w in pool._workers)


def test_an_evaluation_splits_into_whole_batches_that_count_what_one_pass_counts():
    from dtemu.core.ml.jobs import EVAL_BATCH, EvalJob

    job = EvalJob("small_cnn", 1, None, 0, 2 * EVAL_BATCH + 10)
    parts = job.split(2)
    assert [(p.start, p.stop) for p in parts] == [(0, 2 * EVAL_BATCH), (2 * EVAL_BATCH, 2 * EVAL_BATCH + 10)]
    assert [(p.start, p.stop) for p in job.split(5)] == [(0, 1000), (1000, 2000), (2000, 2010)]
    assert job.finish([(1500, 2000), (5, 10)]) == 1505 / 2010


@needs_mnist
def test_a_pool_evaluates_on_every_worker_for_the_accuracy_of_one_pass():
    sc = small(**{"data.test_samples": 2500})
    work = Workload(sc, load_for(sc))
    weights = work.initial_weights
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' count
    try:
        want = work.evaluate(weights)
    finally:
        torch.set_num_threads(threads)
    pool = executors.ProcessPool(2, work.dataset, threads=1)
    try:
        assert pool.result(pool.submit(work.eval_job(weights))) == want
    finally:
        pool.close()


@pytest.mark.slow
@needs_mnist
def test_a_pool_replaces_a_dead_worker_and_reruns_what_it_owed():
    sc = small()
    work = Workload(sc, load_for(sc))
    job = work.train_job(work.initial_weights, TrainCmd(1, 64, 3, 0.05, 99), 7)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the worker's count: the same job gives other bits with another
    try:
        want, _ = work.run_job(job)
    finally:
        torch.set_num_threads(threads)
    pool = executors.ProcessPool(1, work.dataset, threads=1)
    try:
        pool.result(pool.submit(job))  # the worker is up
        ticket = pool.submit(job)
        os.kill(pool.worker_pids()[0], signal.SIGKILL)
        ctx = RecordingContext(node="client7")
        got, _ = pool.result(ticket, ctx)
        assert (got == want).all() and pool.restarts == 1
        assert [e["kind"] for e in ctx.events] == ["executor_restart"]
    finally:
        pool.close()


@pytest.mark.slow
@needs_mnist
def test_ray_gives_the_model_of_a_serial_run(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'dtemu[ray]')")
    sc = small()
    work = Workload(sc, load_for(sc))
    serial = run_emulation(sc, tmp_path / "serial", work=work, jobs=1)
    on_ray = run_emulation(sc, tmp_path / "ray", work=work, jobs=2, executor="ray")
    assert on_ray["model_sha256"] == serial["model_sha256"]
    assert (tmp_path / "ray" / "events.jsonl").read_bytes() == (tmp_path / "serial" / "events.jsonl").read_bytes()


# --- ddp's and geo's workers: each gradient a job (core.ml.jobs.GradientJob) -------------------

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
GRADIENT_RUNS = {
    "ddp_dense": ("ddp_baseline", ["ddp.max_steps=6", "data.test_samples=200"]),
    "ddp_dgc": ("ddp_dgc", ["ddp.max_steps=6", "ddp.warmup_steps_per_stage=2", "data.test_samples=200"]),
    "geo_hips": ("geo_hips", ["geo.rounds=3", "data.test_samples=200"]),
    "geo_hfa": ("geo_hips", ["geo.sync=hfa", "geo.k1=2", "geo.k2=2", "geo.rounds=2", "data.test_samples=200"]),
    # the shipped ESync scenarios (once mode ps): FL's clients, each round's training a job (FedAsync);
    # ESync's steps a step at a time in this process, and its counts follow the clock, so the same
    # events say every step took its modelled time
    "fl_esync": ("esync", ["fl.rounds=2", "fl.esync.max_iterations=6", "data.test_samples=200"]),
    "fl_fedasync": ("ssgd_hetero", ["fl.algorithm=fedasync", "fl.rounds=6", "fl.subset=96", "data.test_samples=200"]),
}


@needs_mnist
@pytest.mark.parametrize("run", [pytest.param(r, marks=pytest.mark.slow) if r in ("geo_hfa", "geo_hips", "fl_esync") else r
                                 for r in sorted(GRADIENT_RUNS)])
def test_ddp_geo_and_esync_workers_in_worker_processes_give_the_serial_events(tmp_path, run):
    """Every worker's forward and backward pass (FL: a client's round) runs in a worker process (its
    model's state goes with it, its gradients or new state come back): the event log is the serial
    run's, byte for byte."""
    from dtemu.host.scenario_file import load_scenario

    name, sets = GRADIENT_RUNS[run]
    sc = load_scenario(ROOT / "scenarios" / f"{name}.yaml", sets)
    work = Workload(sc, load_for(sc))
    serial = run_emulation(sc, tmp_path / "serial", work=work, jobs=1)
    pooled = run_emulation(sc, tmp_path / "pooled", work=work, jobs=2)
    assert pooled["model_sha256"] == serial["model_sha256"] and pooled["emu"]["executor"]["jobs"] == 2
    assert ((tmp_path / "pooled" / "events.jsonl").read_text().splitlines()
            == (tmp_path / "serial" / "events.jsonl").read_text().splitlines())
