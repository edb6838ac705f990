"""How long a node's compute takes in virtual time.

The PyTorch work really runs (its result is real); the clock advances by a
model of it instead of by this machine's wall time, so that a scenario's
timeouts and stragglers are decided the same way on any machine:

    duration = samples * train_s_per_sample * slowdown * (1 + U(-jitter, +jitter)) * spread factor
               (+ warmup_s * slowdown on a node's first training steps, step by step)

(``spread`` and ``spread_per_sample``, emu only: the calibrated machine's own variation of a job,
mean 1; real mode's machines vary by themselves, so ``stretch`` leaves it out.)

``compute.<node>.schedule`` and ``.varying`` make the slowdown change over time:
a job takes the slowdown in force when it starts (``slowdown_at``), a step of the
schedule from its ``at_s`` on, times a factor the seeded random process draws per
period.  Without them the arithmetic is the one above, unchanged.

Real mode uses the same model to stage a straggler (``stretch``) and to time
a crash halfway through a job (``core.runtime.driver``).

``train_s_per_sample`` defaults to the model's reference cost (core.models),
measured on the reference machine.  dtemu's own evaluation is the experimenter's
instrument, not part of the emulated system, so it takes no virtual time; a
client's evaluation that the federation asks for (a Flower app's evaluate call,
``client_eval``) costs its examples times ``eval_s_per_sample``, a query call
``query_s``, and a Flower ServerApp's work between grid calls (``server_app``) the MB of
arrays it handled times ``app_s_per_mb``, each with the node's slowdown.

The work a role does outside training (``CPU_OPS``: encoding a payload, summing,
sparsifying, applying the update) takes, in emu, the bytes it works on times
``compute.cpu.<op>_s_per_mb`` (this machine's measured rates; 0 by default: free).
Neither slowdown nor jitter applies to it: real mode stages a straggler on its
training alone, and the jitter stream is training's.
"""

from __future__ import annotations

import numpy as np

from dtemu.core.errors import ScenarioError

from dtemu.core.runtime.compute_spec import ComputeSpec

# Kinds of Compute that are CPU work outside training, priced per MB (``Compute.nbytes``).
CPU_OPS = ("encode", "sum", "sparsify", "merge", "densify", "apply")
# A client's evaluation the federation asks for, and a query call: priced by their own keys.
CLIENT_EVAL, QUERY = "client_eval", "query"
# A Flower ServerApp's own work between grid calls, priced per MB of the arrays it handled.
SERVER_APP = "server_app"


class ComputeTimer:
    """One node's compute model; jitter is drawn from the node's own seeded stream."""

    def __init__(self, spec: ComputeSpec, reference_s_per_sample: float | None, seed, batch: int | None = None,
                 spread_draw: int = 0):
        self.cost = spec.train_s_per_sample or reference_s_per_sample
        self.slowdown = spec.slowdown
        self.s_per_sample = None if self.cost is None else self.cost * spec.slowdown
        self.jitter = spec.jitter
        self.rng = np.random.default_rng(seed)
        self.seed = list(seed) if isinstance(seed, (list, tuple)) else [seed]
        # Emu: the calibrated machine's own variation of a training job (``spread``), from a stream
        # of its own, so that a scenario's jitter draws are the same with or without it; another
        # ``spread_draw`` (compute.spread_draw) is another draw of the same variation.
        self.spread = getattr(spec, "spread", 0.0) or 0.0
        self.spread_per_sample = getattr(spec, "spread_per_sample", 0.0) or 0.0
        self.spread_rng = np.random.default_rng([*self.seed, 0x5D, *([spread_draw] if spread_draw else [])])
        # A fresh process's start-up in its first training steps (its lazy set-up), step by step, a
        # step being ``batch`` samples (without one: all of it in the first job).
        warmup = getattr(spec, "warmup_s", 0.0) or 0.0
        self.warmup = list(warmup) if isinstance(warmup, list) else [warmup]
        self.batch = batch
        self.schedule = tuple(spec.schedule)
        self.varying = spec.varying
        # Emu: CPU seconds per MB of a received message before the role gets it (0: none).
        self.decode_s_per_mb = getattr(spec, "decode_s_per_mb", 0.0) or 0.0
        # Emu: CPU seconds per message sent and received, whatever its size (0: none).
        self.send_s_per_message = getattr(spec, "send_s_per_message", 0.0) or 0.0
        self.recv_s_per_message = getattr(spec, "recv_s_per_message", 0.0) or 0.0
        # Emu: and per MB of it, the transport's own on either side (0: none).
        self.send_s_per_mb = getattr(spec, "send_s_per_mb", 0.0) or 0.0
        self.recv_s_per_mb = getattr(spec, "recv_s_per_mb", 0.0) or 0.0
        # Emu, in a sealed run: CPU seconds per MB to seal a message sent and to open one received.
        self.seal_s_per_mb = getattr(spec, "seal_s_per_mb", 0.0) or 0.0
        self.eval_s_per_sample = getattr(spec, "eval_s_per_sample", 0.0) or 0.0
        self.query_s = getattr(spec, "query_s", 0.0) or 0.0
        self.app_s_per_mb = getattr(spec, "app_s_per_mb", 0.0) or 0.0
        # Emu: CPU seconds per MB of each op outside training (CPU_OPS; 0: free).
        cpu = getattr(spec, "cpu", None)
        self.cpu_s_per_mb = {op: getattr(cpu, f"{op}_s_per_mb", 0.0) if cpu is not None else 0.0
                             for op in CPU_OPS}

    @property
    def changing(self) -> bool:
        """Does the slowdown change over time?"""
        return bool(self.schedule) or self.varying is not None

    def slowdown_at(self, now: float) -> float:
        """The slowdown in force at ``now`` (the runtime's clock)."""
        slowdown = self.slowdown
        for step in self.schedule:
            if step.at_s <= now:
                slowdown = step.slowdown
        if self.varying is not None:
            period = int(now // self.varying.period_s)
            draw = np.random.default_rng([*self.seed, 0x5105, period]).uniform(
                np.log(self.varying.low), np.log(self.varying.high))
            slowdown *= float(np.exp(draw))
        return slowdown

    @property
    def modelled(self) -> bool:
        """Is a cost per sample known (the scenario's, or the model's reference cost)?"""
        return self.cost is not None

    def _factor(self) -> float:
        return 1.0 + (self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0)

    def duration(self, samples: int, kind: str = "train", now: float = 0.0, nbytes: int = 0) -> float:
        """Modelled seconds of ``samples`` samples of ``kind`` work started at ``now`` (training),
        or of an op of CPU_OPS on ``nbytes`` bytes; other kinds take no time."""
        if kind in self.cpu_s_per_mb:
            return nbytes * self.cpu_s_per_mb[kind] / 1e6
        if kind == CLIENT_EVAL:
            return samples * self.eval_s_per_sample * self.slowdown_at(now)
        if kind == QUERY:
            return self.query_s * self.slowdown_at(now)
        if kind == SERVER_APP:
            return nbytes * self.app_s_per_mb / 1e6 * self.slowdown_at(now)
        if kind != "train" or samples <= 0:
            return 0.0
        if self.cost is None:
            raise ScenarioError("compute.default.train_s_per_sample", "the model has no reference cost (a model factory, or a task without train_s_per_sample): "
                                "set it, e.g. from `emu calibrate`")
        per_sample = self.cost * self.slowdown_at(now) if self.changing else self.s_per_sample
        warmup = self._warmup(samples)
        return samples * per_sample * self._factor() * self._spread(samples) + warmup * per_sample / self.cost

    def _warmup(self, samples: int) -> float:
        """The warm-up of a training job of ``samples`` samples: that of the node's steps it holds."""
        steps = len(self.warmup) if not self.batch else -(-samples // self.batch)
        taken, self.warmup = self.warmup[:steps], self.warmup[steps:]
        return sum(taken)

    def _spread(self, samples: int) -> float:
        """A training job's factor for the machine's own variation: uniform with mean 1 and the
        standard deviation of its two parts (``spread``, and ``spread_per_sample`` over the square
        root of its samples), kept above 0."""
        if not (self.spread or self.spread_per_sample):
            return 1.0
        sd = (self.spread ** 2 + self.spread_per_sample ** 2 / samples) ** 0.5
        half = min(sd * 3 ** 0.5, 0.9)
        return 1.0 + float(self.spread_rng.uniform(-half, half))

    def stretch(self, kind: str = "train", now: float = 0.0) -> float:
        """How many times its measured time a job started at ``now`` should take on this node
        (real mode stages a straggler by idling for the rest): the slowdown, with jitter."""
        if kind != "train" or (self.slowdown == 1 and not self.jitter and not self.changing):
            return 1.0
        return (self.slowdown_at(now) if self.changing else self.slowdown) * self._factor()
