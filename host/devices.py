"""Where a scenario trains (its ``device`` key), checked when it is loaded: a run that asks for a GPU
it cannot have is refused before anything starts (exit 2, the key named), never run on the CPU
instead.  torch is imported only for a scenario that asks (real launch starts without it)."""

from __future__ import annotations

from dtemu.core.errors import ScenarioError

CPU = "cpu"


def resolve(scenario) -> str:
    """The device the run trains on: ``cpu`` (every run today; ``auto`` resolves to it), or a
    ScenarioError for ``cuda``."""
    if scenario.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ScenarioError("device", "cuda asks for a GPU, and torch sees none here "
                                          f"(torch {torch.__version__}, built {'with' if torch.version.cuda else 'without'} "
                                          "CUDA); use device: cpu, or auto")
        raise ScenarioError("device", "cuda: dtemu trains on the CPU only so far (the GPU path of issue 30 is "
                                      "not built); use device: cpu, or auto")
    return CPU
