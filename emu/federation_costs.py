"""What a federation's server and its clients cost on this machine (FL): each side's decoding, a
client's codec encoding, the server's own work (its rule taking updates, saving a checkpoint); with
real mode's transport, the ``costs`` that core.modes names for fl (``emu calibrate``).  emu.costs has what every mode shares."""

from __future__ import annotations

import numpy as np

from .costs import dim_of, median_cpu_s, transport_only_sets


def fl_sets(scenario, reps: int = 7) -> list[str]:
    """A client's and the controller's decoding, a client's encoding of its update, the controller's
    own work (its rule taking updates, saving a checkpoint), and real mode's transport."""
    from dtemu.core.compression import codecs

    dim = dim_of(scenario)
    fl = scenario.fl
    costs = fl_decode_costs(dim, reps, codecs.CodecParams(fl.codec, chunk=fl.chunk, density=fl.density))
    return transport_only_sets(scenario, reps, dim) + [
        f"compute.default.decode_s_per_mb={costs['client']:.6e}",
        f"compute.nodes.{scenario.node_names[0]}.decode_s_per_mb={costs['controller']:.6e}",
        f"compute.default.cpu.encode_s_per_mb={fl_encode_cost(scenario, dim, reps):.6e}",
        *[f"compute.nodes.{scenario.node_names[0]}.cpu.{op}_s_per_mb={v:.6e}"
          for op, v in fl_server_costs(scenario, dim, reps).items()]]


def fl_decode_costs(dim: int, reps: int = 7, codec=None) -> dict[str, float]:
    """Seconds per MB for an FL client receiving the model and the controller an update encoded with
    ``codec`` (core.compression.codecs.CodecParams; None: fp32).  Per MB of what travels: a q8
    update is a quarter of the bytes of fp32's and costs more to decode, each byte a float made."""
    import torch

    from dtemu.core.compression import codecs
    from dtemu.core.fl.aggregate import Update, check_update
    from dtemu.core.fl.downlink import HeldModel
    from dtemu.core.wire import messages

    torch.set_num_threads(1)
    w = np.random.default_rng(0).standard_normal(dim).astype(np.float32) * 0.05
    packet = codecs.encode(w, codecs.CodecParams("fp32"))
    blob = messages.encode(messages.ModelBlob.of(1, packet))
    sent = packet if codec is None else codecs.encode(w * 0.1, codec)   # (a delta's size, in the codec)
    update = messages.encode(messages.ClientUpdate(round=1, seed=1, client="client1", num_samples=500,
                                                   kind="delta", steps=8, loss=0.1, packet=sent))

    def client():
        data = bytes(bytearray(blob))
        m = messages.decode(data)
        codecs.decode(m.packet, expected_dim=dim)
        held = HeldModel()
        held.take_full(m.round, data)
        held.weights(dim)

    def controller():
        data = bytes(bytearray(update))
        up = messages.decode(data)
        payload = codecs.decode(up.packet, expected_dim=dim)
        check_update(Update(up.client, up.num_samples, up.kind, payload), dim, None)

    return {"client": median_cpu_s(client, reps) / (len(blob) / 1e6),
            "controller": median_cpu_s(controller, reps) / (len(update) / 1e6),
            "model_bytes": len(blob), "update_bytes": len(update)}


def fl_encode_cost(scenario, dim: int, reps: int = 7) -> float:
    """Seconds per MB of the fp32 delta for a client's codec (fl.codec, with error feedback if the
    scenario uses it) to encode its update."""
    import torch

    from dtemu.core.compression import codecs

    torch.set_num_threads(1)
    fl = scenario.fl
    params = codecs.CodecParams(fl.codec, chunk=fl.chunk, density=fl.density)
    delta = np.random.default_rng(1).standard_normal(dim).astype(np.float32) * 0.01
    feedback = codecs.ErrorFeedback(params) if fl.error_feedback and fl.codec != "fp32" else None
    encode = (lambda: feedback.encode(delta)) if feedback else (lambda: codecs.encode(delta, params))
    return median_cpu_s(encode, reps) / (delta.nbytes / 1e6)


def fl_server_costs(scenario, dim: int, reps: int = 7) -> dict[str, float]:
    """Seconds per MB of the controller's own work (core.fl.steps): its rule taking a round's updates
    (``sum``, per MB of the fp32 updates: as many as a round asks for; one under an asynchronous
    rule) with the new model's hash, and saving a checkpoint of the model (``encode``, per MB of
    it: encoding, writing, fsync, as the run folder does)."""
    import torch

    from dtemu.core.compression.codecs import Dense
    from dtemu.core.fl.aggregate import Update
    from dtemu.core.fl.rules import ASYNCHRONOUS, fl_strategy
    from dtemu.core.ml.params import sha256_of
    from dtemu.core.wire.checkpoint import Checkpoint, encode_checkpoint

    torch.set_num_threads(1)
    rng = np.random.default_rng(2)
    weights = rng.standard_normal(dim).astype(np.float32) * 0.05
    rule = fl_strategy(scenario)
    if scenario.fl.algorithm in ASYNCHRONOUS:
        delta, n = rng.standard_normal(dim).astype(np.float32) * 0.01, 1
        take = lambda: sha256_of(rule.apply(weights.copy(), delta, 1, weights))
    else:
        n = max(1, scenario.fl.asked_per_round)
        updates = [Update(f"client{i}", 500, "delta", Dense(rng.standard_normal(dim).astype(np.float32) * 0.01))
                   for i in range(n)]
        take = lambda: sha256_of(rule.aggregate(weights.copy(), updates))
    return server_costs(take, n, lambda: encode_checkpoint(
        Checkpoint(1, weights, scenario.digest(), {"rounds_completed": 1}, rule.state())), dim, reps)


def server_costs(take, updates: int, checkpoint, dim: int, reps: int) -> dict[str, float]:
    """CPU seconds per MB of a server's ``take()`` of ``updates`` fp32 updates (``sum``) and of writing
    ``checkpoint()``'s bytes as the run folder does (``encode``, per MB of the model: its CPU; the
    fsync's wait for the disk is no CPU of the machine's, and goes unpriced)."""
    import tempfile
    from pathlib import Path

    from dtemu.host.rundir import atomic_write

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "checkpoint.dtck"
        save = median_cpu_s(lambda: atomic_write(path, checkpoint()), reps)
    mb = 4 * dim / 1e6
    return {"sum": median_cpu_s(take, reps) / (updates * mb), "encode": save / mb}
