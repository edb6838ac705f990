"""One rank of a scenario, for real: its transport, its role's driver, its run folder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable

import torch

from dtemu.core import events as ev
from dtemu.core.ml.train import steps_with_torch_optim, warm_up
from dtemu.core.ml.workload import Workload
from dtemu.core.runtime import faults as faultlib
from dtemu.core.runtime.compute import ComputeTimer
from dtemu.core.runtime.driver import CRASHED, Driver, run_blocking
from dtemu.core.runtime.summary import node_record
from dtemu.core.runtime.wiring import readers_of, role_of, writers_of
from dtemu.core.scenario import Scenario
from dtemu.host import cpu_arith, devices, heap
from dtemu.host.work import load_work
from dtemu.host.rundir import RunDir
from dtemu.host.traces import load_population

from dtemu.host.writer_history import writer_history
from .paced_links import PacedLinks
from .primitives import RealPrimitives
from .start_line import hold_until_window_end, wait_for_start
from .transport import DdsTransport


def run_node(scenario: Scenario, rank: int, out: str | Path, *, init: bytes | None = None,
             domain_id: int | None = None, profile: str = "loopback", threads: int | None = None,
             observers: Iterable[Callable[[dict], None]] = (), key: bytes | None = None,
             fired: Iterable[int] = (), append: bool = False, pace: float | None = None,
             links: str | None = None) -> dict:
    """Run ``rank``; returns its record (``core.runtime.summary.node_record``), also written to
    ``out/summary.json`` with real mode's extras.  ``key`` seals every message (core.wire.auth, through the driver);
    ``fired``: the faults.crashes this rank already went through (a restarted rank), ``append``:
    keep its events; ``pace``: the time scale a launch runs at (a training job then lasts the scenario's
    modelled time times it, real.primitives); ``links``: messages take the scenario's links' time, times
    ``pace`` (real.paced_links): "scenario" (rates and latency) or "latency" (its latency alone)."""
    wall_start = time.perf_counter()
    torch.set_num_threads(threads or scenario.threads)
    name = scenario.node_names[rank]
    # Before the run folder: a scenario whose model or data cannot be had leaves nothing behind.
    work = load_work(scenario)
    getattr(work, "partitions", None)  # and before joining: the barrier should not wait for this
    run = RunDir(out, append=append)
    getattr(work, "open_run", lambda folder: None)(run.path)  # (a Flower app: its log goes into the run)
    for fn in observers:
        run.observe(fn)
    try:
        run.write_json("scenario.json", scenario.to_dict())
        return _run(scenario, rank, name, run, work, init, domain_id, profile, key, fired, wall_start, pace, links)
    except SystemExit:  # the process was told to end as it is (a planned crash uses os._exit)
        raise
    except BaseException as err:  # an error, Ctrl-C or SIGTERM: the folder still says what happened
        run.write_json("summary.json", {**node_record(scenario, name, None, 0, 0), "failed": True,
                                        "stop_reason": f"{type(err).__name__}: {err}".rstrip(": "),
                                        "real": {"wall_time_s": round(time.perf_counter() - wall_start, 3)}})
        raise
    finally:
        run.close()


def _run(scenario: Scenario, rank: int, name: str, run: RunDir, work: Workload, init, domain_id, profile, key,
         fired, wall_start: float, pace: float | None = None, links: str | None = None) -> dict:
    if steps_with_torch_optim(scenario):
        warm_up()  # torch.optim's one-off costs now, not in the first round against its timeout
    spec = role_of(scenario, rank, work, load_population(scenario) if rank == 0 else None)
    timer = ComputeTimer(scenario.compute_for(name), work.reference_cost, seed=[scenario.seed, rank],
                         batch=scenario.kind.batch_size(scenario))
    whc_high = writer_history(scenario.kind.all_to_all, work.dim)
    # Its first passes find their pages touched (host.heap).  Before the hold: a rank down from the
    # start touches its headroom with the others, not in the seconds it comes up in.
    heap.pretouch(heap.pretouch_mb())
    hold_until_window_end()   # a rank down from the start comes up at its window's end, not before
    with DdsTransport(name, profile=profile, domain_id=domain_id, subscribe=list(spec.subscribes),
                      key=key, whc_high=whc_high) as transport:
        # Under `real launch`, every rank's clock starts when all of them are up (real.start_line).
        epoch = wait_for_start(run.path)
        prims = RealPrimitives(name, transport, run, spec.publishes, timer, epoch=epoch, pace=pace,
                               readers=readers_of(scenario), subscribes=spec.subscribes,
                               writers=writers_of(scenario),
                               links=PacedLinks(scenario, name, pace or 1.0, rates=links != "latency") if links else None)
        faults = faultlib.NodeFaults(scenario.faults, scenario.seed, name, rank,
                                     faultlib.CrashPlan(scenario.faults, set(fired)))
        driver = Driver(prims, faults, key)
        driver.emit(ev.NODE_UP)
        result = run_blocking(driver.run(spec.start(driver, init)))
        assert result is not CRASHED  # a real crash has ended the process
        # Let what we sent last (the final model, Stop, the last frames) reach the peers.
        transport.flush(timeout_s=5.0)
        stats = dict(transport.stats)
        clocks = transport.clock.offsets.as_dict()
        streamed = transport.streaming
    record = node_record(scenario, name, result, prims.bytes_sent, prims.bytes_received, time_s=prims.now(),
                         bytes_rejected=prims.bytes_rejected, sealed=key is not None)
    device = getattr(work, "device", devices.CPU)
    summary = {**record, "device": device, "platform": {**cpu_arith.describe(), **devices.describe(device)},
               "real": {"wall_time_s": round(time.perf_counter() - wall_start, 3),
                                  "writer_history": whc_high,
                                  "stream": streamed,   # large payloads on the TCP stream (real.stream)
                                  "clocks": clocks,  # each peer's clock minus this rank's (real.clock_sync)
                                  "timers": prims.lateness.record(),  # how late its timers woke (real.monitors)
                                  "transport": {k: v for k, v in stats.items() if isinstance(v, (int, float))}}}
    run.write_json("summary.json", summary)
    return summary


def real_driver(name: str, transport: DdsTransport, run: RunDir, publishes: Iterable[str] = (),
                timer: ComputeTimer | None = None, key: bytes | None = None) -> Driver:
    """A driver over real primitives and no faults, for tools and tests that drive a role by hand:
    ``run_blocking(driver.run(role(driver)))``; ``key`` seals its messages (give the transport it too)."""
    from dtemu.core.runtime.compute_spec import ComputeSpec
    from dtemu.core.runtime.fault_spec import FaultSpec

    timer = timer or ComputeTimer(ComputeSpec(), None, seed=0)
    prims = RealPrimitives(name, transport, run, publishes, timer)
    return Driver(prims, faultlib.NodeFaults(FaultSpec(), 0, name, 0, faultlib.CrashPlan(FaultSpec())), key)
