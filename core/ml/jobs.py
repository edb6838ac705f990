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
one pass counts (``finish``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dtemu.core.ml.models import build_model
from dtemu.core.ml.params import flatten, load_flat
from dtemu.core.ml.evaluation import EVAL_BATCH, evaluate
from dtemu.core.ml.task import task_of
from dtemu.core.ml.train import TrainResult, train_local


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

    def split(self, parts: int) -> list[TrainJob]:
        return [self]  # one client's training is one sequence of steps

    def finish(self, results: list):
        return results[0]


def run_train_job(job: TrainJob, dataset, model=None) -> tuple[np.ndarray, TrainResult]:
    """(new weights, TrainResult) of ``job`` on ``dataset``; ``model``: a module to reuse (built if None)."""
    if model is None:
        model = build_model(job.model, seed=job.model_seed)
    load_flat(model, job.weights)
    result = train_local(model, dataset.x_train, dataset.y_train, job.indices, epochs=job.epochs,
                         batch_size=job.batch_size, lr=job.lr, momentum=job.momentum,
                         weight_decay=job.weight_decay, seed=job.seed, proximal_mu=job.proximal_mu,
                         task=task_of(job.model))
    return flatten(model), result


@dataclass(frozen=True, eq=False)
class EvalJob:
    """The accuracy of ``weights`` on test samples [start, stop) (``Workload.evaluate``'s work)."""

    model: str
    model_seed: int
    weights: np.ndarray
    start: int
    stop: int

    def split(self, parts: int) -> list[EvalJob]:
        """At most ``parts`` jobs over whole batches, in order; their counts add up to this one's."""
        batches = -(-(self.stop - self.start) // EVAL_BATCH)
        per = -(-batches // max(1, parts))
        return [EvalJob(self.model, self.model_seed, self.weights, start, min(self.stop, start + per * EVAL_BATCH))
                for start in range(self.start, self.stop, per * EVAL_BATCH)] or [self]

    def finish(self, results: list[tuple[int, int]]) -> float:
        """The accuracy from the parts' (correct, total)."""
        return sum(c for c, _ in results) / sum(t for _, t in results)


def run_eval_job(job: EvalJob, dataset, model=None) -> tuple[int, int]:
    """(correct, total) of ``job``'s weights on its test samples."""
    if model is None:
        model = build_model(job.model, seed=job.model_seed)
    load_flat(model, job.weights)
    return evaluate(model, dataset.x_test[job.start:job.stop], dataset.y_test[job.start:job.stop],
                    batch_size=EVAL_BATCH, task=task_of(job.model))
