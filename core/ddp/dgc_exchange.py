"""The DGC exchange: sparse, momentum-corrected gradients by allgather (see exchange.py).

After a loss the survivors take the leader's weights and ``DGCSGD`` momentum
buffers, but each keeps its own compressor state (the momentum u and the
unsent velocity v, DGC's local residuals): they are local by design, never
sent, and hold what this rank has not contributed yet.  What a survivor had
put in a payload the group then discarded (a step of the old membership that
not every survivor completed) is not put back: a small, one-off loss of
gradient, like a dropped step.
"""

from __future__ import annotations

from dtemu.core.wire.bucket import decode_bucket, encode_bucket
from dtemu.core.ddp.collectives import Collective
from dtemu.core.ddp.optstate import pack_buffers, unpack_buffers
from dtemu.core.compression.dgc import DGCSGD, DGCCompressor, DGCConfig, average_buckets, param_shapes
from dtemu.core.ml.params import device_of


class DGCExchange:
    def __init__(self, scenario, model, rank: int, world: int, steps_per_epoch: int):
        d = scenario.ddp
        stage = steps_per_epoch if d.warmup_steps_per_stage is None else d.warmup_steps_per_stage
        config = DGCConfig(
            density=d.density,
            sample_ratio=d.sample_ratio,
            momentum=d.momentum,
            nesterov=d.nesterov,
            clip_norm=d.clip_norm,
            weight_decay=d.weight_decay,
            warmup_densities=tuple(d.warmup_densities),
            warmup_steps_per_stage=stage,
            dense_below=d.dense_below,
            fp16_values=d.fp16_values,
            seed=scenario.seed,
        )
        self.params = list(model.parameters())
        self.shapes = param_shapes(model)
        self.world = world
        self.lr = d.lr
        self.compressor = DGCCompressor(self.shapes, config, world, rank)
        self.opt = DGCSGD(self.shapes, config)
        self.sent = 0
        self._handle = None

    def density(self, step: int) -> float:
        return self.compressor.density_at(step)

    def compress(self, step: int) -> bytes:
        return encode_bucket(self.compressor.compress([p.grad for p in self.params], step))

    def send(self, coll: Collective, step: int, payload: bytes):
        self._handle = yield from coll.start_allgather(step, "dgc", payload)
        self.sent = self._handle.bytes_sent
        return self.sent

    def wait(self, coll: Collective, step: int, deadline: float):
        yield from coll.wait(self._handle, deadline, what="dgc allgather")

    def apply(self, coll: Collective, step: int) -> None:
        buckets = [decode_bucket(p, self.shapes, world_size=self.world) for p in coll.collect(self._handle)]
        self.opt.step(self.params, average_buckets(buckets, self.shapes, self.world), self.lr)

    # --- after a loss --------------------------------------------------
    def regroup(self, index: int, size: int) -> None:
        """Buckets carry the rank's place among the survivors and are averaged over them;
        the gradient clipping (clip_norm / sqrt(N)) follows the new N."""
        self.world = size
        self.compressor.rank, self.compressor.world_size = index, size

    def state_bytes(self) -> bytes:
        return pack_buffers(self.opt.buffers())

    def load_state(self, data: bytes) -> None:
        shapes = [shape for _, shape in self.shapes]
        self.opt.load_buffers(unpack_buffers(data, shapes + shapes, device_of(self.params)))
