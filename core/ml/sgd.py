"""SGD as torch.optim.SGD computes it for CPU tensors, without torch.optim.

torch.optim's first optimizer imports torch._dynamo: 1.06 s of CPU per process here,
which each of emu's pool workers paid before its first client, and a short run's
start-up waited for (docs/notebook/2026-11-25-21-real-mode-at-the-machine-s-speed-issue-27.md, "emu's overhead on a short run").  For CPU
tensors torch.optim.SGD takes its single-tensor path (its foreach and fused kernels
are for accelerators: ``_default_to_fused_or_foreach``); ``step`` below is that path
(``torch.optim.sgd._single_tensor_sgd``, torch 2.13) operation for operation, so the
bits are torch's (tests/test_sgd.py compares them).  A tensor on another device is
refused rather than given other arithmetic.
"""

from __future__ import annotations

import torch


class SGD:
    """``torch.optim.SGD(params, lr, momentum, dampening, weight_decay, nesterov)`` on CPU tensors."""

    def __init__(self, params, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        self.params = list(params)
        for p in self.params:
            if p.device.type != "cpu":
                raise ValueError(f"core.ml.sgd.SGD is torch's CPU arithmetic; a parameter is on {p.device}")
        self.lr, self.momentum, self.dampening = lr, momentum, dampening
        self.weight_decay, self.nesterov = weight_decay, nesterov
        self._buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for i, param in enumerate(self.params):
            grad = param.grad
            if grad is None:
                continue
            if self.weight_decay != 0:
                grad = grad.add(param, alpha=self.weight_decay)
            if self.momentum != 0:
                buf = self._buffers[i]
                if buf is None:
                    buf = self._buffers[i] = grad.detach().clone()
                else:
                    buf.mul_(self.momentum).add_(grad, alpha=1 - self.dampening)
                grad = grad.add(buf, alpha=self.momentum) if self.nesterov else buf
            param.add_(grad, alpha=-self.lr)
