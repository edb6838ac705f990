"""Optimizer state as bytes: a group's leader hands its momentum buffers to the survivors.

Per tensor a presence byte, then its float32 values; the reader knows the
shapes and checks that the bytes fit them exactly (``FrameError`` otherwise:
the bytes come off the wire).
"""

from __future__ import annotations

import numpy as np
import torch

from dtemu.core.errors import FrameError


def pack_buffers(buffers) -> bytes:
    """Optional tensors (momentum buffers) as bytes: per tensor a presence byte, then float32 values."""
    out = []
    for b in buffers:
        if b is None:
            out.append(b"\x00")
        else:
            out += [b"\x01", b.detach().reshape(-1).to(torch.float32).cpu().numpy().tobytes()]
    return b"".join(out)


def unpack_buffers(data: bytes, shapes, device: torch.device | str = "cpu") -> list:
    """The inverse of ``pack_buffers`` for tensors of ``shapes``, on ``device`` (the model's); FrameError
    if it does not fit."""
    view, off, out = memoryview(data), 0, []
    for shape in shapes:
        if off >= len(view) or view[off] not in (0, 1):
            raise FrameError("optimizer state is truncated or malformed")
        present, off = view[off], off + 1
        if not present:
            out.append(None)
            continue
        nbytes = 4 * int(np.prod(shape, dtype=np.int64))
        if off + nbytes > len(view):
            raise FrameError("optimizer state is truncated")
        out.append(torch.from_numpy(np.frombuffer(view[off : off + nbytes], np.float32).copy()).view(shape).to(device))
        off += nbytes
    if off != len(view):
        raise FrameError(f"optimizer state has {len(view) - off} bytes too many")
    return out
