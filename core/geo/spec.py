"""The scenario keys of geo-distributed training (``mode: geo``) and of sites (``network.sites``).

Kept apart from ``core.scenario`` (which imports them) so that the geo keys,
their defaults and the names of the geo roles live in one place.

Sites.  ``network.sites`` groups nodes into data centres: each site has a LAN
(every node's access link in it) and a WAN attachment to the others; one site
is central (``network.central``, default the first).  In FL and DDP a site
lists its ``nodes``; in geo mode the nodes are placed by the mode itself: the
master worker and the global (or flat) parameter server in the central site,
a local parameter server and ``geo.workers_per_site`` workers in every other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dtemu.core.schema import U16, U32, between, check, fraction, non_negative, positive

MASTER = "master"
GLOBAL_PS = "global-ps"   # HiPS: aggregates the sites
FLAT_PS = "ps"            # the flat baseline: one PS that every worker reaches over the WAN
VARIANTS = ("none", "fp16", "bisparse", "bisparse_fp16")
WARMUP_DENSITIES = (0.25, 0.0625, 0.015625)   # DGC's warm-up stages (its last, 0.4%, is below k = 1%)


def increasing_rounds(rounds: list[int]) -> str | None:
    if any(r < 1 for r in rounds) or any(b <= a for a, b in zip(rounds, rounds[1:])):
        return "expected rounds >= 1 in increasing order"
    return None


@dataclass(frozen=True)
class LanSpec:
    bandwidth_mbps: float = field(default=1000.0, metadata=check(positive))
    latency_ms: float = field(default=0.1, metadata=check(non_negative))


@dataclass(frozen=True)
class WanSpec:
    up_mbps: float = field(default=155.0, metadata=check(positive))
    down_mbps: float = field(default=155.0, metadata=check(positive))
    latency_ms: float = field(default=10.0, metadata=check(non_negative))


@dataclass(frozen=True)
class SiteSpec:
    # FL / DDP: the nodes of this site (every node in exactly one site).  geo: leave empty.
    nodes: list[str] = field(default_factory=list)
    lan: LanSpec = field(default_factory=LanSpec)
    wan: WanSpec = field(default_factory=WanSpec)


@dataclass(frozen=True)
class GeoSpec:
    # hips: workers -> local PS (LAN) -> global PS (WAN); flat: every worker -> one PS over the WAN.
    architecture: Literal["hips", "flat"] = "hips"
    # fsa: synchronous inside and between sites.  mixed (MixedSync): synchronous inside a site,
    # asynchronous between sites: the global PS keeps the model, applies each site's gradient as it
    # comes (DC-ASGD with geo.dcasgd_lambda > 0) and sends that site the new weights.
    # hfa: K1 local steps at each worker, K2 weight averages at the local PS, then one global
    # average (core.geo.hfa).
    sync: Literal["fsa", "mixed", "hfa"] = "fsa"
    k1: int = field(default=4, metadata=check(positive))   # HFA: local SGD steps per local sync
    k2: int = field(default=2, metadata=check(positive))   # HFA: local syncs per global sync
    # DC-ASGD's delay compensation at the global PS (mixed): g + lambda * g * g * (w - w_site_pulled).
    dcasgd_lambda: float = field(default=0.0, metadata=check(non_negative))
    workers_per_site: int = field(default=4, metadata=check(between(1, U16, "worker ranks")))
    rounds: int = field(default=100, metadata=check(between(1, U32, "a round is 32 bits on the wire")))
    batch_size: int = field(default=64, metadata=check(positive))
    lr: float = field(default=0.05, metadata=check(positive))
    # A step schedule, as torch's MultiStepLR counts epochs: after each of these rounds the learning
    # rate is multiplied by lr_gamma, on every node that applies an update.  Empty: geo.lr throughout.
    # (Cutting it before the models have learnt freezes them early: docs/notebook/, GeoMX part 6.)
    lr_milestones: list[int] = field(default_factory=list, metadata=check(increasing_rounds))
    lr_gamma: float = field(default=0.1, metadata=check(fraction))
    # SGD momentum at the workers (dense variants); BiSparse keeps it in its residuals instead.
    momentum: float = field(default=0.9, metadata=check(non_negative))
    # none / fp16 (every dense transfer in half precision) / bisparse (PS <-> PS sparse both ways) / both.
    compression: Literal["none", "fp16", "bisparse", "bisparse_fp16"] = "none"
    density: float = field(default=0.01, metadata=check(fraction))          # k: top fraction sent
    sample_ratio: float = field(default=0.005, metadata=check(fraction))    # s: threshold sample
    residual_momentum: float = field(default=0.9, metadata=check(non_negative))  # m of the residuals
    # DGC's warm-up for BiSparse: the first warmup_rounds rounds send 25%, 6.25%, 1.5625% (a third
    # of them each, never less than geo.density) before settling at geo.density; 0: none (GeoMX).
    warmup_rounds: int = field(default=0, metadata=check(non_negative))
    # BiSparse: parameter tensors with fewer entries than this (biases, a first conv layer) cross
    # the WAN whole every round, with plain momentum, instead of as their top k (DGC and GeoMX
    # sparsify only the large tensors).  0: every tensor sparse.
    dense_below: int = field(default=0, metadata=check(non_negative))
    # BiSparse: DGC's momentum-factor masking (v zeroed where sent); false: only u is zeroed.
    momentum_masking: bool = True
    # The global PS keeps the model and returns updated weights (SGD, geo.lr and geo.momentum)
    # instead of the aggregated gradient.
    global_optimizer: bool = False
    eval_every: int = field(default=10, metadata=check(positive))
    # Local PSs send the global PS a heartbeat this often while they wait; a site silent for 3 of
    # them is reported lost (geo_lost, reason heartbeat) before the round's timeout.  None: off.
    # 3 periods must outlast the WAN latency and a local PS's push (it does not beat while it sends).
    heartbeat_s: float | None = field(default=None, metadata=check(positive))
    # A PS waits this long for a round's pushes (and a worker for its pull) before it gives up on them.
    round_timeout_s: float = field(default=60.0, metadata=check(positive))
    # HiPS, FSA: sites may join the running run (core.geo.join): a local PS's first message is a
    # JOIN; the global PS starts with the sites it heard from within start_wait_s (None:
    # geo.round_timeout_s) and lets a later one in when a round closes.  Off: a site not up at
    # the start is given up at round 0 like a lost one (and the run's bytes and times are as before).
    joining: bool = False
    start_wait_s: float | None = field(default=None, metadata=check(non_negative))

    def lr_at(self, round_: int) -> float:
        """The learning rate that round ``round_`` (1-based) applies."""
        return self.lr * self.lr_gamma ** sum(round_ > m for m in self.lr_milestones)

    @property
    def sparse(self) -> bool:
        return self.compression.startswith("bisparse")

    @property
    def fp16(self) -> bool:
        return self.compression.endswith("fp16")

    def density_at(self, round_: int) -> float:
        """BiSparse's density in ``round_`` (1-based), warm-up included."""
        if round_ > self.warmup_rounds:
            return self.density
        stage = (round_ - 1) * len(WARMUP_DENSITIES) // self.warmup_rounds
        return max(self.density, WARMUP_DENSITIES[stage])

    @property
    def weights_down(self) -> bool:
        """What comes down is weights (the global PS keeps the model), not the aggregated gradient."""
        return self.global_optimizer or self.sync in ("mixed", "hfa")


def central_site(sites: dict[str, SiteSpec], central: str | None) -> str | None:
    if not sites:
        return None
    return central if central is not None else next(iter(sites))


def worker_sites(sites: dict[str, SiteSpec], central: str | None) -> list[str]:
    """The sites with workers (every site but the central one), in scenario order."""
    c = central_site(sites, central)
    return [s for s in sites if s != c]


def site_ps(site: str) -> str:
    return f"{site}-ps"


def site_workers(site: str, geo: GeoSpec) -> list[str]:
    return [f"{site}-w{i}" for i in range(geo.workers_per_site)]


def geo_node_names(sites: dict[str, SiteSpec], central: str | None, geo: GeoSpec) -> list[str]:
    """Rank order: master, the global (or flat) PS, then per site its local PS (HiPS) and workers."""
    names = [MASTER, GLOBAL_PS if geo.architecture == "hips" else FLAT_PS]
    for site in worker_sites(sites, central):
        if geo.architecture == "hips":
            names.append(site_ps(site))
        names.extend(site_workers(site, geo))
    return names


def geo_site_of(sites: dict[str, SiteSpec], central: str | None, geo: GeoSpec) -> dict[str, str]:
    c = central_site(sites, central)
    out = {MASTER: c, GLOBAL_PS if geo.architecture == "hips" else FLAT_PS: c}
    for site in worker_sites(sites, central):
        if geo.architecture == "hips":
            out[site_ps(site)] = site
        out.update({w: site for w in site_workers(site, geo)})
    return out
