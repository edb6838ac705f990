"""What a scenario learns: its model, its data, its training step's loss, and what counts as right.

A scenario names a task (``task: package.module:Name``): a class, or a function
that returns the task object, which has

- ``model() -> torch.nn.Module``: a fresh model; its initial weights come from
  torch's global RNG, which the caller seeds (core.ml.models.build_model);
- ``data()``: the data set, a ``core.ml.data.Dataset`` or
  ``(x_train, y_train, x_test, y_test)``; inputs and targets keep their dtype
  (token ids stay integers), called once per process by the host;

and, where the defaults below do not fit,

- ``loss(output, target)``: the mean loss of a batch (default: cross-entropy);
- ``loss_sum(output, target)``: the summed loss, for evaluation (default: cross-entropy, summed);
- ``correct(output, target) -> (right, counted)``: how many predictions are right of how many
  (default: argmax over dimension 1 equals the target, one per sample);
- ``train_s_per_sample``: emu's modelled training cost on the reference machine (default: none,
  so the scenario sets ``compute.default.train_s_per_sample``; ``emu calibrate`` measures it);
- ``optimizer(params, lr, momentum, weight_decay)``: the optimizer of a node's local training, an
  object with ``zero_grad()`` and ``step()`` (a torch.optim optimizer), made from the scenario's
  settings: FL clients' local epochs (a fresh one a round).  Default: SGD.  DDP and geo keep their own, which are part of their algorithms (DGC's
  momentum correction, the parameter servers' update).

Every mode's training step and evaluator go through it (core.ml.train,
core.ml.evaluation), so a task trains the same way under fl, ddp and geo.  Without ``task``, the scenario's ``model`` and ``data`` keys
make the built-in classification (``CLASSIFICATION``: the registered MNIST
models, or a model factory, with cross-entropy).

The model of a task travels as the spec ``"task:" + spec`` wherever a model
spec does (jobs for worker processes, checkpoints' digests do not see it).
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from dtemu.core.errors import ScenarioError
from dtemu.core.ml import user_code

PREFIX = user_code.TASK_PREFIX
BUILTIN = user_code.BUILTIN_TASKS


class Task:
    """The defaults: classification by cross-entropy over dimension 1, argmax accuracy."""

    name = "classification"
    optimizer = None  # the mode's own SGD (a task may bring another: see the module's text)
    train_s_per_sample: float | None = None

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # cross_entropy is right for logits and log-probabilities alike (log_softmax of
        # log-probabilities is a no-op), so a model may return either.
        return F.cross_entropy(output, target)

    def loss_sum(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target, reduction="sum")

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, int]:
        return (output.argmax(dim=1) == target).sum(), len(target)


CLASSIFICATION = Task()


class SequenceTask(Task):
    """A target per position (a language model's next token): the model returns (N, T, classes),
    the loss is the cross-entropy over every position, and each position counts as a prediction.
    A task with a target per position may inherit these (core.ml.charlm does)."""

    name = "sequence"

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    def loss_sum(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1), reduction="sum")

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, int]:
        return (output.argmax(-1) == target).sum(), target.numel()


class UserTask(Task):
    """A scenario's task object, with the defaults for what it does not define."""

    def __init__(self, spec: str, obj):
        self.name, self.obj = spec, obj
        for method in ("model", "data"):
            if not callable(getattr(obj, method, None)):
                raise ScenarioError("task", f"task {spec!r} ({type(obj).__name__}) has no {method}() method")
        for method in ("loss", "loss_sum", "correct", "optimizer"):
            if callable(getattr(obj, method, None)):
                setattr(self, method, getattr(obj, method))
        cost = getattr(obj, "train_s_per_sample", None)
        if cost is not None and not (isinstance(cost, (int, float)) and cost > 0):
            raise ScenarioError("task", f"task {spec!r}: train_s_per_sample must be a positive number, got {cost!r}")
        self.train_s_per_sample = cost

    def model(self):
        return user_code.call("task", self.name, "task's model()", self.obj.model)

    def data(self):
        return user_code.call("task", self.name, "task's data()", self.obj.data)


is_task = user_code.is_task


@lru_cache(maxsize=8)
def load_task(spec: str) -> UserTask:
    """The task ``spec`` (a built-in name, or ``package.module:Name``) names, once per process."""
    where = BUILTIN.get(spec, spec)
    made = user_code.call("task", spec, "task", user_code.load("task", where, "task"))
    return UserTask(spec, made)


def task_of(spec: str) -> Task:
    """The task behind a model spec: a scenario's own, or the built-in classification."""
    return load_task(spec[len(PREFIX):]) if is_task(spec) else CLASSIFICATION


def failed_gradients(ctx, work, model, err: Exception, step: int) -> float:
    """A gradient step (DDP, geo) whose task code raised: logged as ``train_failed`` (with the task's
    name), and its gradient is zero, so that its node still sends this step's share and its peers
    do not wait for one that never comes; the step's loss is NaN.  The run goes on."""
    from dtemu.core import events as ev
    from dtemu.core.ml.params import zero_gradients

    ctx.emit(ev.TRAIN_FAILED, round=step, error=training_error(work, err))
    zero_gradients(model)
    return float("nan")


def training_error(work, err: Exception) -> str:
    """What a failed training says (event ``train_failed``): whose code raised, and what it raised."""
    spec = getattr(getattr(work, "scenario", None), "model_spec", "the model")
    return f"{spec}: {type(err).__name__}: {err}"[:500]
