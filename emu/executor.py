"""Clients' training in worker processes, while the one SimPy loop keeps the time.

The driver hands a ``Compute``'s job (``core.ml.jobs.TrainJob``) to an executor
when the Compute starts and takes its result at the job's virtual end
(``core.runtime.driver``).  Every client whose job starts before then trains at
the same time in another process; the loop blocks only when it reaches a
virtual end whose job has not finished.  A job's result is the same wherever it
runs, and its modelled duration never depended on it, so ``--jobs N`` gives the
same ``events.jsonl`` and ``model_sha256`` as a serial run.

- ``ProcessPool`` (``emu run --jobs N``): N local worker processes (spawned, so
  no thread pool is inherited half-initialised), each with the data set as
  shared memory (one copy on the machine) and the scenario's torch threads.  A
  worker that dies (killed, out of memory) breaks the pool: a new one is
  started and every job still owed is run again (jobs are pure); the node that
  waits for one logs ``executor_restart``.  After ``MAX_RESTARTS`` the run stops
  with an error instead of looping.
- ``RayExecutor`` (``--executor ray --address ADDR``, ``pip install dtemu[ray]``):
  the same jobs as Ray tasks on a cluster; the data set goes to Ray's object
  store once.  Ray re-runs a task whose worker died (``max_retries``).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from dtemu.core import events as ev
from dtemu.core.errors import DtemuError
from dtemu.core.ml.jobs import TrainJob, run_train_job

MAX_RESTARTS = 10

# --- in a worker process ------------------------------------------------------

_dataset = None
_models: dict[tuple[str, int], Any] = {}


def _init_worker(dataset, threads: int) -> None:
    global _dataset
    import torch

    torch.set_num_threads(threads)
    _dataset = dataset


def _warm_up() -> None:
    from dtemu.core.ml import models  # noqa: F401  (imported once, before the first job)


def _run(job: TrainJob):
    from dtemu.core.ml.models import build_model

    key = (job.model, job.model_seed)
    if key not in _models:
        _models[key] = build_model(job.model, seed=job.model_seed)
    return run_train_job(job, _dataset, _models[key])


# --- in the emulator ------------------------------------------------------------


def default_jobs() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class ProcessPool:
    """``jobs`` local worker processes; ``submit`` now, ``result`` at the virtual end."""

    def __init__(self, jobs: int, dataset, threads: int):
        import torch.multiprocessing as tmp  # registers torch's reductions: tensors travel as shared memory

        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs}")
        self.jobs, self.threads = jobs, threads
        self._context = tmp.get_context("spawn")
        for t in (dataset.x_train, dataset.y_train):
            t.share_memory_()
        self._dataset = dataset
        self._pool = self._new_pool()
        self._pool.submit(_warm_up)  # the workers start (spawn, torch import) while the world is built
        self._owed: dict[int, tuple[TrainJob, Any]] = {}  # ticket -> (job, future) until taken
        self._next = 0
        self.restarts = 0
        self._unreported = 0  # restarts found at a submit, logged by the next node that takes a result
        self.waited_s = 0.0  # wall time the emulator spent waiting for workers (the rest is its own work)

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.jobs, mp_context=self._context, initializer=_init_worker,
                                   initargs=(self._dataset, self.threads))

    def submit(self, job: TrainJob) -> int:
        ticket, self._next = self._next, self._next + 1
        try:
            future = self._pool.submit(_run, job)
        except BrokenProcessPool:  # a worker died while the pool was idle: said at the next result
            self._unreported += self._restart() or 1
            future = self._pool.submit(_run, job)
        self._owed[ticket] = (job, future)
        return ticket

    def result(self, ticket: int, ctx=None):
        """The job's result; blocks until it is there.  Its error, if it failed, is raised."""
        if self._unreported and ctx is not None:
            ctx.emit(ev.EXECUTOR_RESTART, rerun=self._unreported, restarts=self.restarts,
                     reason="a worker process died")
            self._unreported = 0
        while True:
            job, future = self._owed[ticket]
            waited = time.perf_counter()
            try:
                value = future.result()
            except BrokenProcessPool:
                rerun = self._restart()
                if ctx is not None:
                    ctx.emit(ev.EXECUTOR_RESTART, rerun=rerun, restarts=self.restarts,
                             reason="a worker process died")
                continue
            except BaseException:
                del self._owed[ticket]
                raise
            finally:
                self.waited_s += time.perf_counter() - waited
            del self._owed[ticket]
            return value

    def _restart(self) -> int:
        """A new pool; every job still owed (pure, so safe to repeat) is run again there."""
        self.restarts += 1
        if self.restarts > MAX_RESTARTS:
            raise DtemuError(f"worker processes died {self.restarts} times; stopping rather than looping")
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()
        rerun = 0
        for ticket, (job, future) in list(self._owed.items()):
            if future.done() and not isinstance(future.exception(), BrokenProcessPool):
                continue  # finished before the pool broke: its result stands
            self._owed[ticket] = (job, self._pool.submit(_run, job))
            rerun += 1
        return rerun

    def forget(self, ticket: int) -> None:
        """The node that owed this job is gone (crashed): its result is not wanted."""
        entry = self._owed.pop(ticket, None)
        if entry is not None:
            entry[1].cancel()

    def describe(self) -> dict:
        return {"kind": "local", "jobs": self.jobs, "restarts": self.restarts, "waited_s": round(self.waited_s, 3)}

    def worker_pids(self) -> list[int]:
        return [p.pid for p in (self._pool._processes or {}).values()]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class RayExecutor:
    """The jobs as Ray tasks (local Ray, or a cluster at ``address``)."""

    def __init__(self, dataset, threads: int, address: str | None = None, workers: int | None = None):
        try:
            import ray
        except ImportError:
            raise DtemuError("--executor ray needs Ray: pip install 'dtemu[ray]'") from None
        self._ray = ray
        if not ray.is_initialized():
            kwargs = {"address": address} if address else {"num_cpus": workers or default_jobs()}
            ray.init(include_dashboard=False, log_to_driver=False, **kwargs)
        self._data = ray.put(dataset)
        self._task = ray.remote(num_cpus=1, max_retries=3)(_ray_run)
        self._threads = threads

    def submit(self, job: TrainJob):
        return self._task.remote(job, self._data, self._threads)

    def result(self, ref, ctx=None):
        return self._ray.get(ref)

    def forget(self, ref) -> None:
        self._ray.cancel(ref)

    def describe(self) -> dict:
        return {"kind": "ray", "jobs": int(self._ray.cluster_resources().get("CPU", 0))}

    def close(self) -> None:
        pass  # a Ray the run started ends with the process; a cluster stays up


def _ray_run(job: TrainJob, dataset, threads: int):
    global _dataset
    import torch

    torch.set_num_threads(threads)
    _dataset = dataset
    return _run(job)


class open_executor:
    """``with open_executor(kind, jobs, work, threads, address) as pool``: the executor a run
    uses (None: jobs run in this process, one after another), closed when the run ends."""

    def __init__(self, kind: str, jobs: int, work, threads: int, address: str | None = None):
        self.pool = None
        dataset = getattr(work, "dataset", None)
        if dataset is None or not hasattr(work, "train_job"):
            return  # a stand-in workload (tests): nothing to ship
        if kind == "ray":
            self.pool = RayExecutor(dataset, threads, address=address, workers=jobs)
        elif kind == "local":
            if jobs > 1:
                self.pool = ProcessPool(jobs, dataset, threads)
        else:
            raise DtemuError(f"unknown executor {kind!r} (local or ray)")

    def __enter__(self):
        return self.pool

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.close()
