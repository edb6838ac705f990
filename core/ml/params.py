"""A model's weights as one flat float32 vector: what codecs compress, what
the server averages and what checkpoints and hashes cover.

The vector holds every floating tensor of ``state_dict()`` (parameters and
float buffers alike) in ``state_dict`` order; integer buffers such as a batch
norm's ``num_batches_tracked`` are not part of it.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
from torch import nn

from dtemu.core.errors import RejectedUpdate


def _float_tensors(model: nn.Module) -> list[torch.Tensor]:
    # state_dict() tensors share storage with the model, so copy_ into them
    # updates the model in place.
    return [t for t in model.state_dict().values() if t.is_floating_point()]


def device_of(params) -> torch.device:
    """Where the parameters ``params`` are (the first one's device; the CPU for none)."""
    first = next(iter(params), None)
    return first.device if first is not None else torch.device("cpu")


def num_params(model: nn.Module) -> int:
    """Length of the flat vector of ``model``."""
    return sum(t.numel() for t in _float_tensors(model))


# Three views of a model as one vector, each a list of tensors joined and spread the same way: its
# floating state (``flatten``/``load_flat``), its parameters (``params_vector``/``load_params``),
# and its parameters' gradients (``grads_vector``/``load_grads``).
def _joined(tensors, dtype: torch.dtype | None) -> np.ndarray:
    """One flat CPU copy of ``tensors``, each cast to ``dtype`` (None: as they are)."""
    tensors = list(tensors)
    if not tensors:
        return np.zeros(0, dtype=np.float32)
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1) if dtype is None else t.detach().reshape(-1).to(dtype)
                          for t in tensors])
    return flat.cpu().numpy()   # (a GPU's tensors come over; the CPU's are not copied)


def _spread(tensors, vec: np.ndarray) -> None:
    """Write ``vec`` into ``tensors`` in order, in place (on whatever device they are)."""
    if vec.dtype != np.float32 or not vec.flags.writeable or not vec.flags.c_contiguous:
        # torch.from_numpy wants a writable, contiguous float32 array.
        vec = np.array(vec, dtype=np.float32)
    src = torch.from_numpy(vec)
    off = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(src[off:off + n].view_as(t))
            off += n


def flatten(model: nn.Module) -> np.ndarray:
    """A float32 1-D copy of the model's floating state."""
    return _joined(_float_tensors(model), torch.float32)


def load_flat(model: nn.Module, vec: np.ndarray) -> None:
    """Write a flat vector back into ``model`` (the inverse of flatten)."""
    vec = np.asarray(vec)
    tensors = _float_tensors(model)
    want = sum(t.numel() for t in tensors)
    if vec.ndim != 1 or vec.size != want:
        raise RejectedUpdate(f"flat vector has shape {vec.shape}, the model needs ({want},)")
    _spread(tensors, vec)


def params_vector(model: nn.Module) -> np.ndarray:
    """The model's parameters (its buffers left out) as one float32 vector: geo's payload, whose
    PSs sum and apply weights and gradients alike, position by position."""
    return _joined(model.parameters(), torch.float32)


def load_params(model: nn.Module, vec: np.ndarray) -> None:
    """Write a flat vector back into the model's parameters (the inverse of params_vector)."""
    _spread(model.parameters(), np.asarray(vec))


def zero_gradients(model: nn.Module) -> None:
    """Every parameter's gradient set to zero (made, where a failed pass left none): a step whose
    task code raised contributes nothing to its exchange, and still takes part in it."""
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        else:
            p.grad.zero_()


def grads_vector(params) -> np.ndarray:
    """The parameters' gradients as one flat vector (their dtype; a data-parallel step's payload)."""
    return _joined((p.grad for p in params), None)


def load_grads(params, flat: np.ndarray) -> None:
    """Write a flat vector back into the parameters' gradients (the inverse of grads_vector)."""
    _spread([p.grad for p in params], np.asarray(flat))


def sha256_of(vec: np.ndarray) -> str:
    """Hex SHA-256 of the vector as little-endian float32 bytes."""
    data = np.ascontiguousarray(vec, dtype="<f4")
    return hashlib.sha256(memoryview(data).cast("B")).hexdigest()
