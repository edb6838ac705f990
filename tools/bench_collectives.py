"""Dense allreduce / allgather over DDS (the project's collectives) against torch.distributed (gloo).

    python -m tools.bench_collectives [--worlds 2,3] [--sizes 100000,1000000,4000000]
        [--repeats 15] [--warmup 3] [--backends dds,gloo] [--ops gather,ring,pipelined,allgather]
        [--frame-bytes N] [--piece-bytes N] [--out FILE.md] [--json FILE.json] [--profile DIR]
        [--no-shm] [--sealed] [--netns [--stream] [--mbps M] [--delay-ms D] [--mtu BYTES] [--bridge-nf]
        [--dds-profile P]]

For each world size W, W processes (multiprocessing, spawn; torch and BLAS
threads 1 each) on this machine:

``dds``   each process: ``DdsTransport`` (profile "loopback": 127.0.0.1 only,
          a DDS domain of its own) subscribed to ``coll/frames``, ``real.node.real_driver``
          driving one role generator that uses ``core.collectives.Collective``:
          the barrier first, then per size and op ``--warmup`` + ``--repeats``
          repetitions of ``allreduce_mean(step, vec, deadline, "gather")``,
          ``allreduce_mean(..., "ring")``, ``allreduce_mean(..., "pipelined")``
          and ``allgather`` (every rank's 4·n-byte vector); ``--ops`` picks some.  Exactly what a DDP worker does per step, event
          log included (``real.node.real_driver`` writes one ``deliver`` event per message
          to its run folder, here a temporary one).
          Payloads of 64 KiB and more travel through shared-memory pools beside DDS
          (``real.shm``, the loopback profile's default); ``--no-shm`` sends them
          inside the DDS samples, over loopback UDP, as before.
``gloo``  ``torch.distributed`` with the gloo backend
          (``init_method=tcp://127.0.0.1:PORT``): ``all_reduce`` (+ divide by W:
          the mean, as DDS computes) and ``all_gather``.

Before every repetition the ranks line up (DDS: an allgather of 1 byte;
gloo: ``barrier()``), then each times the op alone; a repetition's time is the
slowest rank's.  The table shows the median and the 90th percentile over the
repetitions, the ratio of the DDS median to gloo's (allreduce for gather
and ring, all_gather for allgather), and the CPU time of one op summed over
the ranks (``time.process_time``: every thread of each process; the median
over repetitions), which is much less disturbed by other load on the box
than wall time.  The first repetition of every size and op
also checks the result (the mean of the ranks' vectors, every rank's payload).

``--json FILE`` writes the comparison as a list of records ``{"op", "world",
"floats", "dds_ms", "gloo_ms"}`` (medians, ms): ``op`` "allreduce" takes the
fastest DDS allreduce algorithm measured (named in ``"algorithm"``) against
gloo's all_reduce, "allgather" DDS's allgather against gloo's all_gather.

``--piece-bytes`` sets the pipelined allreduce's piece size
(``core.ddp.frames.PIECE_BYTES`` by default).
``--frame-bytes`` sets ``Collective``'s frame size (default: its own,
``core.ddp.frames.FRAME_BYTES``, 1 MiB less room for headers, so that one
collective frame is one DDS sample).  ``--profile DIR`` runs rank 0 of each DDS world
under cProfile (main thread) and measures the CPU time of the DDS receive
thread (``DdsTransport._drain``) and of ``time.thread_time`` in the main one;
it writes ``DIR/dds-w<W>-rank0.prof`` and a text summary.

Everything stays on 127.0.0.1, except with ``--netns`` (needs root and ``ip netns``; exit 2
otherwise): every rank is then a "machine" of its own, in a network namespace of its own
(tools/netns_fl.py's ``Testbed``: one veth per rank to a bridge in a switch namespace,
10.231.0.<rank+1>/24, no route out), and the pairs talk over that path only:

``dds``   profile "lan" (``DTEMU_DDS_INTERFACE=eth0``, the other ranks' addresses as peers,
          unicast discovery), so no shared-memory pools: every payload inside the DDS
          samples, UDP over the veths;
``gloo``  ``init_method=tcp://<rank 0's address>:PORT``, ``GLOO_SOCKET_IFNAME=eth0``: TCP over
          the same veths.

``--stream`` carries DDS's payloads of 64 KiB and more on real.stream's TCP stream beside DDS
(``DTEMU_DDS_STREAM=1``); ``--sealed`` gives the DDS ranks a key (frame tags and message
envelopes, as a sealed run has them).  With ``--netns`` the notes also give each thread's CPU
of DDS rank 0 (named threads: dtemu-recv, dtemu-stream, ZMQbg/IO, CycloneDDS's recv...).

The links are unshaped unless ``--mbps`` (tbf on both ends of every veth, as netns_fl) or
``--delay-ms`` (netem, if the kernel has it; refused otherwise).  ``--mtu`` sets the veths'
MTU (default 1500, an Ethernet's: each of DDS's 64 kB datagrams then goes as 45 IP
fragments; 9000 or 65535 to see what that costs).  The switch namespace forwards without
br_netfilter's iptables hooks (a switch filters nothing; ``--bridge-nf`` leaves them on).
``--dds-profile FILE.xml`` runs the ranks with another CycloneDDS profile (real.config; the
ranks' peers still fill ``${peers}``).  The namespaces are made once, for the largest world,
and removed at the end whatever happens (error, Ctrl-C, SIGTERM).  A rank enters its
namespace first thing in its process (``setns(2)`` through libc), so the parent's
multiprocessing queue still reaches it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tools.collectives_netns import NetSetup, net_setup

OPS_DDS = ("gather", "ring", "pipelined", "allgather")
ALLREDUCE_ALGOS = ("gather", "ring", "pipelined")
GLOO_PORT = 29511  # in rank 0's namespace (fresh: nothing else listens there)
GLOO_OF = {"gather": "all_reduce", "ring": "all_reduce", "pipelined": "all_reduce", "allgather": "all_gather"}
DEFAULT_SIZES = (100_000, 1_000_000, 4_000_000)


def _one_thread() -> None:
    """One thread for the arithmetic, and malloc set as a rank's (host.heap, as real.cli does): both
    backends' buffers come from a heap that is kept, not mapped and faulted in anew each operation."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    from dtemu.host import heap

    if heap.keep():
        heap.pretouch(heap.pretouch_mb(processes=4))


def _vector(rank: int, n: int):
    import numpy as np

    return np.random.default_rng(1000 + rank).standard_normal(n).astype(np.float32)


def _expected_mean(world: int, n: int):
    import numpy as np

    total = np.zeros(n, np.float64)
    for r in range(world):
        total += _vector(r, n)
    return (total / world).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# DDS


def _dds_role(ctx, rank, world, names, sizes, repeats, warmup, frame_bytes, stamps, ops, piece_bytes):
    import numpy as np

    from dtemu.core.ddp.collectives import Collective, mean32_in_rank_order

    kw = {"frame_bytes": frame_bytes} if frame_bytes else {}
    if piece_bytes:
        kw["piece_bytes"] = piece_bytes
    coll = Collective(ctx, rank, names, max_payload=64 * max(sizes) + (1 << 20), **kw)
    yield from coll.barrier(ctx.now() + 60.0)
    rnd = 0
    out: dict[str, list[float]] = {}
    for n in sizes:
        vec = _vector(rank, n)
        payload = vec.tobytes()   # allgather's input, made before the clock as gloo's tensor is
        expected = _expected_mean(world, n)
        expected32 = mean32_in_rank_order([_vector(r, n) for r in range(world)])
        for op in ops:
            times, cpus = [], []
            for i in range(warmup + repeats):
                rnd += 1
                yield from coll.allgather(rnd, "sync", b"s", ctx.now() + 60.0)
                rnd += 1
                stamps.append(("start", n, op, time.thread_time()))
                c0 = time.process_time()
                t0 = time.perf_counter()
                if op == "allgather":
                    got = yield from coll.allgather(rnd, "ag", payload, ctx.now() + 60.0)
                else:
                    got, _ = yield from coll.allreduce_mean(rnd, vec, ctx.now() + 60.0, op)
                dt = time.perf_counter() - t0
                cpu = time.process_time() - c0
                stamps.append(("end", n, op, time.thread_time()))
                if i == 0:
                    if op == "allgather":
                        ok = [g == _vector(r, n).tobytes() for r, g in enumerate(got)]
                        assert all(ok), f"allgather payloads differ: {ok}"
                    elif op == "pipelined":  # float32 in rank order, bit for bit
                        assert got.tobytes() == expected32.tobytes(), "pipelined allreduce gave a wrong mean"
                    else:
                        assert np.allclose(got, expected, atol=1e-5), f"{op} allreduce gave a wrong mean"
                if i >= warmup:
                    times.append(dt)
                    cpus.append(cpu)
            out[f"{n}/{op}"] = times
            out[f"{n}/{op}/cpu"] = cpus
    # Last: line up once more so nobody leaves while its frames are still needed.
    yield from coll.allgather(rnd + 1, "sync", b"s", ctx.now() + 60.0)
    return out


def _time_gc() -> dict:
    """The time the cyclic garbage collector takes, by generation (filled in as it runs)."""
    import gc

    spent = {0: 0.0, 1: 0.0, 2: 0.0}
    started = [0.0]

    def timer(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[info["generation"]] += time.perf_counter() - started[0]

    gc.callbacks.append(timer)
    return spent


def _dds_worker(rank, world, domain, sizes, repeats, warmup, frame_bytes, profile_dir, ops, piece_bytes, net,
                sealed, queue):
    try:
        net_setup(net)
        _one_thread()
        import torch

        torch.set_num_threads(1)
        from dtemu.core.wire.topics import COLL_FRAMES
        from dtemu.host.rundir import RunDir
        from dtemu.host.writer_history import writer_history
        from dtemu.core.runtime.driver import run_blocking
        from dtemu.real.node import real_driver
        from dtemu.real.transport import DdsTransport

        Transport, Node = DdsTransport, real_driver
        names = [f"bench{r}" for r in range(world)]
        prof = drain_cpu = None
        if profile_dir and rank == 0:
            import cProfile

            prof = cProfile.Profile(time.thread_time)  # CPU, not wall: preemption on 2 cores is not the code
            drain_cpu = [0.0, 0]
            orig = DdsTransport._drain

            def timed_drain(self):
                t = time.thread_time()
                try:
                    return orig(self)
                finally:
                    drain_cpu[0] += time.thread_time() - t
                    drain_cpu[1] += 1

            DdsTransport._drain = timed_drain
        stamps: list = []
        gc_s = _time_gc()
        with tempfile.TemporaryDirectory(prefix="bench-coll-") as tmp:
            run = RunDir(tmp)
            try:
                key = SEAL_KEY if sealed else None
                # the writer history a DDP run of the largest vector has (host.writer_history): on the
                # stream too, a destination takes that much unacknowledged (real.stream_out)
                whc = writer_history(True, max(sizes))
                with Transport(names[rank], profile=net["profile"] if net else "loopback", domain_id=domain,
                               peers=net["peers"] if net else None, subscribe=[COLL_FRAMES], key=key,
                               whc_high=whc) as transport:
                    node = Node(names[rank], transport, run, publishes=[COLL_FRAMES], key=key)
                    role = _dds_role(node, rank, world, names, sizes, repeats, warmup, frame_bytes, stamps, ops,
                                     piece_bytes)
                    if prof is not None:
                        prof.enable()
                    cpu0, wall0, threads0 = time.process_time(), time.perf_counter(), _thread_cpu()
                    result = run_blocking(node.run(role))
                    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                    threads = _thread_cpu()
                    threads = {k: v - threads0.get(k, 0.0) for k, v in threads.items()}
                    if prof is not None:
                        prof.disable()
                    transport.flush(timeout_s=5.0)
                    stats = dict(transport.stats)
            finally:
                run.close()
        extra = {"stats": stats, "cpu_s": cpu, "wall_s": wall, "gc_s": gc_s, "threads_cpu_s": threads}
        if prof is not None:
            path = Path(profile_dir) / f"dds-w{world}-rank0.prof"
            prof.dump_stats(str(path))
            extra["profile"] = str(path)
            extra["drain_cpu_s"] = drain_cpu[0]
            extra["drain_calls"] = drain_cpu[1]
            main_cpu: dict[str, float] = {}
            for (kind, n, op, t), (_, _, _, t2) in zip(stamps[0::2], stamps[1::2]):
                main_cpu[f"{n}/{op}"] = main_cpu.get(f"{n}/{op}", 0.0) + (t2 - t)
            extra["main_cpu_s"] = main_cpu
        queue.put((rank, result, extra))
    except BaseException:
        queue.put((rank, None, {"error": traceback.format_exc()}))


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads, summed by name (digits dropped: CycloneDDS's, zmq's,
    dtemu's own), from /proc: where a rank's CPU goes besides its main thread."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")].rstrip("0123456789-").rstrip("/") or "?"
        fields = stat[stat.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


SEAL_KEY = bytes(range(32))   # --sealed: the ranks' shared key (a benchmark's, not a secret)


# ---------------------------------------------------------------------------------------------
# gloo


def _gloo_worker(rank, world, port, sizes, repeats, warmup, net, queue):
    try:
        net_setup(net)
        _one_thread()
        import numpy as np
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        master = net["master"] if net else "127.0.0.1"
        dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world)
        out: dict[str, list[float]] = {}
        try:
            for n in sizes:
                vec = torch.from_numpy(_vector(rank, n))
                expected = _expected_mean(world, n)
                for op in ("all_reduce", "all_gather"):
                    times, cpus = [], []
                    gathered = [torch.empty(n) for _ in range(world)]
                    for i in range(warmup + repeats):
                        buf = vec.clone()
                        dist.barrier()
                        c0 = time.process_time()
                        t0 = time.perf_counter()
                        if op == "all_reduce":
                            dist.all_reduce(buf)
                            buf /= world
                        else:
                            dist.all_gather(gathered, vec)
                        dt = time.perf_counter() - t0
                        cpu = time.process_time() - c0
                        if i == 0:
                            if op == "all_reduce":
                                assert np.allclose(buf.numpy(), expected, atol=1e-5)
                            else:
                                assert all(np.array_equal(g.numpy(), _vector(r, n)) for r, g in enumerate(gathered))
                        if i >= warmup:
                            times.append(dt)
                            cpus.append(cpu)
                    out[f"{n}/{op}"] = times
                    out[f"{n}/{op}/cpu"] = cpus
            dist.barrier()
        finally:
            dist.destroy_process_group()
        queue.put((rank, out, {}))
    except BaseException:
        queue.put((rank, None, {"error": traceback.format_exc()}))


# ---------------------------------------------------------------------------------------------
# driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_world(target, world, args_of_rank, timeout_s):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of_rank(r), queue), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, tuple] = {}
    deadline = time.monotonic() + timeout_s
    done = False
    try:
        while len(results) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{target.__name__}: world {world} did not finish in {timeout_s:g}s")
            try:
                rank, res, extra = queue.get(timeout=min(left, 5.0))
            except Exception:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in results]
                if dead:
                    raise RuntimeError(f"{target.__name__}: ranks {dead} died without a result")
                continue
            if res is None:
                raise RuntimeError(f"{target.__name__} rank {rank} failed:\n{extra.get('error')}")
            results[rank] = (res, extra)
        done = True
    finally:
        for p in procs:
            p.join(timeout=10 if done else 0.5)  # on an error or an interrupt: no waiting
            if p.is_alive():
                p.terminate()
                p.join()
    return results


def _slowest(results: dict[int, tuple]) -> dict[str, list[float]]:
    """Per key, per repetition: the slowest rank's time; for ``.../cpu`` keys the sum over ranks."""
    keys = results[0][0].keys()
    combine = {k: (sum if k.endswith("/cpu") else max) for k in keys}
    return {k: [combine[k](ts) for ts in zip(*(results[r][0][k] for r in sorted(results)))] for k in keys}


def _pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _fmt_ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def table(rows: dict, worlds, sizes, backends, ops=OPS_DDS) -> str:
    """rows[(backend, world, n, op)] = list of seconds."""
    lines = ["| W | floats | op | DDS median ms | DDS p90 ms | gloo median ms | gloo p90 ms | DDS/gloo "
             "| DDS CPU ms | gloo CPU ms |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for w in worlds:
        for n in sizes:
            for op in ops:
                d = rows.get(("dds", w, n, op))
                g = rows.get(("gloo", w, n, GLOO_OF[op]))
                dm, dp = (statistics.median(d), _pct(d, 0.9)) if d else (None, None)
                gm, gp = (statistics.median(g), _pct(g, 0.9)) if g else (None, None)
                ratio = f"{dm / gm:.1f}x" if dm and gm else "-"
                dc, gc = rows.get(("dds", w, n, op + "/cpu")), rows.get(("gloo", w, n, GLOO_OF[op] + "/cpu"))
                cpu = f" | {_fmt_ms(statistics.median(dc)) if dc else '-'} | {_fmt_ms(statistics.median(gc)) if gc else '-'}"
                label = "allgather" if op == "allgather" else f"allreduce ({op})"
                lines.append(f"| {w} | {n:,} | {label} | {_fmt_ms(dm) if dm else '-'} | {_fmt_ms(dp) if dp else '-'} "
                             f"| {_fmt_ms(gm) if gm else '-'} | {_fmt_ms(gp) if gp else '-'} | {ratio}{cpu} |")
    return "\n".join(lines)


def records(rows: dict, worlds, sizes) -> list[dict]:
    """The --json table: per world and size, the fastest DDS allreduce against gloo's, and the allgathers."""
    out = []
    for w in worlds:
        for n in sizes:
            gloo = rows.get(("gloo", w, n, "all_reduce"))
            algos = {op: statistics.median(rows[("dds", w, n, op)]) for op in ("gather", "ring", "pipelined")
                     if rows.get(("dds", w, n, op))}
            if algos:
                best = min(algos, key=algos.get)
                out.append({"op": "allreduce", "world": w, "floats": n, "dds_ms": round(algos[best] * 1e3, 3),
                            "gloo_ms": round(statistics.median(gloo) * 1e3, 3) if gloo else None,
                            "algorithm": best})
            dds, gloo = rows.get(("dds", w, n, "allgather")), rows.get(("gloo", w, n, "all_gather"))
            if dds:
                out.append({"op": "allgather", "world": w, "floats": n,
                            "dds_ms": round(statistics.median(dds) * 1e3, 3),
                            "gloo_ms": round(statistics.median(gloo) * 1e3, 3) if gloo else None})
    for r in out:
        r["ratio"] = round(r["dds_ms"] / r["gloo_ms"], 3) if r["gloo_ms"] else None
    return out


def summary_table(rows: dict, worlds, sizes) -> str:
    """Per world and size, DDS / gloo medians: the fastest DDS allreduce (named), the pipelined
    one, and allgather; and the CPU of one op summed over the ranks (pipelined against all_reduce)."""
    def med(key):
        xs = rows.get(key)
        return statistics.median(xs) if xs else None

    def cell(d, g, extra=""):
        if d is None or g is None:
            return "-"
        return f"{_fmt_ms(d)} / {_fmt_ms(g)} = **{d / g:.2f}**{extra}"

    lines = ["| W | floats | allreduce, fastest DDS / gloo | pipelined / gloo | allgather / gloo "
             "| CPU ms, pipelined / all_reduce |",
             "|---:|---:|---|---|---|---|"]
    for w in worlds:
        for n in sizes:
            g_ar, g_ag = med(("gloo", w, n, "all_reduce")), med(("gloo", w, n, "all_gather"))
            algos = {a: med(("dds", w, n, a)) for a in ALLREDUCE_ALGOS if med(("dds", w, n, a)) is not None}
            best = min(algos, key=algos.get) if algos else None
            cpu_d, cpu_g = med(("dds", w, n, "pipelined/cpu")), med(("gloo", w, n, "all_reduce/cpu"))
            cpu = f"{_fmt_ms(cpu_d)} / {_fmt_ms(cpu_g)}" if cpu_d is not None and cpu_g is not None else "-"
            lines.append(f"| {w} | {n / 1e6:g}M | {cell(algos.get(best), g_ar, f' ({best})' if best else '')} "
                         f"| {cell(med(('dds', w, n, 'pipelined')), g_ar)} "
                         f"| {cell(med(('dds', w, n, 'allgather')), g_ag)} | {cpu} |")
    return "\n".join(lines)


def _measure(args, worlds, sizes, backends, ops, domain, net: NetSetup | None):
    rows: dict = {}
    notes: list[str] = []
    for w in worlds:
        for backend in backends:
            t0 = time.perf_counter()
            net_of = (lambda r: net.net_of(w, r)) if net else (lambda r: None)
            drops0 = net.drops() if net else {}
            if backend == "dds":
                dom = domain + w  # a domain per world: no leftovers from the previous one
                res = _run_world(_dds_worker, w, lambda r: (r, w, dom, sizes, args.repeats, args.warmup,
                                                            args.frame_bytes, args.profile, ops, args.piece_bytes,
                                                            net_of(r), args.sealed),
                                 args.timeout)
                extra = res[0][1]
                st = extra["stats"]
                notes.append(f"DDS W={w}: rank 0 sent {st['sent_frames']} DDS samples / {st['sent_msgs']} messages, "
                             f"received {st['recv_frames']} / {st['recv_msgs']} ({st['own_frames']} of them its own); "
                             f"payloads through shared memory: {st['shm_sent_frames']} sent, {st['shm_recv_frames']} "
                             f"received, {st['shm_fallbacks']} sent inline for want of room; garbage collector "
                             f"{1e3 * sum(extra['gc_s'].values()):.0f} ms (generation 2: {1e3 * extra['gc_s'][2]:.0f}); "
                             f"process CPU {extra['cpu_s']:.1f} s "
                             f"over {extra['wall_s']:.1f} s wall")
                busy = sorted(extra["threads_cpu_s"].items(), key=lambda kv: -kv[1])
                notes.append(f"DDS W={w} rank 0 CPU by thread (s, the whole run): "
                             + ", ".join(f"{k} {v:.2f}" for k, v in busy if v >= 0.005))
                if "drain_cpu_s" in extra:
                    mc = sum(extra["main_cpu_s"].values())
                    notes.append(f"DDS W={w} rank 0 profile: receive thread (_drain) CPU {extra['drain_cpu_s']:.2f} s "
                                 f"in {extra['drain_calls']} calls; main thread CPU inside the timed ops {mc:.2f} s "
                                 f"-> {extra['profile']}")
                    for k, v in extra["main_cpu_s"].items():
                        notes.append(f"  main-thread CPU {k}: {v / (args.warmup + args.repeats) * 1e3:.1f} ms/op")
            elif backend == "gloo":
                port = GLOO_PORT + w if net else _free_port()
                res = _run_world(_gloo_worker, w, lambda r: (r, w, port, sizes, args.repeats, args.warmup,
                                                             net_of(r)),
                                 args.timeout)
            else:
                raise SystemExit(f"unknown backend {backend!r}")
            if net:
                lost = {k: v - drops0.get(k, 0) for k, v in net.drops().items() if v - drops0.get(k, 0)}
                notes.append(f"{backend} W={w}: datagrams lost in the namespaces' kernels: {lost or 'none'}")
            for key, ts in _slowest(res).items():
                n, op, *cpu = key.split("/")
                rows[(backend, w, int(n), op + ("/cpu" if cpu else ""))] = ts
            print(f"[{backend} W={w}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr, flush=True)
    return rows, notes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_collectives", description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", default="2,3")
    p.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), help="float32 counts")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--backends", default="dds,gloo")
    p.add_argument("--ops", default=",".join(OPS_DDS), help="DDS ops, of " + ",".join(OPS_DDS))
    p.add_argument("--piece-bytes", type=int, default=0, help="pipelined allreduce piece size (0: its default)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the comparison as JSON records")
    p.add_argument("--frame-bytes", type=int, default=0, help="Collective frame size (0: its default, 1 MiB less room for headers)")
    p.add_argument("--domain", type=int, default=None, help="first DDS domain id (default: from the pid)")
    p.add_argument("--timeout", type=float, default=900.0, help="per world and backend, seconds")
    p.add_argument("--profile", default=None, metavar="DIR", help="profile DDS rank 0 into DIR")
    p.add_argument("--out", default=None, help="also write the Markdown table here")
    p.add_argument("--no-shm", action="store_true",
                   help="DDS carries the payloads too (DTEMU_DDS_SHM=0): no shared-memory pools (real.shm)")
    p.add_argument("--stream", action="store_true",
                   help="--netns: large payloads on real.stream's TCP stream beside DDS (DTEMU_DDS_STREAM=1)")
    p.add_argument("--sealed", action="store_true", help="DDS ranks sealed under a key (gloo has no seal)")
    p.add_argument("--netns", action="store_true",
                   help="every rank in a network namespace of its own (root): DDS lan profile over UDP, "
                        "gloo over TCP, through veths and a bridge")
    p.add_argument("--mbps", type=float, default=0.0, help="--netns: tbf rate per veth and direction (0: unshaped)")
    p.add_argument("--delay-ms", type=float, default=0.0,
                   help="--netns: netem delay per veth and direction (needs sch_netem; 0: none)")
    p.add_argument("--mtu", type=int, default=1500, help="--netns: the veths' MTU")
    p.add_argument("--dds-profile", default="lan", metavar="PROFILE",
                   help="--netns: the DDS profile of the ranks (default lan; or an .xml file, real.config)")
    p.add_argument("--bridge-nf", action="store_true",
                   help="--netns: leave br_netfilter's iptables hooks on in the switch namespace (default: off)")
    args = p.parse_args(argv)
    if (args.mbps or args.delay_ms or args.mtu != 1500 or args.bridge_nf or args.dds_profile != "lan") \
            and not args.netns:
        p.error("--mbps, --delay-ms, --mtu, --bridge-nf and --dds-profile go with --netns")
    if args.dds_profile == "loopback":
        p.error("--dds-profile: the ranks are on different hosts; loopback cannot reach them")
    if args.no_shm or args.netns:
        os.environ["DTEMU_DDS_SHM"] = "0"   # the ranks are spawned with this environment
    os.environ["DTEMU_DDS_STREAM"] = "1" if args.stream else "0"
    worlds = [int(w) for w in args.worlds.split(",") if w]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    backends = [b for b in args.backends.split(",") if b]
    ops = [o for o in args.ops.split(",") if o]
    if any(o not in OPS_DDS for o in ops):
        raise SystemExit(f"--ops: choose among {OPS_DDS}")
    _one_thread()
    net = None
    if args.netns:
        from tools.netns_fl import NetnsError, netns_available

        import shutil

        missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
        if os.geteuid() != 0:
            ok, why = False, "needs root (ip netns, tc)"
        elif missing:
            ok, why = False, f"needs {' and '.join(missing)} (iproute2) on PATH"
        else:
            try:
                ok, why = netns_available()
            except OSError as err:
                ok, why = False, f"cannot probe network namespaces: {err}"
        if not ok:
            print(f"bench_collectives: --netns {why}", file=sys.stderr)
            return 2
        profile = args.dds_profile if args.dds_profile == "lan" else str(Path(args.dds_profile).resolve())
        net = NetSetup(max(worlds), args.mbps, args.delay_ms, args.mtu, args.bridge_nf, profile)
        if args.delay_ms > 0 and not net.bed._has_netem():
            print("bench_collectives: --delay-ms needs sch_netem, which this kernel lacks", file=sys.stderr)
            return 2
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    domain = args.domain if args.domain is not None else 20 + os.getpid() % 180
    started = time.perf_counter()
    load0 = os.getloadavg()[0]
    if net is None:
        rows, notes = _measure(args, worlds, sizes, backends, ops, domain, None)
        where = "on loopback (127.0.0.1)"
    else:
        try:
            with net:
                rtt = net.bed.rtt_ms(1, 0)
                where = f"across network namespaces ({net.describe()}; UDP RTT {rtt:.3f} ms)"
                print(f"netns: {where}", file=sys.stderr, flush=True)
                rows, notes = _measure(args, worlds, sizes, backends, ops, domain, net)
        except NetnsError as err:
            print(f"bench_collectives: {err}", file=sys.stderr)
            return 3
        except KeyboardInterrupt:
            print("bench_collectives: interrupted (namespaces removed)", file=sys.stderr)
            return 130
    md = table(rows, worlds, sizes, backends, ops)
    if args.netns:
        payloads = (f"of 64 KiB and more on a TCP stream beside DDS (real.stream, {args.dds_profile} profile)"
                    if args.stream else f"inside the DDS samples ({args.dds_profile} profile, UDP)") \
            + (", sealed (frame tags and message envelopes)" if args.sealed else "") + "; gloo over TCP"
    else:
        payloads = "inline (--no-shm)" if args.no_shm else "through shared-memory pools (real.shm)"
    header = (f"Collectives {where}, {args.repeats} repetitions after {args.warmup} warm-up, "
              f"slowest rank per repetition; {os.cpu_count()} cores; "
              f"Collective frame_bytes={args.frame_bytes or 'default'}, piece_bytes={args.piece_bytes or 'default'}; "
              f"DDS payloads {payloads}; "
              f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
              f"(other work on the box inflates wall times; the CPU columns much less); "
              f"total {time.perf_counter() - started:.0f} s.\n")
    text = (header + "\n" + summary_table(rows, worlds, sizes) + "\n\n" + md + "\n\n"
            + "\n".join(f"- {n}" for n in notes) + "\n")
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(records(rows, worlds, sizes), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
