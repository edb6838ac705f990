"""A client's training as data: a job that can run in this process or in another one.

``Workload.train`` is a closure over the workload; a runtime that spreads the
clients of a round over worker processes (``emu --jobs N``, ``--executor ray``)
needs the same work as a picklable description instead: the model's name and
seed, the starting weights, the sample indices into the data set every worker
holds one copy of, the seed and the hyper-parameters.  ``run_train_job`` is the
one function both paths call, so a job gives bit-identical weights wherever it
runs (the models hold no state outside their weights; each job loads them).
An evaluation is a job too (``EvalJob``): it splits into whole batches of the
test set, so its parts can run on several workers and still count exactly what
one pass counts (``finish``).  So is one forward and backward pass (``GradientJob``:
a ddp worker's step, a geo worker's), whose result the role writes into its model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dtemu.core.ml.models import build_model
from dtemu.core.ml.params import flatten, grads_vector, load_flat, load_grads, zero_gradients
from dtemu.core.ml.evaluation import EVAL_BATCH, evaluate
from dtemu.core.ml.task import task_of
from dtemu.core.runtime.requests import Compute
from dtemu.core.ml.train import TrainResult, compute_gradients, train_local


@dataclass(frozen=True, eq=False)
class TrainJob:
    """One client's training of one round."""

    model: str  # a model name, "package.module:factory" or "task:" + a task (core.ml.models.build_model)
    model_seed: int  # builds the module; the weights below replace its initial values
    weights: np.ndarray  # float32, the starting point
    indices: np.ndarray  # int64 into the data set's training samples
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    seed: int  # batch order and dropout
    proximal_mu: float = 0.0  # FedProx's term (core.ml.train.train_local); 0: none
    device: str = "cpu"  # where it trains (the data set it is run on must be there too)

    def split(self, parts: int) -> list[TrainJob]:
        return [self]  # one client's training is one sequence of steps

    def finish(self, results: list):
        return results[0]


def run_train_job(job: TrainJob, dataset, model=None) -> tuple[np.ndarray, TrainResult]:
    """(new weights, TrainResult) of ``job`` on ``dataset``; ``model``: a module to reuse (built if None)."""
    if model is None:
        model = build_model(job.model, seed=job.model_seed).to(job.device)
    load_flat(model, job.weights)
    result = train_local(model, dataset.x_train, dataset.y_train, job.indices, epochs=job.epochs,
                         batch_size=job.batch_size, lr=job.lr, momentum=job.momentum,
                         weight_decay=job.weight_decay, seed=job.seed, proximal_mu=job.proximal_mu,
                         task=task_of(job.model))
    return flatten(model), result


class GradientJob:
    """One forward and backward pass of a worker's model on a batch (a ddp or geo worker's step):
    its result is (loss, the parameters' gradients, the state after: a batch norm's running
    statistics move in a training pass), which ``take_gradients`` writes into the worker's model.

    It holds the worker's model until it is pickled (handed to a worker process, at the Compute's
    start, before the role goes on), and only then copies its state (``flatten``): a run without
    worker processes never pays for the copy."""

    def __init__(self, model: str, model_seed: int, source, indices: np.ndarray, seed: int, device: str = "cpu"):
        self.model, self.model_seed = model, model_seed
        self.source = source          # the worker's nn.Module; its flat state once pickled
        self.indices, self.seed = indices, seed   # the batch into the training samples; dropout's seed
        self.device = device          # where it runs (the data set it is run on must be there too)

    @property
    def state(self) -> np.ndarray:
        return self.source if isinstance(self.source, np.ndarray) else flatten(self.source)

    def __getstate__(self):
        return {**self.__dict__, "source": self.state}

    def split(self, parts: int) -> list[GradientJob]:
        return [self]

    def finish(self, results: list):
        return results[0]


def run_gradient_job(job: GradientJob, dataset, model=None):
    if model is None:
        model = build_model(job.model, seed=job.model_seed).to(job.device)
    load_flat(model, job.state)
    loss = compute_gradients(model, dataset.x_train, dataset.y_train, job.indices, seed=job.seed,
                             task=task_of(job.model))
    return loss, grads_vector(list(model.parameters())), flatten(model)


def take_gradients(model, result) -> float:
    """Write a gradient job's result into ``model`` (its gradients and state); returns the loss."""
    loss, grads, state = result
    if grads is None:   # computed in ``model`` itself (no worker process: ``Workload.gradient_step``)
        return loss
    load_flat(model, state)
    zero_gradients(model)   # (makes the gradients a model has none of yet)
    load_grads(list(model.parameters()), grads)
    return loss


def gradient_pass(work, model, batch, rank: int, step: int):
    """A ddp or geo worker's forward and backward pass, for the role to ``yield from``: its loss,
    with ``model``'s gradients filled, whether it ran here or in a worker process (a workload
    without ``gradient_step``, a test's stand-in, always runs here)."""
    if hasattr(work, "gradient_step"):
        return take_gradients(model, (yield work.gradient_step(model, batch, rank, step)))
    return (yield Compute(lambda: work.gradients(model, batch, rank, step), samples=len(batch)))


@dataclass(frozen=True, eq=False)
class EvalJob:
    """The accuracy of ``weights`` on test samples [start, stop) (``Workload.evaluate``'s work)."""

    model: str
    model_seed: int
    weights: np.ndarray
    start: int
    stop: int
    device: str = "cpu"

    def split(self, parts: int) -> list[EvalJob]:
        """At most ``parts`` jobs over whole batches, in order; their counts add up to this one's."""
        batches = -(-(self.stop - self.start) // EVAL_BATCH)
        per = -(-batches // max(1, parts))
        return [EvalJob(self.model, self.model_seed, self.weights, start, min(self.stop, start + per * EVAL_BATCH),
                        self.device)
                for start in range(self.start, self.stop, per * EVAL_BATCH)] or [self]

    def finish(self, results: list[tuple[int, int]]) -> float:
        """The accuracy from the parts' (correct, total)."""
        return sum(c for c, _ in results) / sum(t for _, t in results)


def run_eval_job(job: EvalJob, dataset, model=None) -> tuple[int, int]:
    """(correct, total) of ``job``'s weights on its test samples."""
    if model is None:
        model = build_model(job.model, seed=job.model_seed).to(job.device)
    load_flat(model, job.weights)
    return evaluate(model, dataset.x_test[job.start:job.stop], dataset.y_test[job.start:job.stop],
                    batch_size=EVAL_BATCH, task=task_of(job.model))
