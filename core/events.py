"""Every kind of event a run logs, with its fields: declared once, here.

An event is one line of ``events.jsonl``: ``t`` (seconds on the runtime's
clock), ``node``, ``kind``, then the fields of its kind.  Writers (roles,
the driver, the runtimes' lifecycle) name a kind by its constant below;
readers (the report, the audit, the dashboard) compare against the same
constants, so renaming an event is one edit and a typo is a NameError.

A kind is a ``str`` (it is written and compared as its name) that also knows
its fields: ``required`` are always present, ``optional`` may be.  ``check``
says what is wrong with an event; the tests run it over whole runs.
"""

from __future__ import annotations

from typing import Iterable


class EventKind(str):
    """An event's name, with the fields it carries."""

    required: frozenset[str]
    optional: frozenset[str]
    doc: str
    limit: int | None  # events per second per origin (core.runtime.limits); None: not limited

    def __new__(cls, name: str, required: str = "", optional: str = "", doc: str = "",
                limit: int | None = None) -> "EventKind":
        kind = super().__new__(cls, name)
        kind.required = frozenset(required.split())
        kind.optional = frozenset(optional.split())
        kind.doc = doc
        kind.limit = limit
        return kind


KINDS: dict[str, EventKind] = {}


# Budgets of the kinds whose number an outsider decides (one per message it sends): generous for
# deliveries (a data-parallel worker takes tens of frames a second from each peer), tight for refusals.
DELIVERIES_PER_S = 100
REFUSALS_PER_S = 20


def _kind(name: str, required: str = "", optional: str = "", doc: str = "", limit: int | None = None) -> EventKind:
    kind = EventKind(name, required, optional, doc, limit)
    KINDS[name] = kind
    return kind


# --- a node's life (the runtimes) ------------------------------------------------
NODE_STARTING = _kind("node_starting", doc="real launch started the rank's process (it is loading, not yet up)")
NODE_UP = _kind("node_up", doc="the node (re)started")
NODE_DOWN = _kind("node_down", doc="the node crashed, was switched off or killed")
EXECUTOR_RESTART = _kind("executor_restart", "rerun restarts reason",
                         doc="emu --jobs: a worker process died; a new pool runs the rerun jobs it owed again "
                             "(the machine, not the scenario: results are unchanged)")
DELIVER = _kind("deliver", "src topic bytes sent_at comm_s", doc="a message reached the node's role",
                limit=DELIVERIES_PER_S)
DROPOUT = _kind("dropout", "round", doc="the client sits out this round (faults.dropout_p)")
FAULT = _kind("fault", "fault",
              "at round src topic bytes corruption nodes",
              doc="a fault of the scenario was carried out (fault: crash, corrupt, message_lost, "
                  "partition, duplicate, partition_start, partition_end, killed)")
FRAME_REJECTED = _kind("frame_rejected", "", "src error layer reason detail",
                       doc="a frame or control message that could not be used", limit=REFUSALS_PER_S)
FRAME_REJECTED_SUMMARY = _kind("frame_rejected_summary", "layer reason suppressed", "window_s total",
                               doc="how many frame_rejected events the transport's rate limit held back")
EVENTS_SUPPRESSED = _kind("events_suppressed", "of origin suppressed",
                          doc="how many events of one kind and origin a rate limit held back (core.runtime.limits)")

# --- federated learning: the controller ------------------------------------------
RUN_START = _kind("run_start", "clients rounds first_round dim", "authenticated")
RESUME = _kind("resume", "round model_sha256", doc="the controller resumed from a checkpoint")
BARRIER = _kind("barrier", "matched", "missing waited_s", doc="every expected peer is there (or enough)")
ROUND_START = _kind("round_start", "round attempt")
SAMPLED = _kind("sampled", "round attempt available asked clients",
                doc="the clients a round asks (fl.sample, fl.availability): how many were available, "
                    "how many and which were asked")
UPDATE_ACCEPTED = _kind("update_accepted", "client round bytes num_samples sent_at comm_s", "staleness")
UPDATE_LATE = _kind("update_late", "client round current", limit=REFUSALS_PER_S)
UPDATE_REJECTED = _kind("update_rejected", "reason", "src client round error", limit=REFUSALS_PER_S)
ROUND_CLOSE = _kind("round_close", "round ready expected min clients timed_out note", "ended")
AGGREGATED = _kind("aggregated", "round model_sha256")
MODEL_SENT = _kind("model_sent", "round codec bytes base full_to",
                   doc="fl.downlink_codec: the model went down as a delta on round base's (bytes each); "
                       "full_to clients that may not hold that got the full model first")
ROUND_FAILED = _kind("round_failed", "round ready min policy")
CHECKPOINT = _kind("checkpoint", "round path")
EVAL = _kind("eval", "accuracy", "round epoch step loss",
             doc="test accuracy (FL: after a round or an update; DDP: an epoch; geo: a round)")
RUN_END = _kind("run_end", "reason rounds_completed rounds_failed model_sha256 counts")
# real launch --machines: the fidelity monitors' verdict changed (real.monitors; the dashboard's, not a rank's)
TESTBED = _kind("testbed", "faithful why")

# --- federated learning: a client ------------------------------------------------
TRAIN_START = _kind("train_start", "round samples")
UPLOAD_START = _kind("upload_start", "round bytes", "steps loss")
UPLOAD_DONE = _kind("upload_done", "round bytes")
UPDATE_RESENT = _kind("update_resent", "round bytes", doc="the same command again: the answer was lost")
UPDATE_NOT_FINITE = _kind("update_not_finite", "round",
                          doc="training diverged; no update is sent")
TRAIN_FAILED = _kind("train_failed", "round error",
                     doc="the training raised (the task's or the model's own code): no update this round; "
                         "the node goes on")
CMD_SKIPPED = _kind("cmd_skipped", "round", "newer model_round iterations",
                    doc="a command overtaken by a newer one or by its round's model (iterations: ESync's "
                        "training stopped after that many, its update not sent)")
MESSAGE_REJECTED = _kind("message_rejected", "topic src reason", "error", limit=REFUSALS_PER_S)
CLIENT_STOP = _kind("client_stop", "round reason", "rejected")

# --- data-parallel training: a worker --------------------------------------------
WORKER_START = _kind("worker_start", "rank world dim steps_per_epoch compression")
BARRIER_FAILED = _kind("barrier_failed", "missing error")
STEP = _kind("step", "step epoch loss density bytes_sent bytes_received compute_s compress_s send_s wait_s comm_s")
WINDOW = _kind("window", "epoch steps first_step",
               " ".join(f"{k}_{s}" for k in ("bytes_sent", "bytes_received", "compute_s", "compress_s",
                                             "send_s", "wait_s", "comm_s") for s in ("mean", "max")))
WORKER_LOST = _kind("worker_lost", "ranks step waiting_for generation action")
MEMBERSHIP = _kind("membership", "generation members step leader", "excluded")
WORKER_END = _kind("worker_end", "steps model_sha256 bytes_sent bytes_received counts",
                   "stop_reason lost_ranks members generation")

# --- geo-distributed training (core.geo) -------------------------------------------
GEO_START = _kind("geo_start", "role site dim", "architecture compression authenticated")
GEO_STEP = _kind("geo_step", "round loss compute_s comm_s bytes_sent",
                 doc="a worker's round: compute, then push to pull (comm_s)")
GEO_ROUND = _kind("geo_round", "round role wait_s wan_s bytes_up bytes_down",
                  doc="a PS closed a round: waited wait_s for its pushes, then wan_s for the level above "
                      "(global/flat PS: for sending down)")
GEO_LOST = _kind("geo_lost", "round missing reason", doc="a geo role gave up waiting for these nodes")
GEO_JOIN = _kind("geo_join", "round site ps",
                 doc="a site joined a running geo run: it got the global model of this round and counts from the next")
GEO_REJOIN = _kind("geo_rejoin", "round waited",
                   doc="a worker whose local PS started again took the model of `round` it forwarded (a STATE) "
                       "in place of the pull of `waited`, and goes on from the next round")
GEO_END = _kind("geo_end", "role rounds wan_sent wan_received rejected", "model_sha256 stop_reason")

# --- Flower apps (core.flower): the server's grid and the clients' ClientApp calls ----
FLOWER_SENT = _kind("flower_sent", "round type asked bytes", "unavailable",
                    doc="the ServerApp's grid sent instructions of one round and message type to `asked` "
                        "clients (unavailable: not sent, the client being offline under fl.availability)")
FLOWER_REPLIES = _kind("flower_replies", "round type asked replies errors timed_out", "ended",
                       doc="a grid call closed: `replies` answers (errors of them the ClientApp's failures) "
                           "to `asked` instructions; `ended`: all_in (every one answered and was taken), "
                           "refused (every one answered, some refused: flower.check_arrays, forged, ...) "
                           "or timed_out (its deadline passed with answers missing: then timed_out is true)")
CLIENT_APP_FAILED = _kind("client_app_failed", "round type error", "hung",
                          doc="the ClientApp raised, returned no reply to its message, or hung past "
                              "flower.call_limit_s: the client answers an error (hung: nothing)")
SERVER_APP_FAILED = _kind("server_app_failed", "error traceback",
                          doc="the ServerApp raised: the run ends, with its traceback here")
SERVER_APP = _kind("server_app", "call nbytes wall_s", "cpu_s",
                   doc="the ServerApp made a grid call (send_and_receive, push_messages, pull_messages) after "
                       "wall_s of its own work since the last, cpu_s of its thread's CPU (measured: the fields "
                       "that differ run to run), "
                       "on the nbytes of arrays "
                       "it handled: the replies it was last given and what it sends; emu charges "
                       "compute.app_s_per_mb per MB of them")
FLOWER_CALL = _kind("flower_call", "round type examples wall_s", "cpu_s",
                    doc="a ClientApp call returned: the examples its reply reports, the wall time it took "
                        "and its thread's CPU seconds (what `emu calibrate` prices a Flower app's calls by)")

# --- ESync's state server (fl.algorithm esync, core/esync) ----------------------------
SS_END = _kind("ss_end", "queries answers rejected", doc="the state server stopped: queries answered, refusals")

BASE_FIELDS = frozenset({"t", "node", "kind"})


def check(event: dict) -> str | None:
    """What is wrong with ``event`` (None: nothing): an unknown kind, a missing or unknown field."""
    kind = KINDS.get(event.get("kind"))
    if kind is None:
        return f"unknown event kind {event.get('kind')!r}"
    fields = set(event) - BASE_FIELDS
    missing = kind.required - fields
    extra = fields - kind.required - kind.optional
    if missing:
        return f"{kind}: missing {', '.join(sorted(missing))}"
    if extra:
        return f"{kind}: undeclared {', '.join(sorted(extra))}"
    return None


def problems(events: Iterable[dict]) -> list[str]:
    """``check`` over many events; each distinct problem once."""
    seen: dict[str, None] = {}
    for e in events:
        why = check(e)
        if why is not None:
            seen.setdefault(why)
    return list(seen)
