"""One emulated run of a scenario: build the world, run it, write the run folder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable

import simpy
import torch

from dtemu.core.errors import DtemuError, ScenarioError
from dtemu.core.ml.workload import Workload
from dtemu.core.runtime.compute import ComputeTimer
from dtemu.core.runtime.summary import failed_summary, node_record, run_summary
from dtemu.core.runtime.wiring import roles
from dtemu.core.scenario import Scenario
from dtemu.host import arith_fingerprint, cpu_arith, devices
from dtemu.host.work import load_work
from dtemu.host.rundir import RunDir
from dtemu.host.traces import load_population
from dtemu.host.spill import DiskSpill
from dtemu.core.fl.residuals import Residuals

from .executor import open_executor
from .faults import schedule_offline, schedule_partitions
from .network import Network, link_from_spec
from .machines import machines_of
from .world import EmuNode, World


def build_world(env: simpy.Environment, scenario: Scenario, work: Workload, run: RunDir,
                init: bytes | None = None, key: bytes | None = None) -> World:
    links = {
        name: link_from_spec(link.up_mbps, link.down_mbps, link.latency_ms, link.loss)
        for name in scenario.node_names
        for link in [scenario.link(name)]
    }
    # Sites (network.sites): each node's access link is its site's LAN; each site has a WAN attachment.
    wan = {name: link_from_spec(site.wan.up_mbps, site.wan.down_mbps, site.wan.latency_ms)
           for name, site in scenario.network.sites.items()}
    # compute.machines: sites: a site's nodes share one machine's CPU and reach each other over its loopback
    machines = (machines_of(scenario.site_of, scenario.node_names, env)
                if scenario.compute.machines == "sites" else None)
    network = Network(env, links, seed=scenario.seed, mtu=scenario.network.mtu,
                      sites=scenario.site_of, wan=wan, framing=scenario.network.framing,
                      send_window=scenario.network.send_window_bytes, machine_of=machines)
    world = World(env, network, run.event, run.save_checkpoint, faults=scenario.faults, seed=scenario.seed,
                  shared_cores=scenario.compute.shared_cores, key=key, machines=machines)
    for spec in roles(scenario, work, load_population(scenario), _residuals(scenario, run)):
        timer = ComputeTimer(scenario.compute_for(spec.name), work.reference_cost, seed=[scenario.seed, spec.rank],
                             batch=scenario.kind.batch_size(scenario), spread_draw=scenario.compute.spread_draw)
        if not timer.modelled:
            raise ScenarioError("compute.default.train_s_per_sample", "the model has no reference cost (a model factory, or a task without train_s_per_sample): "
                                "set it, e.g. from `emu calibrate`")
        # A restarted controller resumes from its latest checkpoint, as `real` does with init_path.
        make = lambda ctx, spec=spec: spec.start(ctx, world.last_checkpoint or init)  # noqa: E731
        world.add(EmuNode(world, spec.name, spec.rank, spec.subscribes, make, timer))
    return world


def _residuals(scenario: Scenario, run: RunDir) -> Residuals | None:
    """fl.residuals_in_memory: the clients' error-feedback residuals beyond it go to files in the run."""
    bound = scenario.fl.residuals_in_memory
    if bound is None or not scenario.fl.error_feedback:
        return None
    return Residuals(bound, DiskSpill(Path(run.path) / "spill"))


def run_emulation(scenario: Scenario, out_dir: str | Path, init: bytes | None = None,
                  observers: Iterable[Callable[[dict], None]] = (), work: Workload | None = None,
                  key: bytes | None = None, jobs: int = 1, executor: str = "local",
                  address: str | None = None) -> dict:
    """Run ``scenario`` in virtual time; returns the summary also written to ``out_dir``.

    ``work`` replaces the scenario's learning task (tests use a stand-in);
    ``key`` seals every message (core.wire.auth); ``jobs`` > 1: clients train in that
    many worker processes (``executor`` "local"), or as Ray tasks (``executor`` "ray", on
    the cluster at ``address`` or a local Ray), for the same result (emu.executor).
    """
    wall_start = time.perf_counter()
    torch.set_num_threads(scenario.threads)
    arith_fingerprint.start()   # (the summary's, computed beside the run: not after it)
    # Before the run folder: a scenario whose model or data cannot be had leaves nothing behind.
    work = work or load_work(scenario)
    run = RunDir(out_dir)
    getattr(work, "open_run", lambda folder: None)(run.path)  # (a Flower app: its log goes into the run)
    for fn in observers:
        run.observe(fn)
    try:
        run.write_json("scenario.json", scenario.to_dict())
        with open_executor(executor, jobs, work, scenario.threads, address) as pool:
            getattr(work, "attach_executor", lambda pool: None)(pool)  # (a Flower app's calls go there)
            return _run(scenario, run, init, work, key, wall_start, pool)
    except Exception as err:  # the run folder still says what happened (then the error goes on)
        run.write_json("summary.json", failed_summary(scenario, "emu", err,
                                                      wall_time_s=time.perf_counter() - wall_start,
                                                      platform=cpu_arith.describe()))
        raise
    finally:
        run.close()


def _run(scenario: Scenario, run: RunDir, init, work, key, wall_start: float, pool=None) -> dict:
    """Build the world, run it to its end, write its summary."""
    env = simpy.Environment()
    world = build_world(env, scenario, work, run, init, key)
    world.executor = pool
    world.multicast = scenario.network.delivery == "multicast"
    down = schedule_offline(world, scenario)
    schedule_partitions(world, scenario)
    for name in scenario.node_names:
        if name not in down:
            world.start(name)
    if not scenario.kind.ends_with_leader:
        # Until every worker's role returned or its node crashed (a crashed worker's
        # process ends with None; the survivors stop or go on without it, never hang).
        # A worker down from the start joins when it comes up; one that comes back
        # after a crash starts from scratch and is not waited for (it cannot rejoin).
        procs = {n: world.nodes[n].process for n in scenario.node_names if n not in down}
        env.run(until=env.all_of(list(procs.values())))
        for n in scenario.node_names:
            late = world.nodes[n].process
            # geo: a node back after a crash joins again (core.geo.join): its new life counts too
            if (n in down or scenario.kind.rejoins_after_crash) and late is not None and late is not procs.get(n):
                env.run(until=late)
                procs[n] = late
        results = [procs[n].value if n in procs else None for n in scenario.node_names]
        end = env.now
    else:
        # Until the controller's role returns (it may crash and restart on the way),
        # then let what is still in flight land (the last model, Stop), as it would
        # for real; clients exit on Stop, so the event queue runs dry.
        lead = scenario.node_names[0]  # the FL controller, ddp's worker0, geo's master
        done = world.nodes[lead].finished
        try:
            env.run(until=done)
        except RuntimeError:
            if done.triggered:
                raise
            if world.nodes[lead].up:  # alive, but waiting for something no role will ever do
                raise DtemuError(f"the {lead} is still waiting at t={env.now:g} s and nothing is left to "
                                 "happen: every role waits for another (a deadlock)") from None
            raise DtemuError(f"the {lead} stopped at t={env.now:g} s without finishing the run "
                             "(it crashed and was not restarted); nothing is left to happen") from None
        end = env.now
        env.run()
        results = [done.value] + [world.nodes[n].result for n in scenario.node_names[1:]]
    stats = world.network.stats
    records = [node_record(scenario, n, r, stats[n].bytes_sent, stats[n].bytes_received,
                           bytes_rejected=world.nodes[n].bytes_rejected, sealed=key is not None)
               for n, r in zip(scenario.node_names, results)]
    wire = sum(s.wire_bytes_sent for s in stats.values())
    extra = {"wire_bytes": wire}
    if pool is not None:  # where the clients trained (the result is the same either way)
        extra["executor"] = pool.describe()
    if scenario.network.sites:  # what the network model saw cross each site's WAN (payload bytes)
        extra["wan_bytes"] = world.network.wan_bytes
    device = getattr(work, "device", devices.CPU)
    summary = run_summary(scenario, "emu", records, time_s=end, wall_time_s=time.perf_counter() - wall_start,
                          extra=extra, platform={**cpu_arith.describe(), **devices.describe(device)}, device=device)
    run.write_json("summary.json", summary)
    return summary
