"""ESync's state server (core.esync, the node fl.algorithm esync brings): its messages, Algorithm 1's
rule over its table, and the role refusing bad input while it keeps answering.  (Whole ESync runs:
tests/test_fl_esync.py; the old ps form of a scenario: tests/test_ps_form.py.)"""

import math

import pytest

from dtemu.core.errors import StateMessageError
from dtemu.core.esync import state_messages as sm
from dtemu.core.esync.state_server import state_server
from dtemu.core.esync.state_table import StateTable
from dtemu.core.runtime.requests import Message, RecordingContext, Recv, Send


# --- wire format -------------------------------------------------------------------


def test_state_message_round_trip_and_refusals():
    st = sm.Status(3, 7, 2, 0.0025, 0.0004, 12.5)
    msg = sm.StateMsg(sm.QUERY, 3, 1, st)
    data = sm.encode_state(msg)
    assert len(data) == sm.STATE_SIZE and sm.decode_state(data) == msg
    reply = sm.StateMsg(sm.RESPONSE, 1, 3, st, sm.SYNC)
    assert sm.decode_state(sm.encode_state(reply)).action == sm.SYNC
    bad = {
        "size": data[:-1],
        "magic": b"XXXX" + data[4:],
        "type": data[:5] + bytes([9]) + data[6:],
        "action": sm.encode_state(sm.StateMsg(sm.QUERY, 3, 1, st, sm.TRAIN)),  # an action on a QUERY
        "status": sm.encode_state(sm.StateMsg(sm.QUERY, 3, 1, sm.Status(3, 1, 0, math.nan, 0.0, 1.0))),
    }
    for reason, raw in bad.items():
        with pytest.raises(StateMessageError) as err:
            sm.decode_state(raw)
        assert err.value.reason == reason
    negative = sm.encode_state(sm.StateMsg(sm.REPORT, 3, 1, sm.Status(3, 0, 0, 0.1, -1.0, 1.0)))
    with pytest.raises(StateMessageError):
        sm.decode_state(negative)


# --- Algorithm 1 -----------------------------------------------------------------


def test_query_rule_lets_fast_clients_train_until_the_straggler_is_due():
    table = StateTable([2, 3])
    table.report(sm.Status(3, 0, 0, 1.0, 0.1, 0.0))  # the straggler: d = 1.1, due at 1.1
    table.report(sm.Status(2, 0, 0, 0.1, 0.1, 0.0))
    assert table.query(sm.Status(2, 0, 0, 0.1, 0.1, 0.0), now=0.0) == sm.TRAIN  # i = 0
    assert table.query(sm.Status(2, 4, 0, 0.1, 0.1, 0.4), now=0.4) == sm.TRAIN  # 0.4 + 0.2 <= 1.1
    assert table.query(sm.Status(2, 5, 0, 0.1, 0.1, 0.95), now=0.95) == sm.SYNC  # 0.95 + 0.2 > 1.1
    assert table.query(sm.Status(3, 1, 0, 1.0, 0.1, 1.0), now=1.0) == sm.SYNC  # the straggler itself
    # A client already in the next round trains while the straggler is behind.
    table.report(sm.Status(2, 0, 1, 0.1, 0.1, 1.2))
    assert table.query(sm.Status(2, 3, 1, 0.1, 0.1, 1.5), now=1.5) == sm.TRAIN


def test_a_straggler_the_controller_declared_gone_no_longer_holds_the_others():
    table = StateTable([2, 3, 4])
    table.report(sm.Status(4, 0, 0, 5.0, 0.1, 0.0))  # crashed for good; its record stays
    table.report(sm.Status(2, 0, 1, 0.1, 0.1, 0.0))
    table.report(sm.Status(3, 0, 1, 0.2, 0.1, 0.0))
    assert table.query(sm.Status(2, 2, 1, 0.1, 0.1, 0.2), now=0.2) == sm.TRAIN  # r_k > r_s: forever, unless...
    table.leave(4)
    assert table.straggler()[0] == 3
    assert table.query(sm.Status(2, 3, 1, 0.1, 0.1, 0.3), now=0.3) == sm.SYNC  # 0.3 + 0.2 > 0.0 + 0.3



def test_the_straggler_is_the_max_of_d_over_live_records_ties_to_the_lowest_rank():
    """straggler() (a heap, kept as records change) is max((d, -k)) over the live records, or over
    all of them when none is live, on random tables with ties, through every way a record changes
    (report, query, leave, reset), long enough for the heap to be built again."""
    import random

    rng = random.Random(3)
    for _ in range(300):
        ranks = rng.sample(range(2, 30), rng.randint(1, 12))
        table = StateTable(ranks)
        for step in range(rng.randint(1, 200)):
            k, how = rng.choice(ranks), rng.random()
            st = sm.Status(k, rng.randint(0, 3), rng.randint(0, 2), rng.choice([0.0, 0.002, rng.random()]),
                           rng.choice([0.0, 0.0005]), float(step))
            if how < 0.3:
                table.report(st)
            elif how < 0.6:
                table.query(st, now=float(step))
            elif how < 0.9:
                table.leave(k)
            else:
                table.reset(k, rng.randint(0, 2), float(step))
            pool = [(k, r) for k, r in table.records.items() if r.live] or list(table.records.items())
            want = max(pool, key=lambda kv: (kv[1].c + kv[1].m, -kv[0]))
            got = table.straggler()
            assert got[0] == want[0] and got[1] is want[1]

def drive(role, inbox):
    """Run a role generator against a list of messages; returns what it sent and its result."""
    sent, value = [], None
    try:
        req = next(role)
        while True:
            if isinstance(req, Recv):
                req = role.send(inbox.pop(0) if inbox else Message("ps/state", "controller", sm.encode_state(
                    sm.StateMsg(sm.STOP, 0, 1, sm.Status(0, 0, 0, 0.0, 0.0, 0.0)))))
            elif isinstance(req, Send):
                sent.append(req)
                req = role.send(1)
            else:
                req = role.send(None)
    except StopIteration as stop:
        value = stop.value
    return sent, value


def test_state_server_refuses_bad_input_and_keeps_answering():
    names = ["controller", "client1", "client2", "ss"]   # FL's ranks: the state server after the clients

    def from_(src, kind, k, i=1, r=0, c=0.01, m=0.001, sender=None):
        st = sm.Status(k, i, r, c, m, 1.0)
        data = sm.encode_state(sm.StateMsg(kind, names.index(src) if sender is None else sender, 3, st))
        return Message("ps/state", src, data, received_at=1.0)

    inbox = [
        from_("controller", sm.RESET, 0, r=0),
        from_("client1", sm.QUERY, 7),  # an unknown rank
        from_("client1", sm.QUERY, 2),  # client1 speaking for client2
        from_("client1", sm.QUERY, 1, sender=2),  # claims another sender
        from_("client2", sm.REPORT, 2, i=0, r=5),  # a round the controller has not begun
        from_("client1", sm.RESET, 1),  # only the controller resets
        Message("ps/state", "client1", b"\x00" * 10),
        Message("ps/state", "client1", sm.encode_state(sm.StateMsg(sm.QUERY, 1, 3, sm.Status(1, 1, 0, 0.1, 0.1, 1.0)))[:4]
                + b"\xff" * (sm.STATE_SIZE - 4)),
        from_("client1", sm.QUERY, 1),  # a good one: answered
    ]
    ctx = RecordingContext(node="ss")
    sent, result = drive(state_server(ctx, names, [1, 2]), inbox)
    assert result.queries == 1 and len(sent) == 1 and sent[0].to == "client1"
    assert sm.decode_state(sent[0].data).msg_type == sm.RESPONSE
    assert dict(result.rejected) == {"unknown_rank": 2, "sender": 1, "future_round": 1, "not_leader": 1,
                                     "size": 1, "version": 1}
    assert ctx.bytes_rejected > 0 and result.stopped
