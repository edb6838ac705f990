"""At which world size does DGC's sparse allgather stop beating a dense allreduce?

    python -m tools.sweep_world [--worlds 2,4,8,16,32,64] [--mbps 1000] [--latency-ms 0.1] --out DIR

No training: for each world size W this emulates one step's gradient exchange
of the 1.2M-parameter ``mnist_cnn`` (D = 1,199,882 float32) with the real
emulator (``emu.world.World`` over ``emu.network``'s max-min fair flows) and
the real framed collectives (``core.collectives``), with synthetic payloads of
the right size:

``gather``  dense allreduce by gather: every rank sends its 4·D bytes to every
            other rank (what ``Collective.allreduce_mean(..., "gather")`` and
            the original system send);
``ring``    dense ring allreduce, ``Collective.allreduce_mean(..., "ring")``:
            2(W-1) steps of a 1/W chunk to the next rank;
``dgc@d``   DGC's sparse allgather at density d (warm-up 0.25, 0.0625,
            0.015625, 0.004; final 0.001): one bucket per rank by
            ``start_allgather`` + ``wait`` + ``collect``.  Its size is the
            bucket format's (``core/bucket.py``): a 20-byte header, 12 bytes
            per tensor, k = ceil(d·numel) entries of 8 bytes (fp32 value +
            int32 index; 6 with ``--fp16``) per sparse tensor, and the tensors
            smaller than ``--dense-below`` (1024, as ``ddp.dense_below``) dense:
            the four biases (234 values) *and* conv1.weight (288 values).

One emulated world per W runs every method: the ranks pass the collectives'
barrier once; before each exchange they line up through rank 0 (``_line_up``,
2(W-1) tiny frames) so that all start at the same virtual instant, and the
exchange is timed from that instant to the last rank finishing (virtual
seconds; the ring's result is computed for real).  The emulator is
deterministic, so one repetition is the default (``--repeats``).

Cost.  The default sweep (W up to 64, 7 methods) takes about 25 s of wall
time and 0.7 GB.  Almost all of it is W = 64: an all-to-all step starts
W(W-1) = 4032 flows in one instant and ``emu.network.Network.send``
re-syncs every active flow on each start, so such a step costs O(W^4)
(about 2 s at W = 64, 8x that at W = 128).  Two shortcuts keep memory
bounded; neither changes a byte on the wire or a virtual-time instant:

- the dense gather's average is not computed (adding 64 vectors of 1.2M
  floats on 64 ranks is compute, which this sweep does not model), and
- gathered payloads are kept as sizes only (``LeanCollective``): every frame
  is still decoded, checked and reassembled by ``Collective``'s own code, but
  its body is dropped once counted; otherwise W = 64 dense would hold
  64·63·4.8 MB = 19 GB.  The ring's frames are kept (it needs them).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import simpy

from dtemu.core.compression.kernels import topk_count
from dtemu.core.wire.topics import COLL_FRAMES
from dtemu.core.ddp.collectives import Collective, Handle
from dtemu.core.ddp.frames import _FIELDS, HEADER_SIZE, Frame, encode_frame
from dtemu.core.wire import envelope
from dtemu.core.compression.dgc import PAPER_WARMUP, param_shapes
from dtemu.core.ml.models import build_model
from dtemu.core.runtime.requests import Send, Sleep
from dtemu.core.runtime.compute_spec import ComputeSpec
from dtemu.core.runtime.compute import ComputeTimer
from dtemu.emu.network import Network, link_from_spec
from dtemu.emu.world import EmuNode, World

# core.models.MnistCnn's parameters in named_parameters() order.
MNIST_CNN_SHAPES: tuple[tuple[str, tuple[int, ...]], ...] = tuple(param_shapes(build_model("mnist_cnn", seed=0)))
WARMUP_DENSITIES = PAPER_WARMUP
FINAL_DENSITY = 0.001
DGC_DENSITIES = WARMUP_DENSITIES + (FINAL_DENSITY,)
DEFAULT_WORLDS = (2, 4, 8, 16, 32, 64)

# The DGC bucket format (core/bucket.py): header, per-tensor entry header.
BUCKET_HEADER_BYTES = 20
BUCKET_ENTRY_BYTES = 12

GATHER, RING, DGC = "gather", "ring", "dgc"


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def dense_payload_bytes(shapes=MNIST_CNN_SHAPES) -> int:
    """One rank's dense gradient: 4 bytes per parameter."""
    return 4 * sum(numel(s) for _, s in shapes)


def dgc_payload_bytes(density: float, shapes=MNIST_CNN_SHAPES, *, dense_below: int = 1024,
                      fp16: bool = False) -> int:
    """Bytes of one rank's DGC bucket at ``density`` (the k-entry budget of every sparse tensor)."""
    vb = 2 if fp16 else 4
    size = BUCKET_HEADER_BYTES
    for _, shape in shapes:
        n = numel(shape)
        size += BUCKET_ENTRY_BYTES
        size += n * vb if n < dense_below else topk_count(n, density) * (4 + vb)
    return size


@dataclass(frozen=True)
class Method:
    kind: str  # gather | ring | dgc
    density: float | None = None

    @property
    def name(self) -> str:
        return f"{DGC}@{self.density:g}" if self.kind == DGC else self.kind

    @property
    def label(self) -> str:
        if self.kind == GATHER:
            return "dense allreduce (gather)"
        if self.kind == RING:
            return "dense ring allreduce"
        return f"DGC sparse allgather, density {self.density:g}"


def default_methods(densities=DGC_DENSITIES) -> list[Method]:
    return [Method(GATHER), Method(RING)] + [Method(DGC, d) for d in densities]


@dataclass(frozen=True)
class NetSpec:
    mbps: float = 1000.0
    latency_ms: float = 0.1

    @property
    def label(self) -> str:
        speed = f"{self.mbps / 1000:g} Gbit/s" if self.mbps >= 1000 else f"{self.mbps:g} Mbit/s"
        return f"{speed}, {self.latency_ms:g} ms latency"


@dataclass
class Result:
    world: int
    method: Method
    payload_bytes: int  # what one rank hands the collective (a dense vector, a bucket)
    times_s: list[float]  # one per repetition, first rank starting to last rank finishing
    bytes_sent: int  # by one rank (rank 0) in one exchange, frame headers included
    wall_s: float = 0.0  # this method's share of its world's wall time

    @property
    def time_s(self) -> float:
        return min(self.times_s)


class LeanCollective(Collective):
    """A Collective that keeps the payloads of ``lean_names`` as sizes only.

    Every frame goes through ``Collective._file`` (decoded, checked, counted,
    reassembled); afterwards its body is replaced by b"", so ``collect``
    returns empty payloads.  Timing is untouched: it depends on frame sizes
    on the wire only.
    """

    lean_names = frozenset({"dense", "dgc"})  # the gathers'; not the ring's nor the barrier's

    def _file(self, msg) -> None:
        super()._file(msg)
        data = msg.data
        if len(data) < HEADER_SIZE:
            return
        fields = _FIELDS.unpack_from(data, envelope.SIZE)
        round_, rank, part, seq, n = fields[0], fields[1], fields[3], fields[4], fields[7]
        name = bytes(data[HEADER_SIZE : HEADER_SIZE + n]).decode(errors="replace")
        if name not in self.lean_names:
            return
        key = (round_, name, part, rank)
        if key in self._done:
            self._done[key] = b""
        else:
            asm = self._assemblies.get(key)
            if asm is not None and seq in asm.parts:
                asm.parts[seq] = b""


def _make_world(world: int, net: NetSpec, role) -> tuple[simpy.Environment, list]:
    env = simpy.Environment()
    names = [f"worker{r}" for r in range(world)]
    link = link_from_spec(net.mbps, net.mbps, net.latency_ms, 0.0)
    network = Network(env, {n: link for n in names}, seed=0)
    w = World(env, network, lambda event: None, lambda data: "none")  # events are not kept
    timer = ComputeTimer(ComputeSpec(train_s_per_sample=1e-3), None, seed=0)  # no compute here
    for rank, name in enumerate(names):
        w.add(EmuNode(w, name, rank, (COLL_FRAMES,), lambda ctx, r=rank: role(ctx, r, names), timer))
    procs = [w.start(n) for n in names]
    return env, procs


def _line_up(coll: Collective, round_: int, path_latency_s: float):
    """Every rank reports to rank 0, rank 0 releases them all; all resume at the same instant.

    2(W-1) small frames, where an allgather would cost W(W-1): at W = 64
    each all-to-all costs the emulator seconds of wall time.  Rank 0 waits
    out the release's path latency so that it starts with the others.
    """
    rank, world = coll.rank, coll.world

    def frame(name):
        return encode_frame(Frame(coll.group, round_, name, 0, rank, world, 0, 1, 0, b""))

    if rank == 0:
        handle = Handle(round_, "lineup", 0, b"", tuple(range(1, world)), coll.ctx.now())
        yield from coll.wait(handle, None, what="line-up")
        coll.collect(handle)
        yield Send(COLL_FRAMES, frame("go"))
        yield Sleep(path_latency_s)
    else:
        yield Send(COLL_FRAMES, frame("lineup"), to=coll.peers[0])
        handle = Handle(round_, "go", 0, b"", (0,), coll.ctx.now())
        yield from coll.wait(handle, None, what="line-up")
        coll.collect(handle)


def payload_bytes(method: Method, *, dense_below: int = 1024, fp16: bool = False,
                  shapes=MNIST_CNN_SHAPES) -> int:
    """What one rank hands the collective: the dense vector or its DGC bucket."""
    if method.kind == DGC:
        return dgc_payload_bytes(method.density, shapes, dense_below=dense_below, fp16=fp16)
    if method.kind in (GATHER, RING):
        return dense_payload_bytes(shapes)
    raise ValueError(f"unknown method {method.kind!r}")


def exchange_times(world: int, methods, net: NetSpec = NetSpec(), *, repeats: int = 1,
                   frame_bytes: int = 1 << 20, dense_below: int = 1024, fp16: bool = False,
                   shapes=MNIST_CNN_SHAPES) -> list[Result]:
    """Emulate ``repeats`` exchanges of each of ``methods`` among ``world`` ranks, in one world.

    The ranks pass the barrier once, then, before every exchange, line up
    (``_line_up``); an exchange's time runs from the instant they start to
    the instant the last rank has every payload (or its ring result).
    """
    methods = list(methods)
    if world < 2:
        raise ValueError("a gradient exchange needs at least 2 ranks")
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    sizes = [payload_bytes(m, dense_below=dense_below, fp16=fp16, shapes=shapes) for m in methods]
    payloads = {size: bytes(size) for size in set(sizes)}
    dim = sum(numel(s) for _, s in shapes)
    vector = np.zeros(dim, np.float32)
    vector.flags.writeable = False
    runs = [(i, rep) for i in range(len(methods)) for rep in range(repeats)]
    starts = [[0.0] * world for _ in runs]
    ends = [[0.0] * world for _ in runs]
    sent = [0] * len(runs)
    latency_s = 2 * link_from_spec(net.mbps, net.mbps, net.latency_ms).latency_s

    def role(ctx, rank, names):
        coll = LeanCollective(ctx, rank, names, frame_bytes=frame_bytes,
                              max_payload=max(sizes) + (1 << 20))
        yield from coll.barrier(deadline=None)
        for j, (i, _rep) in enumerate(runs):
            method = methods[i]
            yield from _line_up(coll, j, latency_s)
            starts[j][rank] = ctx.now()
            if method.kind == RING:
                _mean, n = yield from coll.allreduce_mean(j, vector, None, algorithm="ring")
            else:
                name = "dense" if method.kind == GATHER else "dgc"
                handle = yield from coll.start_allgather(j, name, payloads[sizes[i]])
                yield from coll.wait(handle, None)
                if len(coll.collect(handle)) != world:
                    raise AssertionError("an allgather returned the wrong number of payloads")
                n = handle.bytes_sent
            ends[j][rank] = ctx.now()
            if rank == 0:
                sent[j] = n

    wall = time.perf_counter()
    env, procs = _make_world(world, net, role)
    env.run(until=env.all_of(procs))
    wall = time.perf_counter() - wall
    results = []
    for i, method in enumerate(methods):
        js = [j for j, (k, _) in enumerate(runs) if k == i]
        times = [max(ends[j]) - min(starts[j]) for j in js]
        results.append(Result(world, method, sizes[i], times, sent[js[0]], wall / len(methods)))
    return results


def exchange_time(world: int, method: Method, net: NetSpec = NetSpec(), **kwargs) -> Result:
    """One method alone (see ``exchange_times``)."""
    return exchange_times(world, [method], net, **kwargs)[0]


def sweep(worlds=DEFAULT_WORLDS, methods=None, net: NetSpec = NetSpec(), *, repeats: int = 1,
          frame_bytes: int = 1 << 20, dense_below: int = 1024, fp16: bool = False,
          max_gather_world: int | None = None, progress=None) -> list[Result]:
    """Every (W, method), one emulated world per W; ``max_gather_world`` skips the dense gather above it."""
    methods = default_methods() if methods is None else list(methods)
    results = []
    for w in worlds:
        todo = [m for m in methods
                if not (m.kind == GATHER and max_gather_world is not None and w > max_gather_world)]
        batch = exchange_times(w, todo, net, repeats=repeats, frame_bytes=frame_bytes,
                               dense_below=dense_below, fp16=fp16)
        results += batch
        if progress is not None:
            progress(w, batch)
    return results


def _table(results: list[Result]) -> tuple[list[int], list[Method], dict]:
    worlds = sorted({r.world for r in results})
    methods: list[Method] = []
    for r in results:
        if r.method not in methods:
            methods.append(r.method)
    grid = {(r.world, r.method): r for r in results}
    return worlds, methods, grid


def crossovers(results: list[Result], against: str = RING) -> dict[float, int | None]:
    """Per DGC density: the smallest W at which the sparse allgather is slower than ``against``.

    None when it is faster at every W swept that has both numbers.
    """
    worlds, methods, grid = _table(results)
    base = Method(against)
    out = {}
    for m in methods:
        if m.kind != DGC:
            continue
        out[m.density] = None
        for w in worlds:
            a, b = grid.get((w, m)), grid.get((w, base))
            if a is not None and b is not None and a.time_s > b.time_s:
                out[m.density] = w
                break
    return out


def text_table(results: list[Result]) -> str:
    worlds, methods, grid = _table(results)
    width = max(len(m.name) for m in methods) + 2
    lines = ["time per exchange (ms)", "W".rjust(4) + "".join(m.name.rjust(width) for m in methods)]
    for w in worlds:
        cells = [f"{grid[(w, m)].time_s * 1e3:.2f}" if (w, m) in grid else "-" for m in methods]
        lines.append(f"{w:4d}" + "".join(c.rjust(width) for c in cells))
    return "\n".join(lines)


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} GB"


def markdown(results: list[Result], net: NetSpec, *, frame_bytes: int, fp16: bool,
             dense_below: int) -> str:
    worlds, methods, grid = _table(results)
    out = [
        "# Sparse allgather vs dense allreduce by world size",
        "",
        f"One step's gradient exchange of mnist_cnn (D = {dense_payload_bytes() // 4:,} float32) "
        f"emulated on {net.label} access links (up = down), frames of {frame_bytes:,} bytes; "
        f"DGC values {'fp16' if fp16 else 'fp32'}, tensors under {dense_below} entries dense. "
        "Time from the first rank starting to the last rank finishing, in ms (virtual time).",
        "",
        "| W | " + " | ".join(m.name for m in methods) + " |",
        "|---:|" + "---:|" * len(methods),
    ]
    for w in worlds:
        cells = [f"{grid[(w, m)].time_s * 1e3:.2f}" if (w, m) in grid else "–" for m in methods]
        out.append(f"| {w} | " + " | ".join(cells) + " |")
    out += ["", "Payload per rank and bytes rank 0 put on the wire per exchange "
            "(frame headers included) at the largest W:", "",
            "| method | payload | sent by one rank |", "|---|---:|---:|"]
    for m in methods:
        big = max((w for w in worlds if (w, m) in grid), default=None)
        if big is not None:
            r = grid[(big, m)]
            out.append(f"| {m.name} | {_human(r.payload_bytes)} | {_human(r.bytes_sent)} (W={big}) |")
    out += ["", "## Crossover: smallest W at which the sparse allgather is slower", ""]
    has = {m.kind for m in methods}
    for against in (RING, GATHER):
        if against not in has:
            continue
        top = max(w for w in worlds if (w, Method(against)) in grid)
        out.append(f"Against the {Method(against).label}:")
        out.append("")
        for density, w in crossovers(results, against).items():
            verdict = f"W = {w}" if w is not None else f"none up to W = {top}"
            size = next(r.payload_bytes for r in results if r.method == Method(DGC, density))
            dense = dense_payload_bytes()
            # Bytes per rank: allgather (W-1)·P; ring 2(W-1)/W·4D; gather (W-1)·4D.
            if against == RING:
                tie = f"bytes alone: slower for W > 2·4D/P = {2 * dense / size:.3g}"
            else:
                tie = "bytes alone: never (P < 4D)" if size < dense else "bytes alone: always"
            out.append(f"- density {density:g} (P = {_human(size)}): {verdict} ({tie})")
        out.append("")
    out += ["The smallest swept W is given; pass --worlds to refine.  The ring also pays "
            "2(W-1) path latencies per exchange, which moves the emulated crossover above "
            "the bytes-only one."]
    return "\n".join(out)


def plot(results: list[Result], net: NetSpec, path: Path) -> Path:
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    worlds, methods, grid = _table(results)
    fig = Figure(figsize=(9, 5.5), layout="constrained")
    ax = fig.subplots()
    cmap = colormaps["viridis"]
    dgc = [m for m in methods if m.kind == DGC]
    for m in methods:
        ws = [w for w in worlds if (w, m) in grid]
        ts = [grid[(w, m)].time_s * 1e3 for w in ws]
        if m.kind == GATHER:
            style = dict(color="black", linestyle="--", marker="s", linewidth=2)
        elif m.kind == RING:
            style = dict(color="tab:red", marker="o", linewidth=2.5)
        else:
            style = dict(color=cmap(dgc.index(m) / max(1, len(dgc) - 1) * 0.9), marker=".")
        ax.plot(ws, ts, label=m.label, **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(worlds, [str(w) for w in worlds])
    ax.set_xlabel("world size W (ranks)")
    ax.set_ylabel("time per exchange (ms, virtual)")
    ax.set_title(f"one step's gradient exchange, mnist_cnn, {net.label}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120)
    return path


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.sweep_world", description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", type=_ints, default=list(DEFAULT_WORLDS), help="world sizes, e.g. 2,4,8")
    parser.add_argument("--methods", default="gather,ring,dgc", help="any of gather,ring,dgc (default: all)")
    parser.add_argument("--densities", type=_floats, default=list(DGC_DENSITIES),
                        help="DGC densities (default: the warm-up's and the final 0.001)")
    parser.add_argument("--mbps", type=float, default=1000.0, help="link speed up and down, Mbit/s")
    parser.add_argument("--latency-ms", type=float, default=0.1, help="one-way latency per link, ms")
    parser.add_argument("--fp16", action="store_true", help="DGC values as fp16 (6 bytes per entry)")
    parser.add_argument("--dense-below", type=int, default=1024,
                        help="tensors with fewer entries travel dense (ddp.dense_below)")
    parser.add_argument("--frame-bytes", type=int, default=1 << 20, help="collective frame size")
    parser.add_argument("--repeats", type=int, default=1, help="exchanges timed per (W, method)")
    parser.add_argument("--max-gather-world", type=int, default=None,
                        help="skip the dense gather above this W (it is the slowest to emulate)")
    parser.add_argument("--out", default=None, help="folder for sweep_world.png and sweep_world.md")
    args = parser.parse_args(argv)

    kinds = [k.strip() for k in args.methods.split(",") if k.strip()]
    unknown = set(kinds) - {GATHER, RING, DGC}
    if unknown or not kinds:
        parser.error(f"unknown methods {sorted(unknown)}; choose from gather, ring, dgc")
    if any(w < 2 for w in args.worlds):
        parser.error("world sizes must be at least 2")
    methods = [Method(k) for k in (GATHER, RING) if k in kinds]
    if DGC in kinds:
        methods += [Method(DGC, d) for d in args.densities]
    net = NetSpec(args.mbps, args.latency_ms)

    started = time.perf_counter()

    def progress(world: int, batch: list[Result]) -> None:
        cells = " ".join(f"{r.method.name} {r.time_s * 1e3:.2f}" for r in batch)
        print(f"  W={world}: {cells} ms ({sum(r.wall_s for r in batch):.1f} s wall)", file=sys.stderr)

    results = sweep(args.worlds, methods, net, repeats=args.repeats, frame_bytes=args.frame_bytes,
                    dense_below=args.dense_below, fp16=args.fp16, max_gather_world=args.max_gather_world,
                    progress=progress)
    print(f"{net.label}; swept in {time.perf_counter() - started:.1f} s wall", file=sys.stderr)
    print(text_table(results))
    for density, w in crossovers(results).items():
        if any(m.kind == RING for m in methods):
            print(f"density {density:g}: slower than the ring from "
                  f"{'W = ' + str(w) if w is not None else 'no W swept'}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        md = out / "sweep_world.md"
        md.write_text(markdown(results, net, frame_bytes=args.frame_bytes, fp16=args.fp16,
                               dense_below=args.dense_below) + "\n")
        png = plot(results, net, out / "sweep_world.png")
        print(f"wrote {png}\nwrote {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
