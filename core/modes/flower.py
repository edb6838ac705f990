"""Mode flower: an unmodified Flower app (core.flower): the server (rank 0) runs its ServerApp, the
clients client1..N (ranks 1..N) its ClientApp.  FL's nodes and what the fl section says of them (how
many, the round timeout, the barrier, availability, the client crash points); the rest is the app's."""

from __future__ import annotations

from dataclasses import fields

from dtemu.core.errors import ScenarioError
from dtemu.core.fl.names import CLIENT_CRASH_POINTS
from dtemu.core.flower.spec import SERVER
from dtemu.core.modes.base import RoleSpec, load
from dtemu.core.modes.fl import FederatedLearning

# The fl keys a Flower app's run reads; every other is dtemu's own FL (its codecs, rules, sampling).
FL_KEYS = frozenset({"clients", "round_timeout_s", "barrier_timeout_s", "barrier_require", "min_clients",
                     "availability", "rounds"})


class FlowerApp(FederatedLearning):
    name = "flower"
    digest_sections = frozenset({"fl", "flower"})
    pool_by_default = True
    # flwr's imports (~0.3 s of a worker's CPU before its first call), and torch._dynamo, which a
    # torch app's first optimizer step imports (1.1-1.2 s of each worker's CPU on a 2-core AMD EPYC;
    # a numpy app leaves it unused in the fork server's memory)
    worker_modules = ("dtemu.host.flower_jobs", "flwr.clientapp", "flwr.serverapp", "flwr.common.serde",
                      "torch._dynamo")
    steps_with_torch_optim = False
    crash_points = {"leader": (), "member": CLIENT_CRASH_POINTS}
    audit = "dtemu.report.audit_flower:check_flower"
    costs = "dtemu.emu.costs:flower_sets"
    # The app's model is its own: dtemu neither builds it nor can time a step of it ahead of a run.
    own_model = False
    # Nor does it place the app's tensors: the app's code chooses its device.
    gpu = False
    work = "dtemu.host.flower_app:load_app"

    def node_names(self, s):
        return [SERVER] + s.client_names

    def rounds(self, s):
        """The app's rounds where the scenario's run config says them (num-server-rounds, Flower's
        templates' key); else not known in advance (they may be in the app folder's defaults)."""
        rounds = s.flower.run_config.get("num-server-rounds")
        return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds > 0 else None

    def validate(self, s):
        from dtemu.core.fl.spec import FLSpec

        spec = s.flower
        if not spec.app_dir and not (spec.server_app and spec.client_app):
            raise ScenarioError("flower", "name the app: flower.app_dir (a Flower app's folder), or "
                                          "flower.server_app and flower.client_app")
        default = FLSpec()
        for f in fields(FLSpec):
            if f.name not in FL_KEYS and getattr(s.fl, f.name) != getattr(default, f.name):
                raise ScenarioError(f"fl.{f.name}", "is dtemu's own FL; a Flower app's strategy decides this "
                                                    f"(mode flower reads fl.{', fl.'.join(sorted(FL_KEYS))})")

    def code_keys(self, s):
        app = s.flower  # the app is code, all of it
        return {f"flower.{k}": v for k, v in (("app_dir", app.app_dir), ("server_app", app.server_app),
                                              ("client_app", app.client_app)) if v}

    def takes_corrupt(self, s, node):
        return False

    def role_of(self, s, rank, work, population=None, residuals=None):
        client = load("dtemu.core.flower.client:client")
        server = load("dtemu.core.flower.server:server")
        from dtemu.core.wire.topics import FLOWER_INS, FLOWER_RES

        if rank == 0:
            return RoleSpec(rank, SERVER, (FLOWER_RES,), (FLOWER_INS,),
                            lambda ctx, init: server(ctx, s, work, population))
        return RoleSpec(rank, f"client{rank}", (FLOWER_INS,), (FLOWER_RES,),
                        lambda ctx, init: client(ctx, s, work, rank))

    def writers_of(self, s):
        """The server writes the calls, the clients the replies (not FL's topics)."""
        from dtemu.core.wire.topics import FLOWER_INS, FLOWER_RES

        return {FLOWER_INS: frozenset({SERVER}), FLOWER_RES: frozenset(s.client_names)}

    def record(self, s, name, result, time_to_accuracy):
        if name != SERVER:
            return {"calls": result}
        return dict(final_accuracy=result.final_accuracy, rounds=result.rounds_completed,
                    time_to_accuracy=time_to_accuracy(result.history), rounds_failed=result.rounds_failed,
                    stop_reason=result.stop_reason, updates=dict(sorted(result.counts.items())),
                    model_sha256=result.model_sha256)

    def summary(self, s, records, time_to_accuracy, time_s):
        return {**super().summary(s, records, time_to_accuracy, time_s), "codec": "flower"}
