"""What a mode is: one object that says everything the rest of dtemu asks of it.

A mode (fl, ddp, ps, geo) holds its scenario section, its nodes and their roles, what its
summary records, when its run is over, how real mode's calibration and transport treat it,
and where its audit and report page live.  The driver, the runtimes, the
summary and the reports ask the mode; none of them branches on a mode's name.

A mode names its roles' code by address (``load``), imported when a run asks for its roles, not
when a scenario is read: reading (and refusing) a scenario needs neither torch nor the roles, and
the scenario, which knows its sections through this registry, imports no role (the roles name the
scenario in their annotations; tests/test_layout.py refuses the cycle).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

DONE = "done"  # a run's stop_reason when nothing stopped it early


def load(address: str) -> Any:
    """What ``"package.module:name"`` names (``"package.module"``: the module), imported now."""
    module, _, name = address.partition(":")
    found = importlib.import_module(module)
    return getattr(found, name) if name else found


@dataclass(frozen=True)
class RoleSpec:
    """What one rank runs: its role, and the topics it reads and writes."""

    rank: int
    name: str
    subscribes: tuple[str, ...]
    publishes: tuple[str, ...]
    # start(ctx, init): the role's generator; init the checkpoint bytes to resume from, or None
    start: Callable[[Any, bytes | None], Any]


class Mode:
    name: str = ""
    # The scenario sections this mode's training depends on: they stay in the scenario's digest
    # (core.scenario.Scenario.digest), the others are dropped from it.
    digest_sections: frozenset[str] = frozenset()
    # (Every mode hands its training out as jobs an executor may run in other processes: emu --jobs,
    # --executor ray; core.ml.jobs: an FL client's round, a ddp or geo worker's gradient, a ps
    # worker's local iteration, a Flower app's call.)
    # Does ``emu run`` hand them to worker processes without being asked (--jobs' default: as many
    # as the cores hold)?  An FL round's clients, yes; a ddp or geo worker's gradient only with
    # --jobs N: its model's state goes out and its gradients come back every step, which on 2 cores
    # cost more than the second core gave (docs/notebook/, entry 27).
    pool_by_default: bool = False
    # What its jobs import in a worker beyond torch and dtemu's jobs: emu's fork server imports them
    # once for every worker (emu.fork_server), rather than each worker on its first job.
    worker_modules: tuple[str, ...] = ()
    # Do its training nodes step with torch.optim (ddp, geo), rather than with core.ml.sgd
    # (an FL client's train_local; a Flower app's own code)?
    steps_with_torch_optim: bool = True
    # Is the run over when its first rank's role returns (the FL controller;
    # the others then stop)?  Otherwise it ends when every worker's role has returned.
    ends_with_leader: bool = True
    # Does a node back after a crash join the run again (its new life counts in the results)?
    rejoins_after_crash: bool = False
    # Does every node send to every other at once (DDP's collectives)?  Real mode gives such
    # senders a writer history as deep as the model (host.writer_history.writer_history).
    all_to_all: bool = False
    # Does its leader choose whom to ask each round (fl.sample, fl.availability: core.fl.population;
    # host.traces builds it, with a trace's windows)?
    chooses_clients: bool = False
    # Which nodes can crash at protocol points (faults.crashes), by node kind; {}: none.
    crash_points: dict[str, tuple[str, ...]] = {}
    # Where its audit and report page live ("module:function"), so that core names them without
    # importing what reads run folders.
    audit: str | None = None
    report: str = ""
    # How it counts its units of work in a run's events, to compare two runs unit by unit (emu
    # validate): "module:function" of core.modes.units, taking the events and the leader's name.
    units: str = "dtemu.core.modes.units:leader_rounds"
    # What ``emu calibrate`` measures for it beyond the training step ("module:function" of
    # emu.costs, taking the scenario and repetitions, returning --set assignments).
    costs: str = "dtemu.emu.costs:transport_only_sets"
    # Does dtemu build the model its nodes train (so real launch can time a step of it before a run)?
    own_model: bool = True
    # Does dtemu place its training on the scenario's device (``device: cuda``; host.devices): its models,
    # their data and every step (core.ml.workload)?  Else cuda is refused at load.
    gpu: bool = True
    # What its roles work on ("module:function" of host, taking the scenario): the learning task, loaded
    # with its data (core.ml.workload.Workload), or a Flower app (host.flower_app).
    work: str = "dtemu.host.work:dtemu_work"
    # What one unit of its training nodes' compute is, as its roles run it: "step", a forward and backward
    # pass and the optimizer's step (fl's local training); or "gradients", the pass alone
    # (core.ml.train.compute_gradients: ddp's and geo's workers, whose update is priced apart as "apply").
    # The calibration (host.train_cost) times this unit: a geo worker's pass took 1.5-3% more CPU than the
    # optimizer step timed in its place, in the same processes (notebook entry 51).
    compute_unit: str = "step"
    # What the run counts its progress in (summary.json's key, the dashboard's header): rounds (or
    # global versions), steps.
    unit: str = "round"

    # --- nodes ---------------------------------------------------------
    def node_names(self, s) -> list[str]:
        raise NotImplementedError

    def training_nodes(self, s) -> list[str]:
        """The nodes whose traffic counts as bytes_up / bytes_down."""
        raise NotImplementedError

    def parties(self, s) -> int:
        """Into how many parts the training set is split (core.ml.workload)."""
        return len(self.training_nodes(s))

    def site_of(self, s) -> dict[str, str]:
        """Each node's site ({} without network.sites): where the scenario placed it."""
        return {node: name for name, site in s.network.sites.items() for node in site.nodes}

    def rounds(self, s) -> int | None:
        """How many of its units the run makes (None: not known in advance)."""
        return None

    def batch_size(self, s) -> int:
        """The batch its training steps take (what real mode's calibration measures)."""
        raise NotImplementedError

    def takes_corrupt(self, s, node: str) -> bool:
        """Can ``node`` send updates that faults.corrupt damages?"""
        return False

    # --- checks --------------------------------------------------------
    def validate(self, s) -> None:
        """The checks only this mode needs (core.scenario.validate runs the common ones)."""

    def code_keys(self, s) -> dict[str, str]:
        """The mode's own keys that name code, with what they name (``--no-code`` refuses them)."""
        return {}

    def places_nodes_in_sites(self, s) -> bool:
        """Does the mode place its nodes in network.sites itself (rather than the scenario)?"""
        return False

    # --- running -------------------------------------------------------
    def role_of(self, s, rank: int, work, population=None, residuals=None):
        """The RoleSpec (core.runtime.wiring) of ``rank``."""
        raise NotImplementedError

    def readers_of(self, s) -> dict[str, frozenset[str]] | None:
        """Which nodes read each topic, where not every peer reads every topic a node publishes."""
        return None

    def writers_of(self, s) -> dict[str, frozenset[str]]:
        """Which nodes write each topic: a barrier waits until its readers know those writers,
        so that what they send next is not lost (real.primitives' ``wait_peers``).  From every
        rank's role; a mode with many ranks says it without building them all."""
        by_topic: dict[str, set[str]] = {}
        for rank, name in enumerate(s.node_names):
            for topic in self.role_of(s, rank, None).publishes:
                by_topic.setdefault(topic, set()).add(name)
        return {t: frozenset(names) for t, names in by_topic.items()}

    # --- results -------------------------------------------------------
    def record(self, s, name: str, result: Any, time_to_accuracy) -> dict:
        """What a node's returned ``result`` adds to its record in summary.json."""
        return {}

    def summary(self, s, records: list[dict], time_to_accuracy, time_s) -> dict:
        """The mode's own fields of summary.json from every rank's record."""
        raise NotImplementedError

    def run_time(self, records: list[dict]) -> float | None:
        """A real run's time_s from its ranks' records."""
        if self.ends_with_leader:
            return records[0].get("time_s") if records else None
        return max((r["time_s"] for r in records if r.get("model_sha256") and "time_s" in r), default=None)

    def progress(self, summary: dict) -> str:
        """How far the run got, in a few words (emu run's last line)."""
        return f"{summary['rounds']} rounds ({summary['rounds_failed']} failed)"

    def stopped_early(self, summary: dict) -> str | None:
        """Why a rank's run counts as stopped rather than done (real run's exit code), or None."""
        return None
