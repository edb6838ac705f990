"""How fast ESync's state server answers over DDS on loopback, with K workers querying at once.

    python -m tools.bench_state_server [--workers 12] [--procs 12] [--queries 300] [--think-ms 0]
                                       [--shared-replies] [--json FILE] [--domain D]

The state server (``core.esync.state_server`` under the real driver, as ``real run`` runs
it) in its own process, and the K workers (``worker1``..``workerK``, each its own DDS
participant) in ``--procs`` client processes (K threads of one process with
``--procs 1``; one process per worker, as in a real run, with ``--procs K``).  They start
together and each sends QUERYs one after another (``--think-ms`` apart, 0: back to
back, the worst case), timing each from the send to its RESPONSE.

Prints, in milliseconds (median, p90, p99, max), the round trip a worker sees and where
it goes, each leg timed on one side:

- ``to_ss``: QUERY written (DDS source timestamp) -> delivered by the state server's
  receive thread (DDS hop, the server's DDS and Python receive path);
- ``ss_queue``: delivered -> handed to the role (the queries ahead of it, and the
  hand-off between the receive thread and the role's thread);
- ``service``: handed to the role -> its next read (decode, Algorithm 1, encode, the DDS
  write of the answer);
- ``to_worker``: RESPONSE written -> delivered by the worker's receive thread;
- ``wake``: delivered -> the worker's thread has it.

Loopback only.
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

from dtemu.core.esync import state_messages as sm
from dtemu.core.wire.topics import SS_REPLY, SS_STATE


def names(workers: int) -> list[str]:
    return ["ps", "ss"] + [f"worker{k}" for k in range(1, workers + 1)]


def _thread_rusage() -> tuple:
    """This thread's (user s, system s, voluntary, involuntary context switches)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_THREAD)
    return (r.ru_utime, r.ru_stime, r.ru_nvcsw, r.ru_nivcsw)


def quantiles(values: list[float]) -> dict:
    ms = sorted(v * 1000 for v in values)
    if not ms:
        return {}
    q = lambda f: ms[min(len(ms) - 1, int(f * len(ms)))]  # noqa: E731
    return {"median": round(statistics.median(ms), 3), "p90": round(q(0.9), 3), "p99": round(q(0.99), 3),
            "max": round(ms[-1], 3), "n": len(ms)}


def timed(ctx, role, legs: dict):
    """Pass ``role``'s requests through, timing each message it handles: its DDS hop and the
    server's receive path (``to_ss``), its wait to be handed over (``ss_queue``), and the
    role's work on it up to its next read (``service``)."""
    from dtemu.core.runtime.requests import Recv

    req, started = next(role), None
    legs["cpu"] = []  # this process's CPU time at the first message and at the end
    while True:
        if isinstance(req, Recv) and started is not None:
            legs["service"].append(ctx.now() - started)
            started = None
        answer = yield req
        if isinstance(req, Recv) and answer is not None:
            if not legs["cpu"]:
                legs["cpu"].append(time.process_time())
                legs["role_cpu"] = [time.thread_time()]
                legs["role_rusage"] = [_thread_rusage()]
            started = ctx.now()
            if answer.sent_at:
                legs["to_ss"].append(answer.received_at - answer.sent_at)
            legs["ss_queue"].append(started - answer.received_at)
        try:
            req = role.send(answer)
        except StopIteration as stop:
            legs["cpu"].append(time.process_time())
            legs.setdefault("role_cpu", [time.thread_time()]).append(time.thread_time())
            legs.setdefault("role_rusage", [_thread_rusage()]).append(_thread_rusage())
            return stop.value


def addressed(shared: bool) -> dict:
    """Transport arguments: the default (answers on the worker's own DDS topic), or, to compare,
    answers on the shared topic that every worker reads (as before issue 10's second part)."""
    from dtemu.core.wire.topics import COLL_FRAMES

    return {"addressed": (COLL_FRAMES,)} if shared else {}


def serve(workers: int, domain: int, out: str, shared: bool) -> None:
    """The state server, until the parameter server's STOP."""
    from dtemu.core.esync.state_server import state_server
    from dtemu.core.runtime.driver import run_blocking
    from dtemu.host.rundir import RunDir
    from dtemu.real.node import real_driver
    from dtemu.real.transport import DdsTransport

    with DdsTransport("ss", profile="loopback", domain_id=domain, subscribe=[SS_STATE],
                      **addressed(shared)) as transport:
        run = RunDir(out)
        driver = real_driver("ss", transport, run, publishes=[SS_REPLY])
        legs: dict[str, list] = {"to_ss": [], "ss_queue": [], "service": []}
        role = timed(driver, state_server(driver, names(workers), list(range(2, 2 + workers)), leader="ps"), legs)
        result = run_blocking(driver.run(role))
        transport.flush(timeout_s=5.0)
        run.close()
        stats = dict(transport.stats)
    cpu, role_cpu = legs.pop("cpu"), legs.pop("role_cpu", [0.0])
    ru = legs.pop("role_rusage", [(0, 0, 0, 0)])
    role_rusage = [round(b - a, 3) for a, b in zip(ru[0], ru[-1])]
    print(json.dumps({"cpu_s": round(cpu[-1] - cpu[0], 3) if cpu else None,
                      "role_cpu_s": round(role_cpu[-1] - role_cpu[0], 3), "role_rusage": role_rusage, "queries": result.queries, "answers": dict(result.answers), "rejected": dict(result.rejected),
                      "legs": {k: quantiles(v) for k, v in legs.items()},
                      "transport": {k: stats[k] for k in ("recv_msgs", "sent_msgs", "not_for_me")}}), flush=True)


def query_loop(name: str, rank: int, domain: int, queries: int, think_s: float, shared: bool, ready,
               go: threading.Event, out: dict) -> None:
    from dtemu.real.transport import DdsTransport

    with DdsTransport(name, profile="loopback", domain_id=domain, subscribe=[SS_REPLY], **addressed(shared)) as t:
        t.wait_peers(["ss"], timeout_s=60)
        t.wait_matched({SS_STATE: ["ss"]}, timeout_s=60, role="readers")
        t.wait_matched({SS_REPLY: ["ss"]}, timeout_s=60, role="writers")
        t.send(SS_STATE, sm.encode_state(sm.StateMsg(sm.REPORT, rank, 1, sm.Status(rank, 0, 0, 0.002, 0.0005, 0.0))),
               to="ss")
        ready()
        if not go.wait(timeout=120):
            raise RuntimeError(f"{name}: never told to start")
        cpu, ru = time.thread_time(), _thread_rusage()
        for i in range(1, queries + 1):
            st = sm.Status(rank, i, 0, 0.002, 0.0005, time.monotonic())
            sent = time.monotonic()
            t.send(SS_STATE, sm.encode_state(sm.StateMsg(sm.QUERY, rank, 1, st)), to="ss")
            while True:
                msg = t.recv([SS_REPLY], timeout_s=10)
                if msg is None:
                    raise RuntimeError(f"{name}: no answer to query {i} in 10 s")
                reply = sm.decode_state(msg.data)
                if reply.status.i == i:
                    break
            got = time.monotonic()
            out["round_trip"].append(got - sent)
            if msg.sent_at:
                out["to_worker"].append(msg.received_at - msg.sent_at)
            out["wake"].append(got - msg.received_at)
            if think_s:
                time.sleep(think_s)
        out["caller_cpu_s"].append(time.thread_time() - cpu)
        out["caller_rusage"].append([b - a for a, b in zip(ru, _thread_rusage())])
        t.flush(timeout_s=5.0)
        out["not_for_me"].append(t.stats["not_for_me"])


def clients(ranks: list[int], domain: int, queries: int, think_s: float, shared: bool) -> None:
    """Workers of these ranks as threads of this process: "ready" on stdout once all are
    matched, start at a line on stdin, then their timings as JSON."""
    go = threading.Event()
    out: dict[str, list] = {"round_trip": [], "to_worker": [], "wake": [], "not_for_me": [], "caller_cpu_s": [],
                            "caller_rusage": []}
    pending = [len(ranks)]
    lock = threading.Lock()

    def ready() -> None:
        with lock:
            pending[0] -= 1
            if pending[0] == 0:
                print("ready", flush=True)

    def run(r: int) -> None:
        try:
            query_loop(f"worker{r - 1}", r, domain, queries, think_s, shared, ready, go, out)
        except BaseException:
            # a worker that cannot start or finish fails the benchmark instead of leaving it waiting
            print("failed", flush=True)
            os._exit(1)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in ranks]
    for th in threads:
        th.start()
    sys.stdin.readline()
    cpu = time.process_time()
    go.set()
    for th in threads:
        th.join(timeout=600)
    out["cpu_s"] = [time.process_time() - cpu]
    print(json.dumps(out), flush=True)


def _spawn(args: list[str], cpus: set[int] | None = None, **kw) -> subprocess.Popen:
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    return subprocess.Popen([sys.executable, "-m", "tools.bench_state_server", *args], text=True, preexec_fn=pin,
                            **kw)


def _cpus(text: str | None) -> set[int] | None:
    return {int(c) for c in text.split(",")} if text else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--procs", type=int, default=None, help="client processes (default: one per worker)")
    p.add_argument("--queries", type=int, default=300, help="per worker")
    p.add_argument("--think-ms", type=float, default=0.0, help="pause between an answer and the next query")
    p.add_argument("--domain", type=int, default=200 + os.getpid() % 30)
    p.add_argument("--shared-replies", action="store_true",
                   help="answers on the topic every worker reads (as before; to compare)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--ss-cpus", default=None, help="the state server's cores, e.g. 1 (default: all)")
    p.add_argument("--worker-cpus", default=None, help="the workers' cores, e.g. 0 (default: all)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--clients", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.workers, args.domain, args.out, args.shared_replies)
        return 0
    if args.clients is not None:
        clients([int(r) for r in args.clients.split(",")], args.domain, args.queries, args.think_ms / 1000,
                args.shared_replies)
        return 0
    from dtemu.real.transport import DdsTransport

    procs = max(1, min(args.procs or args.workers, args.workers))
    ranks = list(range(2, 2 + args.workers))
    groups = [ranks[i::procs] for i in range(procs)]
    common = ["--workers", str(args.workers), "--domain", str(args.domain), "--queries", str(args.queries),
              "--think-ms", str(args.think_ms)] + (["--shared-replies"] if args.shared_replies else [])
    children: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = _spawn(["--serve", *common, "--out", tmp], _cpus(args.ss_cpus), stdout=subprocess.PIPE)
        children.append(server)
        try:
            workers = [_spawn(["--clients", ",".join(map(str, g)), *common], _cpus(args.worker_cpus),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE) for g in groups]
            children += workers
            for w in workers:  # every worker matched with the state server, then all start at once
                if w.stdout.readline().strip() != "ready":
                    raise RuntimeError("a client process failed to start")
            for w in workers:
                w.stdin.write("go\n")
                w.stdin.flush()
            timings: dict[str, list] = {"round_trip": [], "to_worker": [], "wake": [], "not_for_me": [],
                                        "cpu_s": [], "caller_cpu_s": [], "caller_rusage": []}
            for w in workers:
                for k, v in json.loads(w.stdout.readline()).items():
                    timings[k] += v
                w.wait(timeout=60)
            with DdsTransport("ps", profile="loopback", domain_id=args.domain) as ps:
                ps.wait_matched({SS_STATE: ["ss"]}, timeout_s=30, role="readers")
                ps.send(SS_STATE, sm.encode_state(sm.StateMsg(sm.STOP, 0, 1, sm.Status(0, 0, 0, 0.0, 0.0, 0.0))),
                        to="ss")
                ps.flush(timeout_s=5.0)
            served = json.loads(server.communicate(timeout=60)[0].strip().splitlines()[-1])
        finally:
            for c in children:
                if c.poll() is None:
                    c.kill()
    legs = {"round_trip": quantiles(timings["round_trip"]), **served["legs"],
            "to_worker": quantiles(timings["to_worker"]), "wake": quantiles(timings["wake"])}
    print(f"state server, {args.workers} workers in {procs} process(es) x {args.queries} queries, "
          f"think {args.think_ms} ms, DDS loopback ({served['queries']} answered"
          f"{', answers on the shared topic' if args.shared_replies else ''})")
    for leg, q in legs.items():
        print(f"  {leg:10s} median {q['median']:7.3f} ms  p90 {q['p90']:7.3f}  p99 {q['p99']:7.3f}  "
              f"max {q['max']:7.3f}  ({q['n']})")
    n = max(1, served["queries"])
    cpu = {"state_server_ms_per_query": round(1000 * (served["cpu_s"] or 0) / n, 3),
           "state_server_role_thread_ms_per_query": round(1000 * served.get("role_cpu_s", 0.0) / n, 3),
           "workers_ms_per_query": round(1000 * sum(timings["cpu_s"]) / n, 3),
           "workers_calling_threads_ms_per_query": round(1000 * sum(timings["caller_cpu_s"]) / n, 3)}
    print(f"  CPU per query: state server {cpu['state_server_ms_per_query']} ms "
          f"(its role's thread {cpu['state_server_role_thread_ms_per_query']}), "
          f"workers {cpu['workers_ms_per_query']} ms (their querying threads "
          f"{cpu['workers_calling_threads_ms_per_query']}; the rest: DDS's threads and the receive thread)")
    ru, wru = served.get("role_rusage") or [0, 0, 0, 0], [sum(x) for x in zip(*timings["caller_rusage"])] or [0] * 4
    cpu["role_thread_user_sys_ms_switches_per_query"] = [round(1000 * ru[0] / n, 3), round(1000 * ru[1] / n, 3),
                                                         round(ru[2] / n, 2), round(ru[3] / n, 2)]
    cpu["calling_threads_user_sys_ms_switches_per_query"] = [round(1000 * wru[0] / n, 3), round(1000 * wru[1] / n, 3),
                                                             round(wru[2] / n, 2), round(wru[3] / n, 2)]
    print(f"  per query, user / system ms, voluntary / involuntary context switches: state server's role thread "
          f"{cpu['role_thread_user_sys_ms_switches_per_query']}, workers' querying threads "
          f"{cpu['calling_threads_user_sys_ms_switches_per_query']}")
    print(f"  answers the workers dropped as not theirs: {sum(timings['not_for_me'])}; "
          f"state server rejected {served['rejected']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "legs": legs, "cpu": cpu, "not_for_me": sum(timings["not_for_me"]),
                       "server": served}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
