"""ESync's state table and its query rule (Algorithm 1), as plain logic.

One record per client: (i, r, c, m, t, action) and whether it is *live* (taken into
the straggler search).  ``query`` updates the querying worker's record with its
status, finds the straggler s = argmax_k (c_k + m_k) among the live records and
answers:

- TRAIN if i_k = 0 (nothing to synchronise yet) or r_k > r_s (k is already in a
  round the straggler has not reached);
- SYNC if k is the straggler, or the straggler has done its one iteration
  (i_s = 1), or it was told to SYNC already, or one more iteration of k would end
  after the straggler's update is due (now + d_k > t_s + d_s); the SYNC is recorded;
- TRAIN otherwise.

A client the controller declared gone (``leave``: it missed a round's
deadline) is not live until it reports again, so a crashed straggler cannot hold
the others' rounds open.  Ties in d go to the lowest rank, so the answer does not
depend on the order records were made.

The straggler is asked for at every query, so the live records are kept in a heap by (-d, k)
as well: a changed record is pushed again and its old entry, stale, is dropped when it
surfaces.  A query costs O(log n), not a pass over every record (2000 clients of which a
round's 100 are live: 0.6 ms a query as a pass).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from dtemu.core.esync.state_messages import SYNC, TRAIN, Status


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
        self.records: dict[int, Record] = {}
        self._heap: list[tuple[float, int, int]] = []   # (-d, k, stamp) of live records
        self._stamp: dict[int, int] = {}                # k -> the stamp of its current entry
        self._stamps = 0
        for k in ranks:
            self._put(k, Record())

    def _put(self, k: int, rec: Record) -> None:
        self.records[k] = rec
        self._touched(k)

    def _touched(self, k: int) -> None:
        """Record k's d or liveness changed: its entry is made again (the old one is stale)."""
        self._stamps += 1
        self._stamp[k] = self._stamps
        rec = self.records[k]
        if rec.live:
            heapq.heappush(self._heap, (-rec.d, k, self._stamps))
        if len(self._heap) > 4 * len(self.records) + 64:   # mostly stale: build it again
            self._heap = [(-r.d, j, self._stamp[j]) for j, r in self.records.items() if r.live]
            heapq.heapify(self._heap)

    def known(self, k: int) -> bool:
        return k in self.records

    def reset(self, k: int, round_: int, now: float) -> None:
        """PS: worker k starts afresh at ``round_`` (its times are learnt again)."""
        self._put(k, Record(r=round_, t=now))

    def report(self, st: Status) -> None:
        """Worker k entered round r_k (i_k = 0): its record, live again, its action reset."""
        self._put(st.k, Record(i=st.i, r=st.r, c=st.c, m=st.m, t=st.t, action=TRAIN, live=True))

    def leave(self, k: int) -> None:
        self.records[k].live = False
        self._touched(k)

    def straggler(self) -> tuple[int, Record]:
        """max over the live records (all if none is) of (d, -k)."""
        heap = self._heap
        while heap:
            _, k, stamp = heap[0]
            if self._stamp[k] == stamp:   # current, hence live
                return k, self.records[k]
            heapq.heappop(heap)
        if not self.records:
            raise ValueError("a state table without records")  # as max() of nothing would
        k = max(self.records, key=lambda j: (self.records[j].d, -j))   # none is live
        return k, self.records[k]

    def query(self, st: Status, now: float) -> int:
        rec = self.records[st.k]
        rec.i, rec.c, rec.m, rec.t = st.i, st.c, st.m, st.t
        if st.r > rec.r:  # a REPORT that was lost: the query says which round k is in
            rec.r, rec.action = st.r, TRAIN
        rec.live = True
        self._touched(st.k)
        s, srec = self.straggler()
        if st.i == 0 or st.r > srec.r:
            return TRAIN
        if s == st.k or srec.i == 1 or srec.action == SYNC or now + rec.d > srec.t + srec.d:
            rec.action = SYNC
            return SYNC
        return TRAIN
