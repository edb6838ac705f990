"""ESync's state table and its query rule (Algorithm 1), as plain logic.

One record per worker: (i, r, c, m, t, action) and whether it is *live* (taken into
the straggler search).  ``query`` updates the querying worker's record with its
status, finds the straggler s = argmax_k (c_k + m_k) among the live records and
answers:

- TRAIN if i_k = 0 (nothing to synchronise yet) or r_k > r_s (k is already in a
  round the straggler has not reached);
- SYNC if k is the straggler, or the straggler has done its one iteration
  (i_s = 1), or it was told to SYNC already, or one more iteration of k would end
  after the straggler's update is due (now + d_k > t_s + d_s); the SYNC is recorded;
- TRAIN otherwise.

A worker the parameter server declared gone (``leave``: it missed a round's
deadline) is not live until it reports again, so a crashed straggler cannot hold
the others' rounds open.  Ties in d go to the lowest rank, so the answer does not
depend on the order records were made.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtemu.core.ps.messages import SYNC, TRAIN, Status


@dataclass
class Record:
    i: int = 0
    r: int = 0
    c: float = 0.0
    m: float = 0.0
    t: float = 0.0
    action: int = TRAIN
    live: bool = True

    @property
    def d(self) -> float:
        return self.c + self.m


class StateTable:
    def __init__(self, ranks):
        self.records: dict[int, Record] = {k: Record() for k in ranks}

    def known(self, k: int) -> bool:
        return k in self.records

    def reset(self, k: int, round_: int, now: float) -> None:
        """PS: worker k starts afresh at ``round_`` (its times are learnt again)."""
        self.records[k] = Record(r=round_, t=now)

    def report(self, st: Status) -> None:
        """Worker k entered round r_k (i_k = 0): its record, live again, its action reset."""
        self.records[st.k] = Record(i=st.i, r=st.r, c=st.c, m=st.m, t=st.t, action=TRAIN, live=True)

    def leave(self, k: int) -> None:
        self.records[k].live = False

    def straggler(self) -> tuple[int, Record]:
        """max over the live records (all if none is) of (d, -k), as a loop: it runs on every query."""
        best_k, best, best_d = 0, None, 0.0
        for live_only in (True, False):
            for k, rec in self.records.items():
                if live_only and not rec.live:
                    continue
                d = rec.c + rec.m
                if best is None or d > best_d or (d == best_d and k < best_k):
                    best_k, best, best_d = k, rec, d
            if best is not None:
                break
        if best is None:
            raise ValueError("a state table without records")  # as max() of nothing would
        return best_k, best

    def query(self, st: Status, now: float) -> int:
        rec = self.records[st.k]
        rec.i, rec.c, rec.m, rec.t = st.i, st.c, st.m, st.t
        if st.r > rec.r:  # a REPORT that was lost: the query says which round k is in
            rec.r, rec.action = st.r, TRAIN
        rec.live = True
        s, srec = self.straggler()
        if st.i == 0 or st.r > srec.r:
            return TRAIN
        if s == st.k or srec.i == 1 or srec.action == SYNC or now + rec.d > srec.t + srec.d:
            rec.action = SYNC
            return SYNC
        return TRAIN
