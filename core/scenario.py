"""The scenario: one YAML file, typed and validated, that both runtimes run unchanged.

``parse_scenario(raw, overrides)`` takes the YAML's mapping (``host/scenario_file.py``
reads the file, within the bounds of ``core.bounded_yaml``), applies
``--set key.path=value`` overrides, builds the dataclasses below (see ``core.schema`` for the error
format) and then checks what only makes sense across fields (a quorum larger
than the clients, a node name that does not exist, ...), so a scenario that
cannot work is refused before anything starts.

Each section's keys, with their defaults and what they mean, are in the section's own module:
``core.fl.spec``, ``core.ddp.spec``, ``core.geo.spec``, ``core.flower.spec``,
``core.runtime.network_spec``, ``core.runtime.compute_spec`` and ``core.runtime.fault_spec``;
this one holds the top-level keys, the data's, and the checks across sections.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from dtemu.core import bounded_yaml
from dtemu.core.errors import ScenarioError
from dtemu.core.fl.strategy import RULE_KEYS
from dtemu.core.flower.spec import FlowerSpec, flatten_run_config
from dtemu.core.geo.spec import GeoSpec, central_site
from dtemu.core.ml.user_code import BUILTIN_TASKS as TASKS, model_spec
from dtemu.core.modes import FORMS, MODES, Mode
from dtemu.core.fl.names import CLIENT_CRASH_POINTS, CONTROLLER, CONTROLLER_CRASH_POINTS  # noqa: F401 (their old home)
from dtemu.core.ddp.spec import DDPSpec
# The sections' types, importable from here as before they had homes of their own:
from dtemu.core.fl.spec import (AvailabilitySpec, ESyncSpec, FedAsyncSpec, FedDropSpec, FLSpec,  # noqa: F401
                                ServerOptSpec, TiFLSpec)
from dtemu.core.runtime.compute_spec import (ComputeModel, ComputeOverride, ComputeSpec, CpuCosts,  # noqa: F401
                                             SlowdownStep, VaryingSlowdown)
from dtemu.core.runtime.fault_spec import (CorruptSpec, CrashSpec, FaultSpec, OfflineWindow,  # noqa: F401
                                           PartitionSpec)
from dtemu.core.runtime.network_spec import LinkOverride, LinkSpec, NetworkSpec  # noqa: F401
from dtemu.core.schema import between, build, check, positive

CODEC_NAMES = ("fp32", "q8", "s4", "sq8")


@dataclass(frozen=True)
class DataSpec:
    dataset: Literal["mnist", "fashion_mnist"] = "mnist"
    # Where the IDX archives live; else $DTEMU_DATA; else the user cache.
    root: str | None = None
    # A user data set: "package.module:factory" returning (x_train, y_train, x_test, y_test).
    factory: str | None = None
    partition: Literal["iid", "shards", "dirichlet"] = "iid"
    alpha: float = field(default=0.5, metadata=check(positive))
    shards_per_client: int = field(default=2, metadata=check(positive))
    # Evaluate on the first N test samples (None: the whole test set).
    test_samples: int | None = field(default=None, metadata=check(positive))


@dataclass(frozen=True)
class Scenario:
    # Names run folders (runs/<name>-<date>-<time>): letters, digits, . _ -, at most 100.
    name: str
    # (mode ps is read as fl: core.fl.ps_form)
    mode: Literal["fl", "ddp", "geo", "flower"] = "fl"
    seed: int = field(default=0, metadata=check(between(0, (1 << 63) - 1, "a 64-bit seed")))
    model: str = "mnist_cnn"
    # What it learns, as a plugin (core.ml.task): "package.module:Name" supplying the model, the data,
    # the loss and what counts as right; None: ``model`` and ``data`` make the built-in classification.
    task: str | None = None
    # torch threads per process.  1: dtemu's parallelism is processes (emu's pool, real's ranks), and N
    # processes of one thread fit N cores (host.cores); a count is part of the arithmetic, so both modes
    # use the scenario's.
    threads: int = field(default=1, metadata=check(positive))
    # Where the training runs: cpu; cuda (a GPU: refused at load where torch sees none, or where the mode
    # trains on the CPU only, host.devices); auto (a GPU if there is one and the mode can use it, else the CPU).
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    data: DataSpec = field(default_factory=DataSpec)
    fl: FLSpec = field(default_factory=FLSpec)
    ddp: DDPSpec = field(default_factory=DDPSpec)
    network: NetworkSpec = field(default_factory=NetworkSpec)
    compute: ComputeModel = field(default_factory=ComputeModel)
    faults: FaultSpec = field(default_factory=FaultSpec)
    # mode geo: hierarchical parameter servers across data centres (core.geo)
    geo: GeoSpec = field(default_factory=GeoSpec)
    # mode flower: an unmodified Flower app over dtemu's network and clock (core.flower)
    flower: FlowerSpec = field(default_factory=FlowerSpec)
    # Accuracies whose first time summary.json reports (time_to_accuracy); they measure, not steer.
    targets: list[float] = field(default_factory=lambda: [0.8, 0.9, 0.95])

    # --- derived -------------------------------------------------------
    @property
    def model_spec(self) -> str:
        """What the roles build: the task's model ("task:" + spec), or the ``model`` key."""
        return model_spec(self.task, self.model)

    @property
    def client_names(self) -> list[str]:
        return [f"client{i}" for i in range(1, self.fl.clients + 1)]

    @property
    def worker_names(self) -> list[str]:
        return [f"worker{i}" for i in range(self.ddp.workers)]

    @property
    def kind(self) -> Mode:
        """The mode's object (core.modes): its nodes, roles, summary and rules."""
        return MODES[self.mode]

    @property
    def node_names(self) -> list[str]:
        """Every node, in rank order (FL: rank 0 is the controller; DDP: worker<rank>)."""
        return self.kind.node_names(self)

    @property
    def training_nodes(self) -> list[str]:
        """The nodes whose traffic counts as bytes_up / bytes_down."""
        return self.kind.training_nodes(self)

    @property
    def central_site(self) -> str | None:
        return central_site(self.network.sites, self.network.central)

    @property
    def site_of(self) -> dict[str, str]:
        """Each node's site ({} without network.sites)."""
        return self.kind.site_of(self)

    def link(self, node: str) -> LinkSpec:
        site = self.site_of.get(node)
        if site is None:
            return _merge(self.network.default, self.network.nodes.get(node))
        lan = self.network.sites[site].lan   # a node in a site: its access link is the site's LAN
        base = LinkSpec(up_mbps=lan.bandwidth_mbps, down_mbps=lan.bandwidth_mbps, latency_ms=lan.latency_ms,
                        loss=self.network.default.loss)
        return _merge(base, self.network.nodes.get(node))

    def compute_for(self, node: str) -> ComputeSpec:
        return _merge(self.compute.default, self.compute.nodes.get(node))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self) -> str:
        """A hash of what determines training, to match checkpoints to scenarios.

        init_path is left out (resuming is the point of a checkpoint) and so is
        the number of rounds (a run may be resumed to go on for longer).
        """
        d = self.to_dict()
        # (fl.max_time_s, like the rounds, is how long it goes on; fl.init at its default: the digests of
        # scenarios before the key)
        d["fl"] = {k: v for k, v in d["fl"].items() if k not in ("init_path", "rounds", "max_time_s")
                   and (k, v) != ("init", "seeded")}
        if d["fl"]["algorithm"] == "fedavg" and not d["fl"]["proximal_mu"]:  # (digests from before the rules)
            for key in ("algorithm", "proximal_mu", "server_opt", "fedasync"):
                del d["fl"][key]
        for key, rule in RULE_KEYS.items():
            if d["fl"].get("algorithm", "fedavg") != rule:   # (a rule's keys count only under that rule)
                del d["fl"][key]
        d.pop("targets")  # what is measured, not what is trained
        if d["task"] is None:  # (digests from before tasks)
            del d["task"]
        if d["device"] != "cuda":  # (digests from before devices; auto names no device of its own)
            del d["device"]
        for section in ("fl", "ddp", "geo", "flower"):  # what its mode does not train with
            if section not in self.kind.digest_sections:
                d.pop(section)
        if d.get("flower", {}).get("app_dir"):   # the app, not where this checkout keeps it
            d["flower"]["app_dir"] = d["flower"]["app_dir"].replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
        if not self.network.sites:
            del d["network"]["sites"], d["network"]["central"]
        # Emu's timing of real mode's transport (issue 15): at their defaults a scenario keeps
        # the digest it had before these keys.
        if d["network"]["framing"] == "payload":
            del d["network"]["framing"]
        if not d["network"]["send_window_bytes"]:
            del d["network"]["send_window_bytes"]
        for key in ("decode_s_per_mb", "send_s_per_message", "recv_s_per_message", "send_s_per_mb", "recv_s_per_mb", "query_s",
                    "eval_s_per_sample", "app_s_per_mb", "seal_s_per_mb", "spread", "spread_per_sample", "warmup_s"):
            if not d["compute"]["default"][key]:
                del d["compute"]["default"][key]
            for node in d["compute"]["nodes"].values():
                if node.get(key) is None:
                    node.pop(key, None)
        for node in d["compute"]["nodes"].values():
            if node.get("cpu") is None:
                node.pop("cpu", None)
        # ... nor do the CPU costs outside training (geo's roles) when they are absent.
        if not self.compute.default.cpu.any():
            del d["compute"]["default"]["cpu"]
        for key, default in (("shared_cores", 0), ("spread_draw", 0), ("machines", "nodes")):
            if d["compute"][key] == default:   # (the digests of scenarios from before these keys)
                del d["compute"][key]
        del d["compute"]["profile"]  # where the costs came from; the costs themselves are above
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def _merge(default, override):
    if override is None:
        return default
    # Field by field, not asdict: nested values (a compute schedule) stay dataclasses.
    values = {f.name: getattr(default, f.name) for f in fields(default)}
    values.update({f.name: getattr(override, f.name) for f in fields(override)
                   if getattr(override, f.name) is not None})
    return type(default)(**values)


# --- loading -----------------------------------------------------------


def apply_override(raw: dict, assignment: str) -> None:
    """Apply one ``key.path=value`` to the raw YAML mapping (value parsed as YAML)."""
    if "=" not in assignment:
        raise ScenarioError("--set", f"expected key.path=value, got {assignment!r}")
    key, text = assignment.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ScenarioError("--set", f"bad key path {key!r}")
    value = bounded_yaml.load(text, f"the value of --set {key.strip()}") if text.strip() else None
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ScenarioError(".".join(parts[: i + 1]), f"cannot set a key inside {child!r}")
        node = child
    node[parts[-1]] = value


def stretched(s: Scenario, factor: float) -> Scenario:
    """``s`` with every duration (a key ending in ``_s``: timeouts, fault times, restarts, delays)
    ``factor`` times as long.  Real mode runs a scenario on a machine slower than the one its
    compute model describes this way, so that the *relative* timing is the scenario's."""
    if factor == 1:
        return s

    def scale(node):
        if isinstance(node, dict):
            return {k: (v * factor if k.endswith("_s") and isinstance(v, (int, float)) and not isinstance(v, bool)
                        else scale(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [scale(v) for v in node]
        return node

    d = s.to_dict()
    for key, rule in RULE_KEYS.items():   # a rule's keys stay at their defaults under another rule
        if d["fl"]["algorithm"] != rule:  # (fl.esync.query_timeout_s, under fedavg, is no duration)
            del d["fl"][key]
    out = build(Scenario, scale(d))
    validate(out)
    return out


def parse_scenario(raw: Any, overrides: list[str] = (), notes: list[str] | None = None) -> Scenario:
    """The scenario of ``raw`` with ``overrides``.  A scenario in a form that is no longer a mode (mode
    ps) is read as the mode it became (core.modes.FORMS); what that changed is added to ``notes``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError("", f"a scenario must be a mapping, got {type(raw).__name__}")
    raw = json.loads(json.dumps(raw))  # a deep copy that we may modify
    for assignment in overrides:
        apply_override(raw, assignment)
    form = FORMS.get(raw.get("mode")) if isinstance(raw.get("mode"), str) else None
    if form is not None:
        said = form(raw)
        if notes is not None:
            notes.extend(said)
    flatten_run_config(raw.get("flower"))  # (Flower's run config is flat: model.name, not {model: {name}})
    scenario = build(Scenario, raw)
    validate(scenario)
    return scenario


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def validate(s: Scenario) -> None:
    """Checks across fields: refuse what cannot work, before anything starts."""
    if s.task is not None and ":" not in s.task and s.task not in TASKS:
        raise ScenarioError("task", f"unknown task {s.task!r}; built in: {', '.join(sorted(TASKS))}, "
                                    "or package.module:Name")
    if s.task is not None and s.data.factory:
        raise ScenarioError("data.factory", f"the task {s.task!r} supplies its own data; a scenario names a task or a "
                                            "data factory, not both")
    if not NAME.fullmatch(s.name):
        raise ScenarioError("name", f"expected 1 to 100 letters, digits, '.', '_' or '-' (it names the run "
                                    f"folder), starting with a letter or digit; got {s.name[:60]!r}"
                                    + ("..." if len(s.name) > 60 else ""))
    for i, target in enumerate(s.targets):
        if not 0 < target <= 1:
            raise ScenarioError(f"targets[{i}]", f"expected an accuracy in (0, 1], got {target!r}")
    fl = s.fl
    if fl.min_clients > fl.clients:
        raise ScenarioError(
            "fl.min_clients", f"{fl.min_clients} is more than fl.clients ({fl.clients})"
        )
    s.kind.validate(s)
    _validate_sampling(s)
    _validate_sites(s)
    known = set(s.node_names)
    for section, names in (("network.nodes", s.network.nodes), ("compute.nodes", s.compute.nodes)):
        for name in names:
            if name not in known:
                raise ScenarioError(
                    f"{section}.{name}", f"no such node (nodes are {', '.join(s.node_names)})"
                )
    for i, window in enumerate(s.faults.offline):
        path = f"faults.offline[{i}]"
        if window.node not in known:
            raise ScenarioError(
                f"{path}.node", f"no such node {window.node!r} (nodes are {', '.join(s.node_names)})"
            )
        if window.end_s is not None and window.end_s <= window.start_s:
            raise ScenarioError(f"{path}.end_s", f"must be after start_s ({window.start_s})")
    _validate_faults(s, known)
    for name in [None, *s.compute.nodes]:
        spec = s.compute_for(name) if name else s.compute.default
        where = f"compute.nodes.{name}" if name else "compute.default"
        times = [step.at_s for step in spec.schedule]
        if times != sorted(times):
            raise ScenarioError(f"{where}.schedule", "steps must be in time order")
        if spec.varying is not None and spec.varying.high < spec.varying.low:
            raise ScenarioError(f"{where}.varying.high", f"must be >= low ({spec.varying.low})")


def _validate_sampling(s: Scenario) -> None:
    fl = s.fl
    if fl.sample is not None:
        if fl.sample >= 1 and fl.sample != int(fl.sample):
            raise ScenarioError("fl.sample", f"a count must be a whole number (a fraction is < 1), got {fl.sample!r}")
        asked = fl.asked_per_round
        if asked > fl.clients:
            raise ScenarioError("fl.sample", f"asks {asked} clients a round, more than fl.clients ({fl.clients})")
        if fl.min_clients > asked:
            raise ScenarioError("fl.min_clients", f"{fl.min_clients} is more than the {asked} clients "
                                                  "fl.sample asks per round")
    if fl.availability.kind == "trace" and not fl.availability.trace:
        raise ScenarioError("fl.availability.trace", "availability kind 'trace' needs the trace file's path")


def _validate_sites(s: Scenario) -> None:
    sites, net = s.network.sites, s.network
    if net.central is not None and net.central not in sites:
        raise ScenarioError("network.central", f"no such site {net.central!r} (sites are {', '.join(sites) or 'none'})")
    if s.kind.places_nodes_in_sites(s):
        return
    seen: dict[str, str] = {}
    for name, site in sites.items():
        for j, node in enumerate(site.nodes):
            if node not in s.node_names:
                raise ScenarioError(f"network.sites.{name}.nodes[{j}]",
                                    f"no such node {node!r} (nodes are {', '.join(s.node_names)})")
            if node in seen:
                raise ScenarioError(f"network.sites.{name}.nodes[{j}]", f"{node} is already in site {seen[node]}")
            seen[node] = name
    if sites and len(seen) != len(s.node_names):
        missing = [n for n in s.node_names if n not in seen]
        raise ScenarioError("network.sites", f"every node must be in a site; not placed: {', '.join(missing)}")


def _validate_faults(s: Scenario, known: set[str]) -> None:
    faults = s.faults
    nodes = ", ".join(s.node_names)

    def node(path: str, name: str) -> None:
        if name not in known:
            raise ScenarioError(path, f"no such node {name!r} (nodes are {nodes})")

    for i, crash in enumerate(faults.crashes):
        path = f"faults.crashes[{i}]"
        if not s.kind.crash_points:
            raise ScenarioError(path, f"crashes at protocol points are FL faults (mode {s.mode}: faults.offline)")
        node(f"{path}.node", crash.node)
        points = s.kind.crash_points["leader" if crash.node == s.node_names[0] else "member"]
        if crash.at not in points:
            raise ScenarioError(f"{path}.at", f"{crash.node} can crash at {', '.join(points)}; got {crash.at!r}")
        if crash.round > s.fl.rounds:
            raise ScenarioError(f"{path}.round", f"round {crash.round} is after the last round ({s.fl.rounds})")
    for i, part in enumerate(faults.partitions):
        path = f"faults.partitions[{i}]"
        if not part.nodes:
            raise ScenarioError(f"{path}.nodes", "name at least one node to cut off")
        for j, name in enumerate(part.nodes):
            node(f"{path}.nodes[{j}]", name)
        if len(set(part.nodes)) == len(known):
            raise ScenarioError(f"{path}.nodes", "a partition of every node cuts nothing off")
        if part.end_s <= part.start_s:
            raise ScenarioError(f"{path}.end_s", f"must be after start_s ({part.start_s})")
    for i, bad in enumerate(faults.corrupt):
        path = f"faults.corrupt[{i}]"
        node(f"{path}.node", bad.node)
        if not s.kind.takes_corrupt(s, bad.node):
            raise ScenarioError(f"{path}.node", "only FL clients send updates that can be corrupted")
        for j, r in enumerate(bad.rounds):
            if not 1 <= r <= s.fl.rounds:
                raise ScenarioError(f"{path}.rounds[{j}]", f"expected a round in 1..{s.fl.rounds}, got {r}")
