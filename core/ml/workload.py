"""The learning task of a scenario: its model, its data split, and how to train and test.

Roles see weights only as flat float32 vectors; this class turns those into
PyTorch work.  One instance serves every emulated node of a process (emu runs
them all in one), so the data set is loaded once (by the host, which hands it
over) and the partition is computed once, deterministically from the scenario's seed.
"""

from __future__ import annotations

import copy
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from dtemu.core.errors import ScenarioError
from dtemu.core.ml import data as datasets
from dtemu.core.ml.batches import epoch_order, step_seed
from dtemu.core.ml.models import build_model, model_cost, xavier_init
from dtemu.core.ml.params import flatten, load_flat
from dtemu.core.ml.evaluation import evaluate
from dtemu.core.ml.task import Task, task_of
from dtemu.core.ml.train import LocalTraining, compute_gradients
from dtemu.core.ml.jobs import EvalJob, GradientJob, TrainJob, run_eval_job, run_train_job
from dtemu.core.runtime.requests import Compute

if TYPE_CHECKING:  # (an annotation only: the scenario imports the modes, which import the roles)
    from dtemu.core.scenario import Scenario


def round_seed(seed: int, round_: int, attempt: int = 0) -> int:
    """The seed of one round's TrainCmd (a retried round gets a fresh one)."""
    return int(np.random.SeedSequence([seed, round_, attempt]).generate_state(1, np.uint64)[0] >> 1)


def _client_seed(cmd, client: int) -> int:
    """The seed of a client's training for ``cmd``: its batch order and dropout."""
    return step_seed(cmd.seed, client)


class Workload:
    """``dataset``: the scenario's data, already loaded (``host.datasets.load_for``).  ``device``: where
    every node trains and evaluates ("cpu", or "cuda" as host.devices resolved the scenario's key):
    the models and a copy of the data (``data``) live there; ``dataset`` stays on the CPU (the split
    reads its labels, worker processes are handed it)."""

    def __init__(self, scenario: Scenario, dataset: datasets.Dataset, device: str = "cpu"):
        self.scenario = scenario
        self.dataset = dataset
        self.device = device
        self.data = dataset.to(device)
        self._model = build_model(scenario.model_spec, seed=scenario.seed).to(device)

    # --- data ----------------------------------------------------------
    @cached_property
    def partitions(self) -> list[np.ndarray]:
        """The training set split between the mode's parties (core.modes: Mode.parties)."""
        return self.split(self.scenario.kind.parties(self.scenario))

    def split(self, parties: int) -> list[np.ndarray]:
        """The training set split ``parties`` ways as ``data.partition`` says, from the scenario's seed
        (the same split for the same count, on every node of every runtime)."""
        cache = self.__dict__.setdefault("_splits", {})
        if parties not in cache:
            spec = self.scenario.data
            labels = self.dataset.y_train.numpy()
            if labels.ndim != 1:  # a task's targets that are not one label a sample (a sequence's tokens)
                if spec.partition != "iid":
                    raise ScenarioError("data.partition", f"{spec.partition!r} splits by label, and the task's "
                                                          f"targets are {tuple(labels.shape[1:])} a sample: use iid")
                labels = np.zeros(len(labels), dtype=np.int64)
            cache[parties] = datasets.partition(spec.partition, labels, parties, seed=self.scenario.seed,
                                                alpha=spec.alpha, shards_per_client=spec.shards_per_client)
        return cache[parties]

    def client_indices(self, client: int, cmd) -> np.ndarray:
        """The samples client ``client`` (1-based) trains on for ``cmd``."""
        part = self.partitions[client - 1]
        return datasets.round_subset(part, cmd.subset or None, cmd.seed, cmd.round, client)

    def subset_size(self, client: int, subset: int) -> int:
        n = len(self.partitions[client - 1])
        return n if not subset else min(subset, n)

    @property
    def test_size(self) -> int:
        n = len(self.dataset.y_test)
        limit = self.scenario.data.test_samples
        return n if limit is None else min(n, limit)

    # --- model ---------------------------------------------------------
    @cached_property
    def task(self) -> Task:
        """The loss and what counts as right (core.ml.task): the scenario's task, or classification."""
        return task_of(self.scenario.model_spec)

    @cached_property
    def initial_weights(self) -> np.ndarray:
        return flatten(build_model(self.scenario.model_spec, seed=self.scenario.seed))

    @cached_property
    def xavier_weights(self) -> np.ndarray:
        """Xavier-uniform weights and zero biases from the seed (fl.init xavier: ESync's w^0,
        core.ml.models.xavier_init)."""
        return flatten(xavier_init(build_model(self.scenario.model_spec, seed=self.scenario.seed),
                                   self.scenario.seed))

    @property
    def dim(self) -> int:
        return self.initial_weights.size

    @property
    def reference_cost(self) -> float | None:
        """Modelled training seconds per sample of the scenario's model, if known."""
        return model_cost(self.scenario.model_spec)

    def new_model(self):
        """A fresh model with the scenario's initial weights (every rank gets the same), on the device."""
        return build_model(self.scenario.model_spec, seed=self.scenario.seed).to(self.device)

    # --- data-parallel -------------------------------------------------
    @cached_property
    def steps_per_epoch(self) -> int:
        """Full batches per epoch, the same on every rank so that they stay in step."""
        return min(len(p) for p in self.partitions) // self.scenario.ddp.batch_size

    def worker_batches(self, rank: int, epoch: int) -> list[np.ndarray]:
        shard = self.partitions[rank]
        order = epoch_order(shard, (self.scenario.seed, rank), epoch)
        b = self.scenario.ddp.batch_size
        return [order[i * b : (i + 1) * b] for i in range(self.steps_per_epoch)]

    def gradients(self, model, batch: np.ndarray, rank: int, step: int) -> float:
        return compute_gradients(model, self.data.x_train, self.data.y_train, batch,
                                 seed=self._step_seed(rank, step), task=self.task)

    def _step_seed(self, rank: int, step: int) -> int:
        return step_seed(self.scenario.seed, rank, step)

    def gradient_step(self, model, batch: np.ndarray, rank: int, step: int) -> Compute:
        """A ddp or geo worker's forward and backward pass as a ``Compute``: here, in ``model``
        itself; or, in a worker process (emu --jobs N), as a ``GradientJob`` on the same state,
        whose gradients the role then writes into ``model`` (``core.ml.jobs.take_gradients``:
        either way the role yields this and takes what comes back)."""
        job = GradientJob(self.scenario.model_spec, self.scenario.seed, model, np.asarray(batch),
                          self._step_seed(rank, step), self.device)
        return Compute(lambda: (self.gradients(model, batch, rank, step), None, None), samples=len(batch), job=job)

    def evaluate_shard(self, model, rank: int, world: int) -> tuple[int, int]:
        """(correct, total) on this rank's share of the test set (every world-th sample)."""
        n = self.test_size
        x, y = self.data.x_test[:n][rank::world], self.data.y_test[:n][rank::world]
        return evaluate(model, x, y, task=self.task)

    # --- work ----------------------------------------------------------
    def train(self, weights: np.ndarray, cmd, client: int):
        """Train from ``weights`` as ``cmd`` says; returns (new weights, TrainResult)."""
        return self.run_job(self.train_job(weights, cmd, client))

    def train_job(self, weights: np.ndarray, cmd, client: int) -> TrainJob:
        """The training ``train`` does, as a picklable job (``core.ml.jobs``) for a worker process."""
        fl = self.scenario.fl
        return TrainJob(model=self.scenario.model_spec, model_seed=self.scenario.seed, weights=weights,
                        indices=self.client_indices(client, cmd), epochs=cmd.epochs, batch_size=fl.batch_size,
                        lr=cmd.lr, momentum=fl.momentum, weight_decay=fl.weight_decay,
                        seed=_client_seed(cmd, client), proximal_mu=fl.proximal_mu, device=self.device)

    def local_training(self, weights: np.ndarray, cmd, client: int) -> LocalTraining:
        """``cmd``'s training from ``weights``, a step at a time, in a model of its own (emu interleaves
        the clients of a round): ESync's clients (core.fl.esync).  The same batches, seeds and settings
        as ``train_job``'s, so as many steps as its epochs make give its weights."""
        fl = self.scenario.fl
        model = copy.deepcopy(self._model)
        load_flat(model, weights)
        return LocalTraining(model, self.data.x_train, self.data.y_train, self.client_indices(client, cmd),
                             batch_size=fl.batch_size, lr=cmd.lr, momentum=fl.momentum,
                             weight_decay=fl.weight_decay, seed=_client_seed(cmd, client),
                             proximal_mu=fl.proximal_mu, task=self.task)

    def run_job(self, job: TrainJob):
        """Run ``job`` here, on this process's model and data set."""
        return run_train_job(job, self.data, self._model)

    def evaluate(self, weights: np.ndarray) -> float:
        job = self.eval_job(weights)
        return job.finish([run_eval_job(job, self.data, self._model)])

    def eval_job(self, weights: np.ndarray) -> EvalJob:
        """``evaluate``'s work as a job a runtime with worker processes may split among them."""
        return EvalJob(self.scenario.model_spec, self.scenario.seed, weights, 0, self.test_size, self.device)
