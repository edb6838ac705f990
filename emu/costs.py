"""What a scenario's roles cost this machine's CPU outside the network: measured, not fitted.

Each function times the code real mode runs, on messages and vectors of the
scenario's model, median of a few repetitions, and says it in the unit of the
emu key that charges it (seconds per MB, 1e6 bytes):

- FL: a client receiving the model (one copy as the transport's reassembly,
  decoded, checked, decoded again into the weights), the controller an update
  (decoded, checked): ``compute.<node>.decode_s_per_mb``;
- DDP: one collective frame received, and the exchange's ops per MB of the gradient
  (``encode``: its compress, DGC's top-k or the dense copy; ``apply``: the group's gradient
  decoded, averaged and stepped into the model);
- geo: a dense payload received, and the roles' own CPU per op
  (``compute.default.cpu``: encode, sum, sparsify, merge, densify, apply);
- every mode: real mode's framing and writer history (``network.framing``,
  ``network.send_window_bytes``).

Each mode names its own (``Mode.costs``, "module:function" returning ``--set``
assignments); ``emu calibrate`` writes them into a profile, and the netns
testbeds (tools/netns_*.py) into their emu replays.  One thread on an idle
core: what ranks sharing cores cost each other is ``compute.shared_cores``.
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from dtemu.core.modes import MODES
from dtemu.core.runtime.compute import CPU_OPS
from dtemu.host import stream_choice
from dtemu.host.writer_history import whc_high_bytes, writer_history

FL_WINDOW = whc_high_bytes()  # real mode's writer history outside DDP ("2MiB", or $DTEMU_DDS_WHC_HIGH)


def median_s(fn, reps: int = 7, clock=time.perf_counter) -> float:
    """The median of ``reps`` timings of ``fn`` (after one to warm it), in ``clock``'s seconds."""
    fn()  # warm
    times = []
    for _ in range(reps):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def median_cpu_s(fn, reps: int = 7) -> float:
    """As ``median_s``, in this process's CPU seconds (every thread's): what an op costs a machine
    whatever its share.  Timed in wall seconds under a quota, a short op either fits in one period
    and shows no share at all or waits out a throttle: the same decode came out 0.62 and 2.56 ms/MB
    in two calibrations (notebook entry 38).  ``emu calibrate`` gives them in the share's seconds."""
    return median_s(fn, reps, time.process_time)


def run_window(mode: str, model_params: int, real_dir=None) -> int:
    """The writer history (bytes) a real run of ``mode`` had: what its ranks' summaries
    recorded (``real.writer_history``), else what real mode would choose now
    (``host.writer_history.writer_history``).  Emu's ``network.send_window_bytes`` follows it."""
    from pathlib import Path

    if real_dir is not None:
        for summary in sorted(Path(real_dir).glob("*/summary.json")):
            try:
                recorded = json.loads(summary.read_text()).get("real", {}).get("writer_history")
            except (OSError, ValueError):
                continue
            if recorded:
                return whc_high_bytes(recorded)
    return whc_high_bytes(writer_history(MODES[mode].all_to_all, model_params))


def ddp_decode_cost(reps: int = 7) -> float:
    """Seconds per MB for a DDP rank receiving one full collective frame."""
    from dtemu.core.ddp import frames

    size = frames.FRAME_BYTES
    frame = bytes(64) + np.random.default_rng(0).bytes(size)

    def receive():
        data = bytes(bytearray(frame))
        head = memoryview(data)[:64]
        bytes(head)
        np.frombuffer(memoryview(data)[64:], dtype=np.uint8).copy()

    return median_cpu_s(receive, reps) / (len(frame) / 1e6)


def geo_decode_cost(dim: int, fp16: bool, reps: int = 7) -> float:
    """Seconds per MB for a rank receiving a dense geo payload of ``dim`` entries: one copy (the
    transport's reassembly), the payload decoded and checked, and made dense (core.geo.receiver)."""
    import numpy as np

    from dtemu.core.geo.payload import decode, encode_dense

    msg = encode_dense(1, np.random.default_rng(0).standard_normal(dim).astype(np.float32) * 0.05, fp16)

    def receive():
        decode(bytes(bytearray(msg)), dim).dense()

    return median_cpu_s(receive, reps) / (len(msg) / 1e6)


def geo_cpu_costs(scenario, reps: int = 7) -> dict[str, float]:
    """{op: seconds per MB of the model's fp32 vector} for ``scenario``'s model and geo settings."""
    import torch

    from dtemu.core.geo.bisparse import ResidualSparsifier, whole_blocks
    from dtemu.core.geo.common import Applier, site_downlink, worker_optimizer_momentum
    from dtemu.core.ml.params import grads_vector
    from dtemu.core.geo.payload import decode, encode_dense, sum_sparse
    from dtemu.core.geo.roles import _encode_bisparse
    from dtemu.core.geo.common import site_share
    from dtemu.core.ml.models import build_model

    torch.set_num_threads(scenario.threads)
    g = scenario.geo
    model = build_model(scenario.model_spec, scenario.seed)
    sizes = [p.numel() for p in model.parameters()]
    dim = sum(sizes)
    mb = 4 * dim / 1e6
    rng = np.random.default_rng(0)

    def vec() -> np.ndarray:
        return (rng.standard_normal(dim) * 1e-2).astype(np.float32)

    for p in model.parameters():
        p.grad = torch.from_numpy(rng.standard_normal(p.numel()).astype(np.float32)).view_as(p)
    n = max(1, g.workers_per_site)
    pushes = {f"w{i}": (decode(encode_dense(1, vec(), g.fp16), dim), b"") for i in range(n)}
    costs = {
        "encode": median_cpu_s(lambda: encode_dense(1, grads_vector(model.parameters()), g.fp16), reps) / mb,
        "sum": median_cpu_s(lambda: site_share(pushes, list(pushes), dim, 2 * n, n, g.sync), reps) / mb / n,
    }
    applier = Applier(model, g.lr_at, worker_optimizer_momentum(g), False)
    update = vec() * np.float32(1e-3)
    costs["apply"] = median_cpu_s(lambda: applier.apply(update, 1), reps) / mb

    # BiSparse: each site's sparsifier after a few rounds (its residual is what it would be), the
    # sites' payloads as the global PS gets them, their merged aggregate as a local PS gets it.
    sites = 2
    blocks = whole_blocks(sizes, g.dense_below)
    sparsifiers = [ResidualSparsifier(sizes, g.density, g.sample_ratio, g.residual_momentum, scenario.seed, s,
                                      g.dense_below, g.momentum_masking, half_whole=g.fp16) for s in range(sites)]
    r = 5
    for r in range(1, 6):
        payloads = [decode(_encode_bisparse(r, dim, sp.blocks, *sp.compress(vec(), r, g.density), g.fp16), dim)
                    for sp in sparsifiers]
    share = vec()
    costs["sparsify"] = median_cpu_s(lambda: _encode_bisparse(
        r, dim, sparsifiers[0].blocks, *sparsifiers[0].compress(share, r, g.density), g.fp16), reps) / mb
    costs["merge"] = median_cpu_s(lambda: _encode_bisparse(r, dim, blocks, *sum_sparse(payloads, dim), g.fp16),
                               reps) / mb / sites
    merged = _encode_bisparse(r, dim, blocks, *sum_sparse(payloads, dim), g.fp16)
    pull = decode(merged, dim)
    costs["densify"] = median_cpu_s(lambda: site_downlink(pull, merged, g.fp16), reps) / mb
    assert set(costs) == set(CPU_OPS)
    return costs


def seal_cost(reps: int = 7) -> float:
    """CPU seconds per MB of what a sealed run adds on the sender and on each receiver, the mean of
    the two sides (``compute.seal_s_per_mb``; charged only where emu runs with a key): the message's
    seal and its opening (core.wire.auth: an HMAC-SHA256 over its bytes, and the copies each makes),
    and the tag on each of its DDS frames, made on the sender and checked on each receiver
    (core.wire.frame_auth: a keyed BLAKE2b over every byte again, and the frame joined behind it).
    CPU seconds, as real.message_costs' are: emu.calibrate divides both by a machine's share."""
    from dtemu.core.wire import frame_auth
    from dtemu.core.wire.auth import Sealer

    data = np.random.default_rng(0).bytes(1 << 20)
    sender = Sealer(bytes(32), "a")
    sealed = sender.seal("t", 1, data)
    fkey, frame = frame_auth.frame_key(bytes(32)), 1 << 18   # (real mode's frames are up to 1 MiB)
    head = ("topic", "a", "b", "t", 1, 0, 4, len(data))
    chunks = [memoryview(data)[i:i + frame] for i in range(0, len(data), frame)]
    tagged = [frame_auth.frame_tag(fkey, *head, c) + c for c in chunks]
    # (a fresh receiver each time: one that has opened a message refuses it again as a replay)
    both = (median_cpu_s(lambda: sender.seal("t", 1, data), reps)
            + median_cpu_s(lambda: [frame_auth.frame_tag(fkey, *head, c) + c for c in chunks], reps)
            + median_cpu_s(lambda: Sealer(bytes(32), "b").open("t", "a", sealed), reps)
            + median_cpu_s(lambda: [frame_auth.check(fkey, *head, t) for t in tagged], reps))
    return both / 2 / (len(data) / 1e6)


def transport_sets(decode: dict[str, float], window: int = FL_WINDOW, stream: bool | None = None) -> list[str]:
    """emu --set overrides of real mode's transport: headers, writer history, decoding per node.
    ``stream`` (default: whether real mode between machines would use it now, host.stream_choice):
    large payloads on its TCP stream (paced by the same writer history: emu.network)."""
    if stream is None:
        stream = stream_choice.stream_on("lan")
    sets = [f"network.framing={'stream' if stream else 'rtps'}", f"network.send_window_bytes={window}"]
    sets += [f"compute.nodes.{node}.decode_s_per_mb={cost:.6g}" for node, cost in sorted(decode.items())]
    return sets


def cpu_sets(costs: dict[str, float], shared_cores: int = 0, messages: dict[str, float] | None = None) -> list[str]:
    """emu --set overrides: every node's CPU rates (compute.default.cpu), the cost of a message
    (``message_costs``) and the shared cores."""
    # .6e: YAML reads 9e-05 as a string, 9.000000e-05 as a number
    sets = [f"compute.default.cpu.{op}_s_per_mb={costs[op]:.6e}" for op in CPU_OPS]
    if messages:
        sets += [f"compute.default.{side}_s_per_message={messages[side]:.6e}" for side in ("send", "recv")]
    if shared_cores:
        sets.append(f"compute.shared_cores={shared_cores}")
    return sets


def dim_of(scenario) -> int:
    from dtemu.core.ml.models import build_model
    from dtemu.core.ml.params import num_params

    return num_params(build_model(scenario.model_spec, scenario.seed))


# --- each mode's costs (core.modes names them: Mode.costs) ---------------------------------

def transport_only_sets(scenario, reps: int = 7, dim: int | None = None) -> list[str]:
    """Real mode's transport: its framing and the writer history its run would have (the base of
    every mode's costs; a mode that names no costs of its own gets this alone)."""
    return transport_sets({}, run_window(scenario.mode, dim or dim_of(scenario)))


def ddp_sets(scenario, reps: int = 7) -> list[str]:
    """A collective frame's decoding on every rank, the exchange's two ops (compressing a gradient,
    applying the group's), and real mode's transport (a deep writer history)."""
    ops = ddp_exchange_costs(scenario, reps)
    return (transport_only_sets(scenario, reps) + [f"compute.default.decode_s_per_mb={ddp_decode_cost(reps):.6e}"]
            + [f"compute.default.cpu.{op}_s_per_mb={v:.6e}" for op, v in ops.items()])


def ddp_exchange_costs(scenario, reps: int = 7) -> dict[str, float]:
    """Seconds per MB of the fp32 gradient of a DDP worker's ``encode`` (the exchange's compress:
    DGC's momentum correction and top-k at the first step's density, or the dense copy) and
    ``apply`` (the group's payloads decoded, averaged and stepped into the model), on this
    machine, one thread, the scenario's model and world size."""
    import types

    import torch

    from dtemu.core.ddp.worker import make_exchange
    from dtemu.core.ml.models import build_model

    world = max(1, len(scenario.node_names))
    gen = torch.Generator().manual_seed(0)
    exchanges = []
    for rank in range(world):  # each rank's payload (DGC's buckets say whose they are)
        model = build_model(scenario.model_spec, scenario.seed)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen) * 1e-2
        exchanges.append(make_exchange(scenario, model, rank, world, steps_per_epoch=1 << 20))
    exchange = exchanges[0]
    mb = 4 * sum(p.numel() for p in model.parameters()) / 1e6
    payloads = [x.compress(0) for x in exchanges]
    encode = median_cpu_s(lambda: exchange.compress(0), reps) / mb
    # apply() as after a collective: the group's payloads for an allgather, the mean in place for
    # a ring or the pipelined allreduce (the exchange's own fields)
    group = types.SimpleNamespace(collect=lambda handle: payloads)
    exchange._handle = object()
    if getattr(exchange, "algorithm", "gather") != "gather":
        exchange._mean = exchange._flat.copy()
    return {"encode": encode, "apply": median_cpu_s(lambda: exchange.apply(group, 0), reps) / mb}


def geo_sets(scenario, reps: int = 7) -> list[str]:
    """A dense payload's decoding on every rank, the roles' CPU per op, and real mode's transport."""
    dim = dim_of(scenario)
    decode = geo_decode_cost(dim, scenario.geo.fp16, reps)
    return (transport_only_sets(scenario, reps, dim) + [f"compute.default.decode_s_per_mb={decode:.6e}"]
            + cpu_sets(geo_cpu_costs(scenario, reps)))


def flower_sets(scenario, reps: int = 7) -> list[str]:
    """A Flower app's training and evaluation cost per example: its ClientApp's train and evaluate calls
    timed in a short emulated run of the app itself (one round, ``reps`` + 1 clients; the first call,
    which loads the data, left out), the median of CPU seconds over the examples each reports; and its
    ServerApp's own work between grid calls, per MB of the arrays it handled (server_app events).  An
    app's model is its own, so this is the only way to time it.  The CPU seconds of the thread that ran
    each (an app training on several torch threads is priced short by the others'), as every op's
    (``median_cpu_s``): a call's wall time under a CPU share held whatever else the emulated run did
    meanwhile, and so did the process's CPU (notebook entries 38, 39)."""
    import tempfile
    from pathlib import Path

    from dtemu.core import events as ev
    from dtemu.core.errors import ScenarioError
    from dtemu.core.flower.replies import is_train
    from dtemu.core.scenario import parse_scenario
    from dtemu.emu.run import run_emulation

    raw = scenario.to_dict()
    raw["fl"]["clients"] = min(scenario.fl.clients, reps + 1)
    raw["flower"]["run_config"] = {**raw["flower"]["run_config"], "num-server-rounds": 1}
    # (the run needs some cost per example to run in virtual time; what is measured is the wall time)
    raw["compute"]["default"]["train_s_per_sample"] = raw["compute"]["default"]["train_s_per_sample"] or 1e-4
    with tempfile.TemporaryDirectory() as folder:
        run_emulation(parse_scenario(raw), folder)
        calls = [json.loads(line) for line in (Path(folder) / "events.jsonl").read_text().splitlines()]
    rates = [e["cpu_s"] / e["examples"] for e in calls
             if e["kind"] == ev.FLOWER_CALL and is_train(e["type"]) and e["examples"]]
    if len(rates) < 2:
        raise ScenarioError("flower", "the app's train calls report no examples (flower.examples_key): "
                                      "nothing to price its training by")
    sets = [f"compute.default.train_s_per_sample={statistics.median(rates[1:]):.6e}"]
    # Its evaluate calls likewise (the first of them loads the test data: left out where there are more)
    evals = [e["cpu_s"] / e["examples"] for e in calls
             if e["kind"] == ev.FLOWER_CALL and e["type"].split(".")[0] == "evaluate" and e["examples"]]
    if evals:
        sets.append(f"compute.default.eval_s_per_sample={statistics.median(evals[1:] or evals):.6e}")
    # The ServerApp's own work between its grid calls, per MB of the arrays it handled: its thread's
    # CPU seconds over their MB, summed over its calls after the first (which includes the app's start)
    gaps = [e for e in calls if e["kind"] == ev.SERVER_APP][1:]
    mb = sum(e["nbytes"] for e in gaps) / 1e6
    if mb > 0:
        sets.append(f"compute.default.app_s_per_mb={sum(e['cpu_s'] for e in gaps) / mb:.6e}")
    return sets
