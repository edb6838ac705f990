"""How fast ESync's state server answers over DDS on loopback, with K workers querying at once.

    python -m tools.bench_state_server [--workers 12] [--queries 300] [--domain D]

Two processes: the state server (``core.ps.state_server`` under the real driver, as
``real run`` runs it) and one process of K worker threads, each with its own DDS
participant (``worker1``..``workerK``), that start together and each send QUERYs one
after another, timing each from the send to its RESPONSE.  That round trip bounds the
state server's answer time from above (it also holds both DDS hops and, in the worker
process, K threads sharing one interpreter).  Prints the median, p90, p99 and max in
milliseconds; and, measured inside the state server, its service time per message (from
the moment it is handed a message to its next read: decode, Algorithm 1, encode, the
DDS write of the answer), with its count of queries answered.  Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from dtemu.core.ps import messages as sm
from dtemu.core.wire.topics import SS_REPLY, SS_STATE


def names(workers: int) -> list[str]:
    return ["ps", "ss"] + [f"worker{k}" for k in range(1, workers + 1)]


def timed(role, service: list):
    """Pass ``role``'s requests through, timing each message it handles: from the moment a Recv
    hands it a message to its next Recv (decode, Algorithm 1, encode, the DDS write of the answer)."""
    from dtemu.core.runtime.requests import Recv

    req, started = next(role), None
    while True:
        if isinstance(req, Recv) and started is not None:
            service.append(time.perf_counter() - started)
            started = None
        answer = yield req
        if isinstance(req, Recv) and answer is not None:
            started = time.perf_counter()
        try:
            req = role.send(answer)
        except StopIteration as stop:
            return stop.value


def serve(workers: int, domain: int, out: str) -> None:
    """The state server, until the parameter server's STOP."""
    from dtemu.core.ps.state_server import state_server
    from dtemu.core.runtime.driver import run_blocking
    from dtemu.host.rundir import RunDir
    from dtemu.real.node import real_driver
    from dtemu.real.transport import DdsTransport

    with DdsTransport("ss", profile="loopback", domain_id=domain, subscribe=[SS_STATE]) as transport:
        run = RunDir(out)
        driver = real_driver("ss", transport, run, publishes=[SS_REPLY])
        service: list[float] = []
        role = timed(state_server(driver, names(workers), list(range(2, 2 + workers))), service)
        result = run_blocking(driver.run(role))
        transport.flush(timeout_s=5.0)
        run.close()
    ms = sorted(t * 1000 for t in service)
    print(json.dumps({"queries": result.queries, "answers": dict(result.answers), "rejected": dict(result.rejected),
                      "service_ms": {"median": round(statistics.median(ms), 3),
                                     "p90": round(ms[int(0.9 * len(ms))], 3),
                                     "p99": round(ms[int(0.99 * len(ms))], 3), "max": round(ms[-1], 3)}}),
          flush=True)


def query_loop(name: str, rank: int, domain: int, queries: int, start: threading.Barrier, times: list) -> None:
    from dtemu.real.transport import DdsTransport

    with DdsTransport(name, profile="loopback", domain_id=domain, subscribe=[SS_REPLY]) as t:
        t.wait_peers(["ss"], timeout_s=60)
        t.wait_matched({SS_STATE: ["ss"]}, timeout_s=60, role="readers")
        t.wait_matched({SS_REPLY: ["ss"]}, timeout_s=60, role="writers")
        t.send(SS_STATE, sm.encode_state(sm.StateMsg(sm.REPORT, rank, 1, sm.Status(rank, 0, 0, 0.002, 0.0005, 0.0))),
               to="ss")
        start.wait(timeout=120)
        for i in range(1, queries + 1):
            st = sm.Status(rank, i, 0, 0.002, 0.0005, time.monotonic())
            sent = time.perf_counter()
            t.send(SS_STATE, sm.encode_state(sm.StateMsg(sm.QUERY, rank, 1, st)), to="ss")
            while True:
                msg = t.recv([SS_REPLY], timeout_s=10)
                if msg is None:
                    raise RuntimeError(f"{name}: no answer to query {i} in 10 s")
                reply = sm.decode_state(msg.data)
                if reply.status.i == i:
                    break
            times.append(time.perf_counter() - sent)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--queries", type=int, default=300, help="per worker")
    p.add_argument("--domain", type=int, default=200 + os.getpid() % 30)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.workers, args.domain, args.out)
        return 0
    from dtemu.real.transport import DdsTransport

    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen([sys.executable, "-m", "tools.bench_state_server", "--serve", "--workers",
                                   str(args.workers), "--domain", str(args.domain), "--out", tmp],
                                  stdout=subprocess.PIPE, text=True)
        try:
            start = threading.Barrier(args.workers)
            times: list[float] = []
            threads = [threading.Thread(target=query_loop, args=(f"worker{k}", k + 1, args.domain, args.queries,
                                                                 start, times)) for k in range(1, args.workers + 1)]
            with DdsTransport("ps", profile="loopback", domain_id=args.domain) as ps:
                for th in threads:
                    th.start()
                for th in threads:
                    th.join(timeout=600)
                ps.wait_matched({SS_STATE: ["ss"]}, timeout_s=30, role="readers")
                ps.send(SS_STATE, sm.encode_state(sm.StateMsg(sm.STOP, 0, 1, sm.Status(0, 0, 0, 0.0, 0.0, 0.0))),
                        to="ss")
                ps.flush(timeout_s=5.0)
            served = server.communicate(timeout=60)[0].strip().splitlines()
        finally:
            if server.poll() is None:
                server.kill()
    ms = sorted(t * 1000 for t in times)
    q = lambda f: ms[min(len(ms) - 1, int(f * len(ms)))]  # noqa: E731
    print(f"state server, {args.workers} workers x {args.queries} queries at once, DDS loopback: "
          f"round trip median {statistics.median(ms):.3f} ms, p90 {q(0.9):.3f}, p99 {q(0.99):.3f}, "
          f"max {ms[-1]:.3f} ({len(ms)} queries)")
    print(f"state server: {served[-1] if served else 'no record'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
