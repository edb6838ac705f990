"""A local pool of worker processes that train clients' jobs while the SimPy loop keeps time.

Why not ``concurrent.futures.ProcessPoolExecutor``: it moves each job to the
workers and each result back through threads of the emulator's process (a
queue manager, a feeder), and those threads need the interpreter lock that the
SimPy loop holds while it works.  A worker that finished a job waited for them
to be scheduled, about 5 ms a job on two busy cores, which is a tenth of a
small client's training (fl_1000: 2000 jobs of ~43 ms; 1.37x on 2 cores).  Here
the emulator's one thread does all of it, at the two moments it talks to the
pool anyway (``submit`` and ``result``):

- every worker has its own job pipe and result pipe.  The job pipes are made
  large (``PIPE_BYTES``) so that sending a job does not wait for the worker to
  read it; each worker holds at most ``DEPTH`` jobs (one training, the next
  waiting), so a worker never idles while the emulator is busy, and the jobs
  left for the end of a round go to whichever worker frees first.
- a worker's results leave through a thread of its own, so training goes on
  while the emulator has not read them yet.
- an evaluation is split into whole batches of the test set, one part per
  worker (``EvalJob.split``): between rounds the workers would otherwise idle
  while the emulator alone evaluated (~5 s of fl_1000's 50 s).
- workers are forked by a fork server that imported torch and the jobs' code
  once (``PRELOAD``), not spawned: a spawned worker imported torch and paid its
  first optimizer's import of torch._dynamo itself, 2.4 s of CPU each, and on 2
  cores the emulator waited ~2.9 s for its first result (fl_1000 cut to 5 short
  rounds: a quarter of the run).  The jobs' SGD (core.ml.sgd) needs no dynamo.
  ``prestart`` (emu.fork_server) starts that server as ``emu run`` begins, so
  its imports overlap the emulator's own.  The server imports and allocates,
  never computes, so no OpenMP pool is inherited half-initialised (the reason
  for not forking the emulator itself).
- a worker that dies (killed, out of memory) is seen at once (its process
  sentinel, or end of file on its pipes): every worker is replaced and every
  job still owed is run again (jobs are pure: the same bits wherever and
  however often they run).  The node that waits for one logs
  ``executor_restart``; after ``MAX_RESTARTS`` the run stops with an error
  instead of looping.
"""

from __future__ import annotations

import fcntl
import pickle
import queue
import threading
import time
from collections import deque
from multiprocessing.connection import wait
from typing import Any

from dtemu.core import events as ev
from dtemu.core.errors import DtemuError
from dtemu.core.ml.jobs import EvalJob, GradientJob, TrainJob, run_eval_job, run_gradient_job, run_train_job
from dtemu.emu.fork_server import prestart
from dtemu.host import cores

MAX_RESTARTS = 10
DEPTH = 2  # jobs a worker holds: the one it trains and the next
PIPE_BYTES = 1 << 20  # Linux's default ceiling for an unprivileged pipe (/proc/sys/fs/pipe-max-size)
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (named in the fcntl module from Python 3.10 on Linux only)

# --- in a worker process ------------------------------------------------------

_dataset = None
_on_device: dict[str, Any] = {}   # the data set on each device a job named
_models: dict[tuple[str, int, str], Any] = {}


def init_worker(dataset, threads: int) -> None:
    global _dataset
    import torch

    from dtemu.host import heap

    heap.keep()   # as a rank's (real.cli): its jobs stop faulting their buffers in, job after job
    torch.set_num_threads(threads)
    if dataset is not _dataset:   # (a Ray task calls this per job, with the same object)
        _on_device.clear()
    _dataset = dataset


def run_job(job: TrainJob | EvalJob):
    """A job's result on this worker's data set: a training's (weights, TrainResult), an
    evaluation's (correct, total), a gradient's (loss, gradients, state); the module is built once per model.  A job that carries its
    own work (``run()``: a Flower app's call, host.flower_jobs) runs it."""
    from dtemu.core.ml.models import build_model

    if hasattr(job, "run"):
        return job.run()
    device = getattr(job, "device", "cpu")   # (a GPU: every worker process shares it, its data there once)
    key = (job.model, job.model_seed, device)
    if key not in _models:
        _models[key] = build_model(job.model, seed=job.model_seed).to(device)
    if device not in _on_device:
        from dtemu.host import devices

        devices.prepare(device)
        _on_device[device] = _dataset.to(device)
    run = {EvalJob: run_eval_job, GradientJob: run_gradient_job}.get(type(job), run_train_job)
    return run(job, _on_device[device], _models[key])


def _portable(err: BaseException) -> BaseException:
    """``err`` if it survives pickling, else a DtemuError that says what it was."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        return DtemuError(f"a job failed in a worker process: {type(err).__name__}: {err}")


def _send_results(outbox: queue.Queue, conn) -> None:
    while (item := outbox.get()) is not None:
        conn.send(item)
    conn.close()


def _worker_main(jobs_in, results_out, dataset, threads: int) -> None:
    init_worker(dataset, threads)
    from dtemu.core.ml import models  # noqa: F401  (imported before the first job)

    outbox: queue.Queue = queue.Queue()
    sender = threading.Thread(target=_send_results, args=(outbox, results_out), daemon=True)
    sender.start()
    while True:
        try:
            item = jobs_in.recv()
        except EOFError:  # the emulator is gone
            break
        if item is None:
            break
        ticket, job = item
        started = time.perf_counter()
        try:
            outbox.put((ticket, True, run_job(job), time.perf_counter() - started))
        except Exception as err:  # the job's failure is the waiting node's to handle
            outbox.put((ticket, False, _portable(err), 0.0))
    outbox.put(None)
    sender.join()


# --- in the emulator ------------------------------------------------------------


def _context():
    import torch.multiprocessing as tmp  # registers torch's reductions: tensors travel as shared memory

    return tmp.get_context("forkserver")   # (its preload: prestart's, which starts the server)


def _widen(conn) -> None:
    try:
        fcntl.fcntl(conn.fileno(), _F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:  # not allowed, or not Linux: sends may wait for the worker, nothing else changes
        pass


class _Worker:
    def __init__(self, context, dataset, threads: int):
        jobs_in, self.jobs = context.Pipe(duplex=False)
        self.results, results_out = context.Pipe(duplex=False)
        _widen(self.jobs)
        # and the results' pipe: a Flower call's answer (its reply and Context, ~0.2 MB) crossed 64 KiB
        # at a time, a hand-off each between the worker's sender thread and the emulator (reads 1.0 s
        # of a 50-client run's profile, 0.03 s widened; the run's wall moved within its noise)
        _widen(self.results)
        self.process = context.Process(target=_worker_main, args=(jobs_in, results_out, dataset, threads),
                                       daemon=True)
        self.process.start()
        jobs_in.close()  # the worker's ends: closed here, so its death reads as end of file
        results_out.close()
        self.held: set[int] = set()  # tickets sent and not answered

    def stop(self, kill: bool) -> None:
        """Killed, or told to end after the jobs it holds (whose results are read and dropped:
        a worker blocked on a full result pipe could not end otherwise)."""
        if not kill:
            try:
                self.jobs.send(None)
                deadline = time.monotonic() + 30
                while self.process.is_alive() and time.monotonic() < deadline:
                    if self.results.poll(0.05):
                        self.results.recv()
            except (OSError, EOFError):
                pass
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.jobs.close()
        self.results.close()


class ProcessPool:
    """``jobs`` local worker processes; ``submit`` now, ``result`` at the virtual end."""

    def __init__(self, jobs: int, dataset, threads: int):
        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs}")
        self.jobs, self.threads = jobs, threads
        prestart(jobs, threads)  # at once if emu run started it already
        self._context = _context()
        for t in (() if dataset is None else (dataset.x_train, dataset.y_train)):
            t.share_memory_()
        self._dataset = dataset
        self._workers = self._start()  # they start (spawn, torch import) while the world is built
        self._groups: dict[int, tuple[Any, list[int]]] = {}  # submit's ticket -> (job, its parts' tickets)
        self._next_group = 0
        self._owed: dict[int, Any] = {}  # a part's ticket -> the part, until taken or forgotten
        self._backlog: deque[int] = deque()  # owed tickets not sent to a worker yet, oldest first
        self._answers: dict[int, tuple[bool, Any]] = {}  # ticket -> (ok, value) come back, not taken
        self._next = 0
        self.restarts = 0
        self._unreported = 0  # jobs rerun after a death seen outside ``result``: logged by the next taker
        self.waited_s = 0.0  # wall time the emulator spent waiting for workers (the rest is its own work)
        self.busy_s = 0.0  # wall time the workers spent on jobs whose results were taken

    def _start(self) -> list[_Worker]:
        # More workers' threads than cores wait passively (the fork server's environment, prestart).
        return [_Worker(self._context, self._dataset, self.threads) for _ in range(self.jobs)]

    # -- the two calls of the driver --

    def submit(self, job: TrainJob | EvalJob) -> int:
        """A ticket for ``job``, whose parts (``job.split``: an evaluation's batches) go to the
        workers now."""
        group, self._next_group = self._next_group, self._next_group + 1
        self._groups[group] = (job, [self._enqueue(part) for part in job.split(self.jobs)])
        self._unreported += self._dispatch()
        return group

    def result(self, group: int, ctx=None):
        """The job's result (its parts' results, ``finish``ed); blocks until it is there.  Its
        error, if it failed, is raised."""
        job, tickets = self._groups.pop(group)
        waited = time.perf_counter()
        try:
            while not all(t in self._answers for t in tickets):
                self._unreported += self._dispatch()
                self._unreported += self._collect()
        finally:
            self.waited_s += time.perf_counter() - waited
        if self._unreported and ctx is not None:
            ctx.emit(ev.EXECUTOR_RESTART, rerun=self._unreported, restarts=self.restarts,
                     reason="a worker process died")
            self._unreported = 0
        answers = []
        for ticket in tickets:
            del self._owed[ticket]
            answers.append(self._answers.pop(ticket))
        for ok, value in answers:
            if not ok:
                raise value
        return job.finish([value for _, value in answers])

    def forget(self, group: int) -> None:
        """The node that owed this job is gone (crashed): its result is not wanted."""
        _, tickets = self._groups.pop(group, (None, []))
        for ticket in tickets:
            self._owed.pop(ticket, None)
            self._answers.pop(ticket, None)
            if ticket in self._backlog:
                self._backlog.remove(ticket)

    def _enqueue(self, part) -> int:
        ticket, self._next = self._next, self._next + 1
        self._owed[ticket] = part
        self._backlog.append(ticket)
        return ticket

    # -- moving jobs and results --

    def _dispatch(self) -> int:
        """Send backlog jobs to workers holding fewer than DEPTH; the jobs rerun if one died."""
        while self._backlog:
            worker = min(self._workers, key=lambda w: len(w.held))
            if len(worker.held) >= DEPTH:
                return 0
            ticket = self._backlog[0]
            try:
                worker.jobs.send((ticket, self._owed[ticket]))
            except OSError:  # the worker is gone (broken pipe)
                return self._restart()
            self._backlog.popleft()
            worker.held.add(ticket)
        return 0

    def _collect(self) -> int:
        """Wait for at least one answer or death; take every answer there is."""
        by_fd = {w.results: w for w in self._workers}
        sentinels = {w.process.sentinel: w for w in self._workers}
        for ready in wait(list(by_fd) + list(sentinels)):
            worker = by_fd.get(ready) or sentinels[ready]
            try:
                while worker.results.poll():
                    ticket, ok, value, busy = worker.results.recv()
                    worker.held.discard(ticket)
                    if ticket in self._owed:
                        self._answers[ticket] = (ok, value)
                        self.busy_s += busy
            except (EOFError, OSError):
                return self._restart()
            if ready in sentinels:  # exited: whatever it had sent is taken above
                return self._restart()
        return 0

    def _restart(self) -> int:
        """New workers; every job owed and not answered (pure, so safe to repeat) runs again."""
        self.restarts += 1
        if self.restarts > MAX_RESTARTS:
            raise DtemuError(f"worker processes died {self.restarts} times; stopping rather than looping")
        for worker in self._workers:
            worker.stop(kill=True)
        self._workers = self._start()
        self._backlog = deque(t for t in sorted(self._owed) if t not in self._answers)
        rerun = len(self._backlog)
        self._dispatch()
        return rerun or 1

    # -- for the summary, tests and the end --

    def describe(self) -> dict:
        return {"kind": "local", "jobs": self.jobs, "restarts": self.restarts,
                "waited_s": round(self.waited_s, 3), "busy_s": round(self.busy_s, 3)}

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def close(self) -> None:
        for worker in self._workers:
            worker.stop(kill=False)
