"""Mode ps: a parameter server (rank 0), a state server (rank 1) and workers 2.. (core.ps:
ESync and its baselines)."""

from __future__ import annotations

from dtemu.core.modes.base import Mode, RoleSpec, load
from dtemu.core.ps.spec import PS, SS, validate_ps


class ParameterServer(Mode):
    name = "ps"
    # (ps keeps ddp's section in its digest, as it did before the registry: checkpoints stay valid)
    digest_sections = frozenset({"ddp", "ps"})
    audit = "dtemu.report.audit_ps:check_ps"
    report = "dtemu.report.ps:write_ps_report"
    units = "dtemu.core.modes.units:esync_versions"
    costs = "dtemu.emu.federation_costs:ps_sets"

    def node_names(self, s):
        return [PS, SS] + s.ps.worker_names

    def training_nodes(self, s):
        return s.ps.worker_names

    def parties(self, s):
        return s.ps.workers

    def rounds(self, s):
        return s.ps.rounds

    def batch_size(self, s):
        return s.ps.batch_size

    def validate(self, s):
        validate_ps(s.ps)

    def role_of(self, s, rank, work, population=None, residuals=None):
        parameter_server = load("dtemu.core.ps.server:parameter_server")
        state_server = load("dtemu.core.ps.state_server:state_server")
        ps_worker = load("dtemu.core.ps.worker:ps_worker")
        from dtemu.core.wire.topics import PS_MODEL, PS_UPDATE, SS_REPLY, SS_STATE

        name = s.node_names[rank]
        if name == PS:
            return RoleSpec(rank, name, (PS_UPDATE,), (PS_MODEL, SS_STATE),
                            lambda ctx, init: parameter_server(ctx, s, work, init))
        if name == SS:
            workers = list(range(2, 2 + s.ps.workers))
            return RoleSpec(rank, name, (SS_STATE,), (SS_REPLY,),
                            lambda ctx, init: state_server(ctx, s.node_names, workers,
                                                           needed=s.ps.uses_state_server))
        return RoleSpec(rank, name, (PS_MODEL, SS_REPLY), (PS_UPDATE, SS_STATE),
                        lambda ctx, init: ps_worker(ctx, s, work, rank))

    def readers_of(self, s):
        """The state server reads none of the models, the workers none of the updates."""
        from dtemu.core.wire.topics import PS_MODEL, PS_UPDATE, SS_REPLY, SS_STATE

        workers = frozenset(s.ps.worker_names)
        return {PS_MODEL: workers, SS_REPLY: workers, PS_UPDATE: frozenset({PS}), SS_STATE: frozenset({SS})}

    def record(self, s, name, result, time_to_accuracy):
        ps_record = load("dtemu.core.ps.summary:ps_record")

        record = ps_record(result)
        if "history" in record:
            record["time_to_accuracy"] = time_to_accuracy(record["history"])
        return record

    def summary(self, s, records, time_to_accuracy, time_s):
        ps_summary = load("dtemu.core.ps.summary:ps_summary")

        return ps_summary(s, records, time_to_accuracy([]), time_s)
