"""Mode ddp: data-parallel workers 0..W-1 exchanging gradients by collectives (core.ddp)."""

from __future__ import annotations

from dtemu.core.errors import ScenarioError
from dtemu.core.modes.base import DONE, Mode, RoleSpec, load


class DataParallel(Mode):
    name = "ddp"
    digest_sections = frozenset({"ddp"})
    ends_with_leader = False
    all_to_all = True
    audit = "dtemu.report.audit_ddp:check_ddp"
    report = "dtemu.report.ddp:write_ddp_report"
    units = "dtemu.core.modes.units:ddp_steps"
    costs = "dtemu.emu.costs:ddp_sets"
    compute_unit = "gradients"   # (its workers' pass; the update is "apply")

    def node_names(self, s):
        return s.worker_names

    def training_nodes(self, s):
        return s.worker_names

    unit = "step"

    def rounds(self, s):
        return s.ddp.max_steps  # (None: every epoch to its end)

    def parties(self, s):
        return s.ddp.workers

    def batch_size(self, s):
        return s.ddp.batch_size

    def validate(self, s):
        for i, d in enumerate(s.ddp.warmup_densities):
            if not 0 < d <= 1:
                raise ScenarioError(f"ddp.warmup_densities[{i}]", f"expected a fraction in (0, 1], got {d!r}")
        if s.ddp.min_workers is not None and not 1 <= s.ddp.min_workers <= s.ddp.workers:
            raise ScenarioError("ddp.min_workers",
                                f"expected 1..{s.ddp.workers} (ddp.workers), got {s.ddp.min_workers}")

    def role_of(self, s, rank, work, population=None, residuals=None):
        worker = load("dtemu.core.ddp.worker:worker")
        from dtemu.core.wire.topics import COLL_FRAMES

        return RoleSpec(rank, s.worker_names[rank], (COLL_FRAMES,), (COLL_FRAMES,),
                        lambda ctx, init: worker(ctx, s, work, rank))

    def record(self, s, name, result, time_to_accuracy):
        from dtemu.core.ml.params import sha256_of

        return dict(final_accuracy=result.final_accuracy, steps=result.steps,
                    time_to_accuracy=time_to_accuracy(result.history),
                    # what the steps' exchanges sent (no barrier, no evaluation)
                    step_bytes_sent=result.bytes_sent, model_sha256=sha256_of(result.weights),
                    # after a loss (ddp.on_worker_lost): why it stopped, the ranks lost, its membership
                    stop_reason=result.stop_reason or DONE, lost_ranks=list(result.lost_ranks),
                    members=list(result.members), generation=result.generation)

    def summary(self, s, records, time_to_accuracy, time_s):
        """The numbers of the survivors: the ranks that finished and that no survivor lost (a crashed
        rank leaves no record; one restarted after it was lost is refused, so it is not one)."""
        done = {rank: r for rank, r in enumerate(records) if r.get("model_sha256")}
        lost = sorted({k for r in done.values() for k in r.get("lost_ranks", [])}
                      | {rank for rank in range(len(records)) if rank not in done})
        survivors = {rank: r for rank, r in done.items() if rank not in lost}
        hashes = sorted({r["model_sha256"] for r in survivors.values()})
        steps = min((r.get("steps", 0) for r in survivors.values()), default=0)
        reasons = [r["stop_reason"] for r in survivors.values() if r.get("stop_reason", DONE) != DONE]
        first = next(iter(survivors.values()), {})
        return {"compression": s.ddp.compression, "workers": s.ddp.workers,
                "final_accuracy": first.get("final_accuracy"), "steps": steps,
                "time_to_accuracy": first.get("time_to_accuracy") or time_to_accuracy([]),
                "bytes_per_step": round(sum(r.get("step_bytes_sent", 0) for r in survivors.values())
                                        / max(steps, 1) / max(len(survivors), 1), 3),
                "model_sha256": hashes[0] if hashes else None, "models_agree": len(hashes) == 1,
                "stop_reason": reasons[0] if reasons else DONE, "lost_ranks": lost,
                "survivors": sorted(survivors)}

    def progress(self, summary):
        return f"{summary['steps']} steps"

    def stopped_early(self, summary):
        reason = summary.get("stop_reason", DONE)
        return None if reason == DONE else reason
