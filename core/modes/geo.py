"""Mode geo: hierarchical parameter servers across data centres (core.geo: GeoMX's HiPS,
BiSparse, FP16, and the flat PS baseline)."""

from __future__ import annotations

from dtemu.core.errors import ScenarioError
from dtemu.core.geo.spec import (FLAT_PS, GLOBAL_PS, MASTER, geo_node_names, geo_site_of, site_workers,
                                worker_sites)
from dtemu.core.modes.base import Mode, RoleSpec, load


class GeoDistributed(Mode):
    name = "geo"
    # (geo keeps ddp's section in its digest, as it did before the registry)
    digest_sections = frozenset({"ddp", "geo"})
    ends_with_leader = False
    rejoins_after_crash = True  # a site's node back after a crash joins again (core.geo.join)
    audit = "dtemu.report.audit_geo:check_geo"
    report = "dtemu.report.geo:write_geo_report"
    units = "dtemu.core.modes.units:geo_rounds"
    costs = "dtemu.emu.costs:geo_sets"
    compute_unit = "gradients"   # (its workers' pass; the update is "apply")

    def node_names(self, s):
        return geo_node_names(s.network.sites, s.network.central, s.geo)

    def training_nodes(self, s):
        return [w for site in worker_sites(s.network.sites, s.network.central) for w in site_workers(site, s.geo)]

    def parties(self, s):
        # (geo splits the training set per round itself: core.geo.common; this split is not used)
        return s.fl.clients

    def site_of(self, s):
        return geo_site_of(s.network.sites, s.network.central, s.geo)

    def rounds(self, s):
        return s.geo.rounds

    def batch_size(self, s):
        return s.geo.batch_size

    def places_nodes_in_sites(self, s):
        return True

    def validate(self, s):
        sites = s.network.sites
        if len(sites) < 2:
            raise ScenarioError("network.sites", "geo mode needs a central site and at least one site of workers")
        for name, site in sites.items():
            if site.nodes:
                raise ScenarioError(f"network.sites.{name}.nodes",
                                    "geo mode places its nodes itself (master and PS central, workers per site)")
        if s.geo.sparse and s.geo.architecture == "flat":
            raise ScenarioError("geo.compression", "BiSparse sparsifies PS-to-PS traffic: it needs architecture hips")
        if s.geo.sync != "fsa" and (s.geo.sparse or s.geo.architecture == "flat"):
            raise ScenarioError("geo.sync", "MixedSync and HFA move dense weights between the sites of HiPS: "
                                "they need architecture hips and no bisparse")
        if s.geo.sparse and s.geo.global_optimizer:
            raise ScenarioError("geo.global_optimizer", "BiSparse returns a sparse gradient, not weights: "
                                "set global_optimizer false with bisparse")
        if s.geo.joining and s.geo.architecture != "hips":
            raise ScenarioError("geo.joining", "sites join a HiPS run (a site's local PS joins the global PS)")
        if s.geo.residual_momentum >= 1:
            raise ScenarioError("geo.residual_momentum", f"expected a value in [0, 1), got {s.geo.residual_momentum}")
        if s.faults.crashes or s.faults.corrupt:
            raise ScenarioError("faults", "geo mode takes faults.offline and delivery faults only")

    def role_of(self, s, rank, work, population=None, residuals=None):
        """The master and the root PS (global or flat) in the central site; local PSs and workers."""
        geo = load("dtemu.core.geo.roles")
        from dtemu.core.wire.topics import GEO_PULL, GEO_PUSH

        name = s.node_names[rank]
        if name == MASTER:
            return RoleSpec(rank, name, (GEO_PULL,), (GEO_PUSH,), lambda ctx, init: geo.master(ctx, s, work, name))
        if name in (GLOBAL_PS, FLAT_PS):
            return RoleSpec(rank, name, (GEO_PUSH,), (GEO_PULL,), lambda ctx, init: geo.root_ps(ctx, s, work, name))
        if name in s.training_nodes:
            return RoleSpec(rank, name, (GEO_PULL,), (GEO_PUSH,), lambda ctx, init: geo.worker(ctx, s, work, name))
        return RoleSpec(rank, name, (GEO_PUSH, GEO_PULL), (GEO_PUSH, GEO_PULL),
                        lambda ctx, init: geo.local_ps(ctx, s, work, name))

    def readers_of(self, s):
        """The root PS reads no pull, the workers and the master no push."""
        from dtemu.core.wire.topics import GEO_PULL, GEO_PUSH

        by_topic: dict[str, set[str]] = {GEO_PUSH: set(), GEO_PULL: set()}
        for rank, name in enumerate(s.node_names):
            for topic in self.role_of(s, rank, None).subscribes:
                by_topic[topic].add(name)
        return {t: frozenset(names) for t, names in by_topic.items()}

    def record(self, s, name, result, time_to_accuracy):
        geo_record = load("dtemu.core.geo.report:geo_record")

        return dict(geo_record(result), time_to_accuracy=time_to_accuracy(result.history))

    def summary(self, s, records, time_to_accuracy, time_s):
        geo_summary = load("dtemu.core.geo.report:geo_summary")

        return geo_summary(s, records, time_to_accuracy([]))

    def progress(self, summary):
        return f"{summary['rounds']} rounds, WAN {summary['wan_bytes'] / 1e6:.2f} MB"
