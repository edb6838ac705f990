"""Clients' training in worker processes, while the one SimPy loop keeps the time.

The driver hands a ``Compute``'s job (``core.ml.jobs.TrainJob``) to an executor
when the Compute starts and takes its result at the job's virtual end
(``core.runtime.driver``).  Every client whose job starts before then trains at
the same time in another process; the loop blocks only when it reaches a
virtual end whose job has not finished.  A job's result is the same wherever it
runs, and its modelled duration never depended on it, so ``--jobs N`` gives the
same ``events.jsonl`` and ``model_sha256`` as a serial run.

- ``ProcessPool`` (``emu run --jobs N``, emu.pool): N local worker processes,
  each with the data set as shared memory (one copy on the machine) and the
  scenario's torch threads; a worker that dies is replaced and the jobs it
  owed run again.
- A Flower app's ClientApp calls (host.flower_jobs) go to the same executors: sent as
  soon as the server sends their instructions, taken when the client reaches them.
- ``RayExecutor`` (``--executor ray --address ADDR``, ``pip install dtemu[ray]``):
  the same jobs as Ray tasks on a cluster; the data set goes to Ray's object
  store once.  Ray re-runs a task whose worker died (``max_retries``).
"""

from __future__ import annotations

from dtemu.core.errors import DtemuError
from dtemu.core.ml.jobs import EvalJob, TrainJob
from dtemu.host import cores

from .pool import ProcessPool, init_worker, run_job


class RayExecutor:
    """The jobs as Ray tasks (local Ray, or a cluster at ``address``)."""

    def __init__(self, dataset, threads: int, address: str | None = None, workers: int | None = None):
        try:
            import ray
        except ImportError:
            raise DtemuError("--executor ray needs Ray: pip install 'dtemu[ray]'") from None
        self._ray = ray
        if not ray.is_initialized():
            kwargs = {"address": address} if address else {"num_cpus": workers or cores.available()}
            ray.init(include_dashboard=False, log_to_driver=False, **kwargs)
        self._data = None if dataset is None else ray.put(dataset)
        self._task = ray.remote(num_cpus=1, max_retries=3)(_ray_run)
        self._threads = threads

    def submit(self, job: TrainJob | EvalJob):
        return job, self._task.remote(job, self._data, self._threads)

    def result(self, pending, ctx=None):
        job, ref = pending
        return job.finish([self._ray.get(ref)])

    def forget(self, pending) -> None:
        self._ray.cancel(pending[1])

    def describe(self) -> dict:
        return {"kind": "ray", "jobs": int(self._ray.cluster_resources().get("CPU", 0))}

    def close(self) -> None:
        pass  # a Ray the run started ends with the process; a cluster stays up


def _ray_run(job: TrainJob | EvalJob, dataset, threads: int):
    init_worker(dataset, threads)
    return run_job(job)


class open_executor:
    """``with open_executor(kind, jobs, work, threads, address) as pool``: the executor a run
    uses (None: jobs run in this process, one after another), closed when the run ends."""

    def __init__(self, kind: str, jobs: int, work, threads: int, address: str | None = None):
        self.pool = None
        dataset = getattr(work, "dataset", None)
        # A workload ships its training as jobs over its data set; a Flower app ships its calls (with no
        # data set: the app reads its own).  A stand-in workload (tests) has nothing to ship.
        ships_calls = getattr(work, "ships_calls", False)
        if (dataset is None or not hasattr(work, "train_job")) and not ships_calls:
            return
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
