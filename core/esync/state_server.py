"""ESync's state server (the node ``ss`` that fl.algorithm esync brings): a state table, answered one
message at a time.

It reads ``ps/state``: RESET and LEAVE and STOP from the controller, REPORT and QUERY from the
clients, and answers each QUERY with a RESPONSE (TRAIN or SYNC) on ``ps/state_reply`` to the sender
alone.  Every message is untrusted: one that does not decode, claims another sender than the node
it came from, comes from a rank that is not a client (or, for RESET / LEAVE / STOP, not the
controller), or reports a round beyond the one the controller has begun (+1, the race between its
RESET and the first REPORT) is refused, counted by reason, and changes nothing.  A client that
crashed simply stops querying: the others are answered from what the table holds, and once the
controller declares it gone (LEAVE) it no longer counts as the straggler.

RESET with k = the controller's rank says round r has begun; the first one, or one that goes back
(a controller restarted from a checkpoint), starts every record afresh at round r.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from dtemu.core import events as ev
from dtemu.core.errors import AuthError, StateMessageError
from dtemu.core.esync import state_messages as sm
from dtemu.core.esync.state_table import StateTable
from dtemu.core.fl.names import CONTROLLER, STATE_SERVER_NODE
from dtemu.core.runtime.requests import Recv, Send
from dtemu.core.wire.topics import SS_REPLY, SS_STATE
from dtemu.core.runtime.refusal import refuse


@dataclass
class StateServerResult:
    queries: int = 0
    answers: Counter = field(default_factory=Counter)  # TRAIN / SYNC
    rejected: Counter = field(default_factory=Counter)  # by reason
    stopped: bool = False


def state_server(ctx, node_names: list[str], worker_ranks: list[int], leader: str = CONTROLLER):
    """Runs until ``leader`` (the controller) says STOP; ``worker_ranks``: the clients' ranks."""
    rank_of = {name: rank for rank, name in enumerate(node_names)}
    leader_rank = rank_of[leader]
    table = StateTable(worker_ranks)
    leader_round: int | None = None
    out = StateServerResult()
    while True:
        msg = yield Recv((SS_STATE,))
        try:
            m = sm.decode_state(ctx.open(msg))
            sender = rank_of.get(msg.src)
            if m.sender != sender:
                raise StateMessageError("sender", f"claims rank {m.sender}, came from {msg.src!r}")
            if m.msg_type in (sm.RESET, sm.LEAVE, sm.STOP):
                if sender != leader_rank:
                    raise StateMessageError("not_leader", f"{sm.MSG_TYPES[m.msg_type]} from {msg.src!r}")
            elif m.msg_type in (sm.REPORT, sm.QUERY):
                if not table.known(m.status.k) or m.status.k != sender:
                    raise StateMessageError("unknown_rank", f"status of rank {m.status.k} from {msg.src!r}")
                if leader_round is not None and m.status.r > leader_round + 1:
                    raise StateMessageError("future_round", f"round {m.status.r}, the controller is in {leader_round}")
            else:
                raise StateMessageError("type", f"{sm.MSG_TYPES[m.msg_type]} is not for the state server")
        except (StateMessageError, AuthError) as err:  # (each says its reason)
            refuse(ctx, out.rejected, msg, err.reason, ev.MESSAGE_REJECTED, topic=msg.topic, src=msg.src,
                   reason=err.reason, error=str(err))
            continue
        st = m.status
        if m.msg_type == sm.STOP:
            out.stopped = True
            break
        if m.msg_type == sm.RESET:
            if st.k == leader_rank:
                if leader_round is None or st.r < leader_round:
                    for k in worker_ranks:
                        table.reset(k, st.r, ctx.now())
                leader_round = st.r
            elif table.known(st.k):
                table.reset(st.k, st.r, ctx.now())
            continue
        if m.msg_type == sm.LEAVE:
            if table.known(st.k):
                table.leave(st.k)
            continue
        # t_k as this server saw the status arrive: the rule compares it with this server's own clock,
        # so the ranks' clocks need not agree (real mode, several machines).
        st = sm.Status(st.k, st.i, st.r, st.c, st.m, msg.received_at)
        if m.msg_type == sm.REPORT:
            table.report(st)
        else:  # QUERY
            action = table.query(st, ctx.now())
            out.queries += 1
            out.answers[sm.ACTIONS[action]] += 1
            reply = sm.StateMsg(sm.RESPONSE, rank_of[STATE_SERVER_NODE], m.sender, m.status, action)
            yield Send(SS_REPLY, ctx.seal(SS_REPLY, st.r, sm.encode_state(reply)), to=msg.src)
    ctx.emit(ev.SS_END, queries=out.queries, answers=dict(out.answers), rejected=dict(out.rejected))
    return out
