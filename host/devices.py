"""Where a scenario trains (its ``device`` key), checked when it is loaded: a run that asks for a GPU
it cannot have is refused before anything starts (exit 2, the key named), never run on the CPU
instead.  torch is imported only for a scenario that asks (real launch starts without it).

- ``cpu``: the CPU.
- ``cuda``: the GPU torch calls cuda:0 (real launch --gpus: each rank's process sees one GPU, its
  own); refused where torch sees none, or where the training is an app's own code, which chooses
  its device itself (mode flower: ``Mode.gpu``).
- ``auto``: cuda where both would allow it, else the CPU.

On a GPU, torch is asked for its deterministic algorithms (``prepare``), so that a run trains the
same model again on the same device and software (where every op it runs has one); it is not the
CPU's model.
"""

from __future__ import annotations

import os

from dtemu.core.errors import ScenarioError

CPU, CUDA = "cpu", "cuda"


def resolve(scenario) -> str:
    """The device the run trains on, ``cpu`` or ``cuda``; a ScenarioError for a ``cuda`` it cannot have."""
    if scenario.device == CPU:
        return CPU
    import torch

    gpu = torch.cuda.is_available()
    if scenario.device == "auto":
        return CUDA if gpu and scenario.kind.gpu else CPU
    if not gpu:
        raise ScenarioError("device", "cuda asks for a GPU, and torch sees none here "
                                      f"(torch {torch.__version__}, built {'with' if torch.version.cuda else 'without'} "
                                      "CUDA); use device: cpu, or auto")
    if not scenario.kind.gpu:
        raise ScenarioError("device", f"cuda: in mode {scenario.mode} the training is the app's own code, which "
                                      "chooses its device itself; use device: cpu, or auto")
    return CUDA


def prepare(device: str) -> None:
    """Make ``device``'s training repeatable where torch allows: its deterministic algorithms (cuBLAS
    needs its workspace fixed before its first call).  Nothing for the CPU (host.cpu_arith fixes its
    arithmetic for every run)."""
    if device != CUDA:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    # warn_only: an op with no deterministic kernel on a GPU (AdaptiveAvgPool2d's backward: ResNet-18's)
    # would raise and end the run; it warns once instead, and that run may not repeat its bits.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def describe(device: str) -> dict:
    """What summary.json's platform says of the device ({} for the CPU, which the platform describes)."""
    if device != CUDA:
        return {}
    import torch

    return {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
