"""What one training step of a scenario's model costs on this machine, alone or with others.

Both runtimes' calibrations read it: ``real launch`` stretches a scenario's
durations by it (real.calibrate), and ``emu calibrate`` writes it into a
profile (emu.calibrate).  The step is the scenario's own: its model, its
optimizer, its task's loss, its training batch (the mode's ``batch_size``), its
threads, and a batch of its data when given (random 28x28 images of 10 classes
otherwise: the same cost for the built-in MNIST models); and the unit its roles
run (the mode's ``compute_unit``): a step with the optimizer, or a ddp or geo
worker's gradient pass alone.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import statistics
import threading
import time

import torch

from dtemu.core.ml.models import build_model
from dtemu.core.ml.sgd import SGD
from dtemu.core.ml.task import task_of
from dtemu.core.ml.train import compute_gradients, steps_with_torch_optim
from dtemu.core.scenario import Scenario
from dtemu.host import devices
from dtemu.host.machine_pace import machine_cost, machine_steps

MNIST_SHAPE = ((1, 28, 28), 10)  # (input shape, classes) when the caller does not say

STEPS = 8  # timed steps, after WARM_STEPS untimed ones
# Untimed steps first: a fresh process's first steps hold torch's lazy set-up.  On the testbed a geo
# worker's first three gradient passes were 0.6-0.8, 0.1-0.4 and up to 0.2 s over its steady 0.3 s
# (notebook entry 44), so a warm-up is timed step by step, over four.
WARM_STEPS = 4
MAX_TOGETHER = 16  # processes measured at once (more ranks than this share the cores alike)
TOGETHER_TIMEOUT_S = 120.0


def together_timeout_s(share: float | None) -> float:
    """How long processes timing the step together may take: TOGETHER_TIMEOUT_S of a whole core, as
    much longer as a share below one makes them."""
    return TOGETHER_TIMEOUT_S / min(1.0, share) if share else TOGETHER_TIMEOUT_S


def measured_s_per_sample(scenario: Scenario, barrier=None, steps: int = STEPS, sample=None,
                          step_times: list | None = None, barrier_timeout_s: float = TOGETHER_TIMEOUT_S,
                          first_steps: list | None = None, pretouch_mb: int = 0) -> float:
    """Seconds per training sample of the scenario's model on this machine, with its threads and
    its task's loss (``barrier``: wait there after the untimed steps, so that processes measured
    together overlap; ``sample``: one batch (x, y) of its data, else random MNIST-shaped images;
    ``step_times``: each timed step's seconds are appended to it; ``first_steps``: each of the
    WARM_STEPS untimed steps' seconds, which in a fresh process hold torch's lazy set-up;
    ``pretouch_mb``: that much of a kept heap faulted in first, as a rank does at its start line)."""
    batch = scenario.kind.batch_size(scenario)
    device = devices.resolve(scenario)   # (a GPU's step is timed there; its work is waited for)
    model = build_model(scenario.model_spec, seed=scenario.seed).to(device)
    task = task_of(scenario.model_spec)
    # the optimizer its training nodes step with
    torch_optim = steps_with_torch_optim(scenario) or device != devices.CPU   # (core.ml.sgd is the CPU's)
    opt = (torch.optim.SGD if torch_optim else SGD)(model.parameters(), lr=0.01)
    (dims, classes) = MNIST_SHAPE
    x, y = sample if sample is not None else (torch.randn(batch, *dims), torch.randint(0, classes, (batch,)))
    x, y = x.to(device), y.to(device)
    wait = torch.cuda.synchronize if device == devices.CUDA else (lambda: None)
    one = _unit_of(scenario, model, opt, task, x, y)
    threads = torch.get_num_threads()
    torch.set_num_threads(scenario.threads)
    try:
        if pretouch_mb:
            from dtemu.host import heap

            heap.pretouch(pretouch_mb)
        last = time.perf_counter()
        for i in range(steps + WARM_STEPS):
            if i == WARM_STEPS:
                if barrier is not None:
                    barrier.wait(timeout=barrier_timeout_s)
                wait()
                t0 = last = time.perf_counter()
            one()
            timed = step_times if i >= WARM_STEPS else first_steps
            if timed is not None:
                wait()
                now = time.perf_counter()
                timed.append(now - last)
                last = now
        wait()
        return (time.perf_counter() - t0) / (steps * batch)
    finally:
        torch.set_num_threads(threads)


def _unit_of(scenario: Scenario, model, opt, task, x, y):
    """One unit of the scenario's training compute, as its roles run it (the mode's ``compute_unit``):
    a ddp or geo worker's forward and backward pass (its update is priced apart), or a step with the
    optimizer."""
    if scenario.kind.compute_unit == "gradients":
        idx = torch.arange(len(x))   # (a worker's batch is gathered from its data by index: so is this)
        return lambda: compute_gradients(model, x, y, idx, seed=scenario.seed, task=task)

    def step():
        opt.zero_grad()
        task.loss(model(x), y).backward()
        opt.step()
    return step


def sample_of(data, scenario: Scenario):
    """One training batch (x, y) of ``data`` at the scenario's batch size: what the step is timed on."""
    batch = scenario.kind.batch_size(scenario)
    return data.x_train[:batch].clone(), data.y_train[:batch].clone()


def _timed_together(scenario: Scenario, barrier, results, sample=None, group=None, pretouch_mb: int = 0,
                    machine: int = 0) -> None:
    """One of several processes that train at once (a child of ``measured_together``), in its own
    CPU group where it has one (a testbed machine's share), which is ``machine``."""
    from dtemu.host import heap

    if group is not None:
        group.join()
    heap.keep()   # as a rank's (real.cli): timed as the ranks will train
    torch.set_num_threads(scenario.threads)
    steps: list[float] = []
    first: list[float] = []
    timeout = together_timeout_s(group.cpus if group else None)
    barrier.wait(timeout=timeout)   # every process imported and in its share (measured_together)
    cost = measured_s_per_sample(scenario, barrier, steps=3 * STEPS, sample=sample, step_times=steps,
                                 barrier_timeout_s=timeout, first_steps=first, pretouch_mb=pretouch_mb)
    steady = statistics.median(steps)
    results.put((cost, steps, [t - steady for t in first], machine))
    # Wait, idle, for the others to finish before exiting: a process's exit frees its heap in its
    # group's quota, and three trainers in a 0.533 share stepped at half the pace for 3 s while one
    # of them exited (notebook entry 50).  A rank does not exit in the middle of the others' training.
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(timeout=timeout)


def spread_of(values: list[float]) -> float:
    """How much ``values`` vary, as a fraction of their median: the interquartile range over 1.349
    (a normal law's standard deviation), so that one step the scheduler held up (a tenth of a
    second once in 48 steps) does not count as the spread of every job (0 for fewer than four)."""
    if len(values) < 4:
        return 0.0
    q1, median, q3 = statistics.quantiles(values, n=4)
    return (q3 - q1) / 1.349 / median


SPREAD_BLOCK = 6  # steps a block: a timing of 24 steps makes four


def spread_parts(runs: list[list[float]], batch: int, block: int = SPREAD_BLOCK) -> tuple[float, float]:
    """(spread, spread_per_sample) of the steps timed in ``runs`` (each a process's, in order): a
    job's variation that its length does not average out, and a step's own over the square root of
    its samples (core.runtime.compute_spec).  A step varies by both (v1^2 = a^2 + b^2), the mean
    of ``block`` steps by b and by a over sqrt(block) (v^2 = a^2/block + b^2): two equations."""
    steps = [t for run in runs for t in run]
    means = [sum(run[i:i + block]) / block for run in runs for i in range(0, len(run) - block + 1, block)]
    v1, vb = spread_of(steps), spread_of(means)
    own = max(0.0, (v1 ** 2 - vb ** 2) * block / (block - 1))   # a^2
    return max(0.0, v1 ** 2 - own) ** 0.5, (own * batch) ** 0.5


def measured_together(scenario: Scenario, ranks: int, sample=None, share: float | None = None,
                      per_group: int = 1, step_times: list | None = None, warmups: list | None = None) -> float:
    """Seconds per training sample of one process when ``ranks`` processes train at once, as a launch's
    do: the median over machines of a machine's time for its processes' steps (host.machine_pace).

    Oversubscribed cores cost more than their share: eight torch threads on two cores spin and
    wait for one another, so four ranks of two threads each train ten times slower or worse, not
    four.  Only measuring it says how much.  ``share``: each process has that much of a core of its
    own (host.cpu_shares), as the testbed's machines have: a quota isolates CPU time, not the caches
    and memory the processes still share (two capped trainers here stepped 1.1-1.3x slower at once).
    ``per_group``: that many of the processes share each group, as a site's workers share its machine;
    ``step_times``: each machine's timed steps are appended to it (a list each: ``machine_steps``);
    ``warmups``: each fresh process's first steps' seconds beyond a steady one, step by step (a list
    each: ``warmup_of``)."""
    from dtemu.host import cpu_sets, cpu_shares, heap

    ctx = multiprocessing.get_context("spawn")
    n = max(1, ranks // per_group)
    on = cpu_sets.place([share] * n, [per_group] * n) if share else [None] * n   # as the testbed's machines
    groups = [cpu_shares.CpuGroup(f"dtm{os.getpid()}-together{i}", share, cpu=on[i]).create() if share else None
              for i in range(n)]
    barrier, results = ctx.Barrier(len(groups) * per_group), ctx.Queue()
    touch = heap.pretouch_mb(processes=len(groups) * per_group)   # as `real launch` gives its ranks
    procs = [ctx.Process(target=_timed_together, args=(scenario, barrier, results, sample, g, touch, i), daemon=True)
             for i, g in enumerate(groups) for _ in range(per_group)]
    # Started outside this process's own share (a calibration's, emu validate's re-timing): each
    # imports torch at the box's pace, joins its group, and waits for the others there before it
    # builds anything, so that nothing timed runs beside an import
    with cpu_shares.unconfined():
        for p in procs:
            p.start()
    try:
        got = _gathered(procs, results, share)
        # a machine's time for its processes' steps (host.machine_pace): its slowest process's
        costs = sorted(machine_cost([(machine, cost) for cost, _, _, machine in got]))
        if step_times is not None:
            step_times.extend(machine_steps([(machine, steps) for _, steps, _, machine in got]))
        if warmups is not None:
            warmups.extend(warm for _, _, warm, _ in got)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        for g in groups:
            if g is not None:
                g.remove()
    return costs[len(costs) // 2]


def warmup_of(warmups: list[list[float]], per: int = 1) -> list[float]:
    """A process's start-up cost in its first training steps, step by step (seconds, at the timings'
    share, over ``per``: the processes that shared it warmed up at once, and emu shares a machine
    among its jobs itself): for each of the first steps, the median over fresh processes of its
    seconds beyond a steady step, at least 0; none after the last that has any."""
    out = [max(0.0, statistics.median(step)) / per for step in zip(*warmups)]
    while out and out[-1] < 1e-4:
        out.pop()
    return out


def _gathered(procs: list, results, share: float | None = None) -> list:
    """Every process's result, or a clear error as soon as one of them died without giving one (a
    spawned child that could not start, a crash), rather than the timeout's wait.  The wait is longer
    under a share below a core: a process starts (torch's import) and steps at its share's pace
    (ten at 0.145 each once gave none of their results in 120 s: notebook entry 39)."""
    import queue

    got: list = []
    limit = together_timeout_s(share)
    deadline = time.monotonic() + limit
    while len(got) < len(procs):
        try:
            got.append(results.get(timeout=0.5))
            continue
        except queue.Empty:
            pass
        dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"a process timing the step together died (exit {dead[0]}) before its result; "
                               f"its error is in the output above")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the processes timing the step together gave {len(got)} of {len(procs)} results "
                               f"in {limit:.0f} s")
    return got
