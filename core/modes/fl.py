"""Mode fl: a controller (rank 0) and clients 1..N (core.fl)."""

from __future__ import annotations

from dtemu.core.errors import ScenarioError
from dtemu.core.fl.names import CLIENT_CRASH_POINTS, CONTROLLER, CONTROLLER_CRASH_POINTS, STATE_SERVER_NODE as SS
from dtemu.core.fl.rules import ASYNCHRONOUS, STATE_SERVER
from dtemu.core.fl.server_opt import SECOND_MOMENTS
from dtemu.core.fl.strategy import RULE_KEYS, check_tiers
from dtemu.core.modes.base import Mode, RoleSpec, load


class FederatedLearning(Mode):
    name = "fl"
    digest_sections = frozenset({"fl"})
    pool_by_default = True
    steps_with_torch_optim = False
    chooses_clients = True
    crash_points = {"leader": CONTROLLER_CRASH_POINTS, "member": CLIENT_CRASH_POINTS}
    audit = "dtemu.report.audit_fl:check_fl"
    report = "dtemu.report.fl:write_fl_report"
    costs = "dtemu.emu.federation_costs:fl_sets"

    def node_names(self, s):
        """The controller, the clients, and the state server a rule brings (esync: "ss", last, so
        that a client's rank is its index either way)."""
        return [CONTROLLER] + s.client_names + ([SS] if s.fl.algorithm in STATE_SERVER else [])

    def training_nodes(self, s):
        return s.client_names

    def parties(self, s):
        return s.fl.clients

    def rounds(self, s):
        return s.fl.rounds

    def batch_size(self, s):
        return s.fl.batch_size

    def validate(self, s):
        """The update rule's keys: each rule's parameters, no other's."""
        fl = s.fl
        if fl.algorithm == "fedprox" and not fl.proximal_mu > 0:
            raise ScenarioError("fl.proximal_mu", "fedprox needs a proximal term: set fl.proximal_mu > 0")
        if fl.proximal_mu and fl.algorithm != "fedprox":
            raise ScenarioError("fl.proximal_mu", f"the proximal term is fedprox's; fl.algorithm is {fl.algorithm}")
        if fl.algorithm in ASYNCHRONOUS and fl.downlink_codec != "fp32":
            raise ScenarioError("fl.downlink_codec", f"{fl.algorithm} sends each client the whole model it is to "
                                                     "train from (clients hold different versions): use fp32")
        if fl.algorithm in (*SECOND_MOMENTS, "fedasync") and fl.server_lr != 1.0:
            raise ScenarioError("fl.server_lr", f"{fl.algorithm} steps by its own keys; fl.server_lr is the step "
                                                "of fedavg, fedprox, feddrop, tifl, asgd and dcasgd")
        defaults = type(fl)()
        for key, rule in RULE_KEYS.items():
            if getattr(fl, key) != getattr(defaults, key) and fl.algorithm != rule:
                raise ScenarioError(f"fl.{key}", f"is {rule}'s; fl.algorithm is {fl.algorithm}")
        if fl.algorithm == "feddrop" and not 0 < fl.feddrop.k_hat < fl.asked_per_round:
            raise ScenarioError("fl.feddrop.k_hat", f"feddrop drops 1 to {fl.asked_per_round - 1} of the "
                                                    f"{fl.asked_per_round} clients a round asks, got {fl.feddrop.k_hat}")
        if fl.algorithm == "tifl":
            t = fl.tifl
            check_tiers(("fl.tifl.tiers", "fl.tifl.tier_probs", "fl.tifl.credits"), t.tiers, t.tier_probs,
                        t.credits, fl.clients, "clients")
            if (smallest := min(fl.asked_per_round, fl.clients // t.tiers)) < fl.min_clients:
                raise ScenarioError("fl.tifl.tiers", f"a round asks one tier, and the smallest of {t.tiers} tiers of "
                                                     f"{fl.clients} clients gives {smallest}, fewer than "
                                                     f"fl.min_clients ({fl.min_clients}): its rounds would all fail")

    def takes_corrupt(self, s, node):
        return node not in (CONTROLLER, SS)

    def role_of(self, s, rank, work, population=None, residuals=None):
        client = load("dtemu.core.fl.client:client")
        controller = load("dtemu.core.fl.controller:controller")
        state_server = load("dtemu.core.esync.state_server:state_server")
        from dtemu.core.wire.topics import CLIENT_UPDATE, MODEL_BLOB, SS_REPLY, SS_STATE, TRAIN_CMD

        # esync: the state server's topics too (core.fl.esync)
        asks = s.fl.algorithm in STATE_SERVER
        state, reply = ((SS_STATE,), (SS_REPLY,)) if asks else ((), ())
        if rank == 0:  # (names without the list of every node: once per rank is quadratic at 10,000)
            return RoleSpec(rank, CONTROLLER, (CLIENT_UPDATE,), (TRAIN_CMD, MODEL_BLOB) + state,
                            lambda ctx, init: controller(ctx, s, work, init, population))
        if rank > s.fl.clients:
            return RoleSpec(rank, SS, state, reply,
                            lambda ctx, init: state_server(ctx, s.node_names, list(range(1, rank)), leader=CONTROLLER))
        return RoleSpec(rank, f"client{rank}", (TRAIN_CMD, MODEL_BLOB) + reply, (CLIENT_UPDATE,) + state,
                        lambda ctx, init: client(ctx, s, work, rank, residuals))

    def readers_of(self, s):
        """With a state server, who reads what (without, every peer reads every topic it is sent)."""
        if s.fl.algorithm not in STATE_SERVER:
            return None
        from dtemu.core.wire.topics import CLIENT_UPDATE, MODEL_BLOB, SS_REPLY, SS_STATE, TRAIN_CMD

        clients = frozenset(s.client_names)
        return {TRAIN_CMD: clients, MODEL_BLOB: clients, SS_REPLY: clients, CLIENT_UPDATE: frozenset({CONTROLLER}),
                SS_STATE: frozenset({SS})}

    def writers_of(self, s):
        """The controller writes commands and models, the clients updates (and with a state server,
        both ask it, and it answers)."""
        from dtemu.core.wire.topics import CLIENT_UPDATE, MODEL_BLOB, SS_REPLY, SS_STATE, TRAIN_CMD

        clients, leader = frozenset(s.client_names), frozenset({CONTROLLER})
        out = {TRAIN_CMD: leader, MODEL_BLOB: leader, CLIENT_UPDATE: clients}
        if s.fl.algorithm in STATE_SERVER:
            out.update({SS_STATE: clients | leader, SS_REPLY: frozenset({SS})})
        return out

    def record(self, s, name, result, time_to_accuracy):
        from dtemu.core.ml.params import sha256_of

        if name == SS:
            return load("dtemu.core.esync.summary:state_server_record")(result)
        if name != CONTROLLER:
            return {"model_round": result}
        return dict(final_accuracy=result.final_accuracy, rounds=result.rounds_completed,
                    time_to_accuracy=time_to_accuracy(result.history),
                    rounds_failed=result.rounds_failed, stop_reason=result.stop_reason,
                    updates=dict(sorted(result.counts.items())), model_sha256=sha256_of(result.weights))

    def summary(self, s, records, time_to_accuracy, time_s):
        state_server_summary = load("dtemu.core.esync.summary:state_server_summary")

        lead = records[0] if records else {}
        return {"codec": s.fl.codec, "final_accuracy": lead.get("final_accuracy"),
                "time_to_accuracy": lead.get("time_to_accuracy") or time_to_accuracy([]),
                "rounds": lead.get("rounds", 0), "rounds_failed": lead.get("rounds_failed", 0),
                "stop_reason": lead.get("stop_reason", "the controller left no record"),
                "updates": lead.get("updates", {}), "model_sha256": lead.get("model_sha256"),
                **({"state_server": state_server_summary(records[-1])} if s.fl.algorithm in STATE_SERVER else {})}
