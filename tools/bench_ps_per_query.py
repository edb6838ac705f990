"""The Python work of one state-server query, without DDS: micro-benchmarks of its pieces.

    python -m tools.bench_ps_per_query [--queries 50000] [--table 2000 --live 100]

- the state server's role under the real driver (``real.node.real_driver``) with a stand-in
  transport that hands it ready QUERYs from 12 workers and drops its answers: the role,
  Algorithm 1, the state messages' decoding and encoding, the driver (CPU per query);
- a frame's encoding and decoding (``real.wire``), a state message's decoding, Algorithm 1's
  straggler search, each alone (µs per call);
- Algorithm 1's query on a table of ``--table`` records of which ``--live`` are live (FL's ESync:
  every client has a record, a round's sample is live), the queries going round the live ones.

To compare with older code, run it with that code first on ``PYTHONPATH`` (a ``git archive``
of the commit as a ``dtemu`` package); docs/notebook/2026-11-23-09-esync-issue-10.md, "The state server's answer time".
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import timeit
from collections import deque

from dtemu.core.esync import state_messages as sm
from dtemu.core.wire.topics import SS_REPLY, SS_STATE

WORKERS = 12


class _Clock:
    """A clock with no error and no peers to measure (real.clock_sync's interface, in part)."""

    def wall_ns(self) -> int:
        return time.time_ns()

    def wait(self, peers, timeout_s: float) -> list:
        return []

    def local_time(self, peer: str, peer_ns: int) -> float:
        return peer_ns / 1e9


class _Inbox:
    """A transport that has ``n`` QUERYs (then the parameter server's STOP) ready and drops what is sent."""

    frame_bytes = 1 << 20
    on_reject = None
    clock = _Clock()

    def __init__(self, n: int):
        from dtemu.real.reassembly import Message

        self.q = deque()
        for i in range(n):
            k = 2 + i % WORKERS
            data = sm.encode_state(sm.StateMsg(sm.QUERY, k, 1, sm.Status(k, 1 + i, 0, 0.002, 0.0005, 1.0)))
            self.q.append(Message(SS_STATE, f"worker{k - 1}", data, 1.0, time.monotonic()))
        stop = sm.encode_state(sm.StateMsg(sm.STOP, 0, 1, sm.Status(0, 0, 0, 0.0, 0.0, 0.0)))
        self.q.append(Message(SS_STATE, "ps", stop, 1.0, 1.0))
        self.sent = 0

    def recv(self, topics, timeout_s=None):
        return self.q.popleft()

    def send(self, topic, data, to=None, **kw):
        self.sent += 1

    def matched_count(self, topic):
        return 1


def role_us_per_query(n: int) -> float:
    from dtemu.core.esync.state_server import state_server
    from dtemu.core.runtime.driver import run_blocking
    from dtemu.host.rundir import RunDir
    from dtemu.real.node import real_driver

    names = ["ps", "ss"] + [f"worker{k}" for k in range(1, WORKERS + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir(tmp)
        inbox = _Inbox(n)
        driver = real_driver("ss", inbox, run, publishes=[SS_REPLY])
        cpu = time.process_time()
        result = run_blocking(driver.run(state_server(driver, names, list(range(2, 2 + WORKERS)), leader="ps")))
        cpu = time.process_time() - cpu
        run.close()
    if result.queries != n or inbox.sent != n:
        raise RuntimeError(f"{result.queries} queries answered, {inbox.sent} sent, of {n}")
    return 1e6 * cpu / n


def pieces_us(n: int) -> dict:
    from dtemu.core.esync.state_table import StateTable
    from dtemu.real.wire import Frame, decode_frame, encode_frame

    data = sm.encode_state(sm.StateMsg(sm.QUERY, 3, 1, sm.Status(3, 5, 0, 0.002, 0.0005, 7.0)))
    f = Frame(src="worker2", dst="ss", topic=SS_STATE, msg_id=123456789, part=0, parts=1, total=len(data),
              payload=data)
    ser = encode_frame(f, pad4=True)
    table = StateTable(range(2, 2 + WORKERS))
    for k in range(2, 2 + WORKERS):
        table.report(sm.Status(k, 1, 0, 0.002 + k * 1e-4, 0.0005, 1.0))
    per = lambda fn: round(1e6 * timeit.timeit(fn, number=n) / n, 2)  # noqa: E731
    return {"encode_frame": per(lambda: encode_frame(f, pad4=True)),
            "decode_frame": per(lambda: decode_frame(ser, copy=False)),
            "decode_state": per(lambda: sm.decode_state(data)),
            "straggler": per(table.straggler)}


def query_at_scale_us(records: int, live: int, n: int) -> float:
    from dtemu.core.esync.state_table import StateTable

    table = StateTable(range(records))
    for k in range(live, records):
        table.leave(k)
    for k in range(live):
        table.report(sm.Status(k, 0, 1, 0.002 + k * 1e-5, 0.0005, 1.0))
    queries = [sm.Status(k, 1 + q // live, 1, 0.002 + k * 1e-5, 0.0005, 1.0 + q * 1e-3)
               for q, k in enumerate(list(range(live)) * (n // live + 1))][:n]
    start = time.perf_counter()
    for st in queries:
        table.query(st, now=st.t)
    return 1e6 * (time.perf_counter() - start) / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queries", type=int, default=50000)
    p.add_argument("--table", type=int, default=2000, help="records in the table of the query at scale")
    p.add_argument("--live", type=int, default=100, help="of them live (a round's sample)")
    args = p.parse_args()
    role = role_us_per_query(args.queries)
    parts = pieces_us(min(args.queries, 20000))
    print(f"state server's role under the real driver, no DDS: {role:.1f} us of CPU per query "
          f"({args.queries} queries, {WORKERS} workers)")
    print("  per call, us: " + ", ".join(f"{k} {v}" for k, v in parts.items()))
    at_scale = query_at_scale_us(args.table, args.live, min(args.queries, 20000))
    print(f"  a query on a table of {args.table} records, {args.live} live: {at_scale:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
