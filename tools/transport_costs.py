"""What a received message costs a node's CPU on this machine, and emu's keys that model
real mode's transport (issue 15, part 4; docs/netns.md).

    python -m tools.transport_costs --scenario scenarios/fl_codecs.yaml

The receiving cost is measured, not fitted: the code real mode runs on a message after
its last byte arrived is timed here on messages of the scenario's model, median of a
few repetitions, in one thread (as the ranks run):

* FL client, a ModelBlob: one copy (the transport's reassembly into its buffer), the
  message decoded, its fp32 packet checked, then decoded again into the weights (as
  ``core.fl.client`` and ``core.fl.downlink.HeldModel`` do before training);
* FL controller, a ClientUpdate: one copy, the message and its packet decoded, the
  update checked (``core.fl.controller._collect``, ``core.fl.aggregate.check_update``);
* DDP, one collective frame: one copy and the frame's header parsed and its payload
  copied out (``core.ddp.collectives``).

Each is given in seconds per MB (1e6 bytes) of message, the unit of
``compute.<node>.decode_s_per_mb``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from dtemu.core.modes import MODES
from dtemu.real.config import whc_high_bytes, writer_history

FL_WINDOW = whc_high_bytes()  # real mode's writer history outside DDP ("2MiB", or $DTEMU_DDS_WHC_HIGH)


def run_window(mode: str, model_params: int, real_dir=None) -> int:
    """The writer history (bytes) a real run of ``mode`` had: what its ranks' summaries
    recorded (``real.writer_history``), else what real mode would choose now
    (``real.config.writer_history``).  Emu's ``network.send_window_bytes`` follows it."""
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


def _median_s(fn, reps: int = 7) -> float:
    fn()  # warm
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fl_decode_costs(dim: int, reps: int = 7) -> dict[str, float]:
    """Seconds per MB for an FL client receiving the model and the controller an fp32 update."""
    import torch

    from dtemu.core.compression import codecs
    from dtemu.core.fl.aggregate import Update, check_update
    from dtemu.core.fl.downlink import HeldModel
    from dtemu.core.wire import messages

    torch.set_num_threads(1)
    w = np.random.default_rng(0).standard_normal(dim).astype(np.float32) * 0.05
    packet = codecs.encode(w, codecs.CodecParams("fp32"))
    blob = messages.encode(messages.ModelBlob.of(1, packet))
    update = messages.encode(messages.ClientUpdate(round=1, seed=1, client="client1", num_samples=500,
                                                   kind="delta", steps=8, loss=0.1, packet=packet))

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

    return {"client": _median_s(client, reps) / (len(blob) / 1e6),
            "controller": _median_s(controller, reps) / (len(update) / 1e6),
            "model_bytes": len(blob), "update_bytes": len(update)}


def ddp_decode_cost(reps: int = 7) -> float:
    """Seconds per MB for a DDP rank receiving one full collective frame."""
    from dtemu.core.ddp import collectives

    size = collectives.FRAME_BYTES
    frame = bytes(64) + np.random.default_rng(0).bytes(size)

    def receive():
        data = bytes(bytearray(frame))
        head = memoryview(data)[:64]
        bytes(head)
        np.frombuffer(memoryview(data)[64:], dtype=np.uint8).copy()

    return _median_s(receive, reps) / (len(frame) / 1e6)


def transport_sets(decode: dict[str, float], window: int = FL_WINDOW) -> list[str]:
    """emu --set overrides of real mode's transport: headers, writer history, decoding per node."""
    sets = ["network.framing=rtps", f"network.send_window_bytes={window}"]
    sets += [f"compute.nodes.{node}.decode_s_per_mb={cost:.6g}" for node, cost in sorted(decode.items())]
    return sets


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="transport_costs", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="scenarios/fl_codecs.yaml")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    from dtemu.core.ml.params import num_params
    from dtemu.core.ml.models import build_model
    from dtemu.host.scenario_file import load_scenario

    scenario = load_scenario(args.scenario, [])
    dim = num_params(build_model(scenario.model, scenario.seed))
    out = {"fl": fl_decode_costs(dim, args.reps), "ddp_frame_s_per_mb": ddp_decode_cost(args.reps)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
