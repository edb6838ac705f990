"""A GPU that is the CPU, for checking here the code paths that a run with ``device: cuda`` takes.

This host has no GPU, and the bugs a GPU path has are mostly of two kinds that need no GPU to
find: a device's tensor handed to numpy (``.numpy()``, ``np.asarray``), and an operation that mixes a
device's tensor with the host's.  ``FakeCuda`` is a torch function mode that tracks which tensors
"are on the GPU" and raises as CUDA would for those two mistakes; the arithmetic itself runs on the
CPU, so a run on it must give the CPU's model bit for bit where the code takes the same steps.

What it tracks: a tensor is on the device when ``.to("cuda")``/``.cuda()`` or a factory with
``device="cuda"`` made it, when an operation had a device tensor among its inputs, when it is the
``.grad`` or ``.data`` of one, or when it was assigned as a module's parameter data (``Module.to``).
``.device`` and ``.is_cuda`` answer as a GPU's tensor would.  ``copy_``, indexing and
``.item()`` cross between the two as CUDA lets them.  What it cannot find: a GPU's own limits
(memory, ``use_deterministic_algorithms``' refusals, speed); tools/gpu_checks.sh is for those.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

_FLAG = "_dtemu_on_fake_cuda"
CUDA = torch.device("cuda", 0)

# Operations CUDA lets cross devices (a copy in either direction, indexing with the host's indices,
# reading one value out), and those that read a tensor's layout, not its values.  A tensor they
# return is where their first argument is.
_CROSSING = {"copy_", "__getitem__", "__setitem__", "item", "tolist", "__bool__", "__float__", "__int__",
             "__index__", "__format__", "__repr__", "__len__", "size", "dim", "numel", "is_floating_point",
             "__reduce_ex__", "__deepcopy__", "_has_compatible_shallow_copy_type", "__array_wrap__",
             "data_ptr", "untyped_storage", "_typed_storage", "storage_offset", "stride", "is_contiguous"}

# Operations that read only the other tensor's shape.
_SHAPE_OF = {"view_as", "reshape_as", "expand_as"}


def on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, _FLAG, False)


def _mark(t, on: bool = True):
    if isinstance(t, torch.Tensor):
        setattr(t, _FLAG, on)
    return t


def _is_cuda(device) -> bool:
    if device is None or isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True   # a bare index is a CUDA device's
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


class DeviceMixed(RuntimeError):
    """An operation got tensors of the (stand-in) GPU and of the host, which CUDA refuses."""


class FakeCuda(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        owner = getattr(func, "__self__", None)
        if name in ("__get__", "__set__") and isinstance(owner, type(torch.Tensor.grad)):
            return self._attribute(owner.__name__, name, func, args)
        if name in ("numpy", "__array__") and on_device(args[0]):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
                            "tensor to host memory first.")
        if name in ("to", "cuda", "cpu"):
            return self._move(name, func, args, kwargs)
        if name == "get_device" and on_device(args[0]):
            return 0
        if name in _SHAPE_OF:   # the other tensor lends its shape only: the result is where self is
            return _mark(func(*args, **kwargs), on_device(args[0]))
        made_on_device = _is_cuda(kwargs.get("device"))
        if made_on_device:
            kwargs["device"] = "cpu"
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        device = made_on_device or any(on_device(t) for t in tensors)
        generator = kwargs.get("generator")
        if device and isinstance(generator, torch.Generator) and generator.device.type == "cpu":
            raise DeviceMixed(f"Expected a 'cuda' device type for generator but found 'cpu' ({name})")
        if device and name not in _CROSSING:
            host = [t for t in tensors if not on_device(t) and t.dim() > 0]
            if host:
                raise DeviceMixed(f"Expected all tensors to be on the same device, but found at least two "
                                  f"devices, cuda:0 and cpu! ({name}, a host tensor of shape {tuple(host[0].shape)})")
        out = func(*args, **kwargs)
        if name in _CROSSING:   # the result (an element, a slice) is where self is
            if isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor) and out is not args[0]:
                _mark(out, on_device(args[0]))
        elif device:
            tree_map(_mark, out)
        return out

    def _attribute(self, attr: str, how: str, func, args):
        owner = args[0]
        if how == "__set__":
            value = args[1]
            if attr == "data":
                _mark(owner, on_device(value))
            elif attr == "grad" and value is not None and on_device(value) != on_device(owner):
                raise DeviceMixed("assigned grad has data located on a different device")
            return func(*args)
        if attr == "device" and on_device(owner):
            return CUDA
        if attr == "is_cuda":
            return on_device(owner)
        out = func(*args)
        if attr in ("grad", "data", "T", "mT", "real") and on_device(owner) and isinstance(out, torch.Tensor):
            _mark(out)
        return out

    def _move(self, name: str, func, args, kwargs):
        src, rest = args[0], args[1:]
        copy = kwargs.pop("copy", False)
        if name == "cuda":
            target, dtype = True, None
        elif name == "cpu":
            target, dtype = False, None
        else:
            to_tensor = rest and isinstance(rest[0], torch.Tensor)
            device, dtype, *_ = torch._C._nn._parse_to(*rest, **kwargs)
            target = on_device(rest[0]) if to_tensor else (_is_cuda(device) if device is not None else on_device(src))
            if to_tensor:
                dtype = rest[0].dtype
        if target == on_device(src):
            out = src.to(dtype=dtype or src.dtype, copy=copy)
            return _mark(out, target) if out is not src else src
        # another device: always a new tensor of its own storage
        return _mark(src.to(dtype=dtype or src.dtype, copy=True), target)


def install():
    """From now on, in this process, torch says it has one GPU and ``FakeCuda`` tracks what is on it;
    returns what undoes it.  (tests/fake_cuda_site: a real run's processes install it at start.)"""
    rng: dict[int, torch.Tensor] = {}
    made = torch.nn.Parameter.__dict__["__new__"]

    def new_parameter(cls, data=None, requires_grad=True):
        # A Parameter made of a device's tensor (copy.deepcopy of a model) is on the device: torch makes
        # it with Tensor._make_subclass, which no torch function mode sees.
        return _mark(made(cls, data, requires_grad), on_device(data))

    patches = [(torch.cuda, "is_available", lambda: True), (torch.cuda, "device_count", lambda: 1),
               (torch.cuda, "get_device_name", lambda *a: "FakeCuda (the CPU)"),
               (torch.cuda, "synchronize", lambda *a: None),
               (torch.cuda, "get_rng_state", lambda device=0: rng.get(int(device), torch.get_rng_state())),
               (torch.cuda, "set_rng_state", lambda state, device=0: rng.__setitem__(int(device), state)),
               (torch.cuda, "manual_seed_all", lambda seed: None), (torch.cuda, "manual_seed", lambda seed: None),
               (torch.nn.Parameter, "__new__", staticmethod(new_parameter))]
    before = [(obj, name, obj.__dict__[name] if name in obj.__dict__ else getattr(obj, name)) for obj, name, _ in patches]
    env = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    deterministic = torch.are_deterministic_algorithms_enabled()
    for obj, name, value in patches:
        setattr(obj, name, value)
    mode = FakeCuda()
    mode.__enter__()

    def undo():
        mode.__exit__(None, None, None)
        for obj, name, value in before:
            setattr(obj, name, value)
        torch.use_deterministic_algorithms(deterministic)
        if env is None:   # (host.devices.prepare sets it for cuBLAS)
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    return undo


@contextlib.contextmanager
def fake_cuda():
    undo = install()
    try:
        yield
    finally:
        undo()
