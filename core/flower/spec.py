"""The ``flower:`` section of a scenario: an unmodified Flower app (its ServerApp and ClientApp, on
Flower's Message API) run by dtemu's roles (core.flower.server, core.flower.client).

The app's messages travel over dtemu's network (emu's model, or DDS for real); the ClientApp's calls
are the clients' compute, priced by the scenario's compute model.  The clients are ``fl.clients``
nodes client1..N, and the fl section's round timeout, barrier and availability apply to them; the
rest of fl (codecs, rules, sampling) is the app's business, not dtemu's.

This module holds no logic but the keys; it imports nothing of the scenario or of Flower.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dtemu.core.schema import check, positive

SERVER = "server"  # rank 0: the ServerApp; ranks 1..N: client1..clientN, each a ClientApp


@dataclass(frozen=True)
class FlowerSpec:
    # A Flower app's folder (its pyproject.toml names the apps in [tool.flwr.app.components] and their
    # defaults in [tool.flwr.app.config]); relative to the scenario file.  The folder goes on sys.path.
    app_dir: str | None = None
    # Or the apps themselves, "package.module:attribute" (they override the folder's components).
    server_app: str | None = None
    client_app: str | None = None
    # The run config the apps read (context.run_config): over the folder's [tool.flwr.app.config], whose
    # keys it must use.  Flat, as Flower's: a nested table's keys are joined with dots ({model: {name: x}}
    # is model.name, and so is --set flower.run_config.model.name=x).
    run_config: dict[str, bool | int | float | str] = field(default_factory=dict)
    # What a ClientApp train call costs in the emulator's time: the reply's metric ``examples_key``
    # (Flower's convention: num-examples) times compute.<node>.train_s_per_sample, with the node's
    # slowdown and jitter (deterministic for a seed; `emu calibrate` measures the cost per example).
    # Evaluate calls take no time, as dtemu's own evaluation.
    examples_key: str = "num-examples"
    # The evaluate replies' metric reported as the run's accuracy (their mean weighted by
    # examples_key); None: the first metric whose name has "acc" in it.
    accuracy_key: str | None = None
    # Wall seconds a ClientApp call may take before the client gives up on it (a hung app): it then
    # answers nothing, as a hung client would, and the call's thread is left behind.
    call_limit_s: float = field(default=600.0, metadata=check(positive))
    # Replies reach the app as Flower delivers them: their arrays are the app's to judge.  True: dtemu
    # refuses (and counts) a reply whose arrays do not load, are not finite, or differ in dtype, shape
    # or keys from what its instruction carried.
    check_arrays: bool = False


def flat_config(config: dict, prefix: str = "") -> dict:
    """A run config as Flower builds it: nested tables flattened, their keys joined with dots."""
    out: dict = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_config(value, name + "."))
        else:
            out[name] = value
    return out


def flatten_run_config(raw_section) -> None:
    """The scenario's ``flower`` mapping with its run_config made flat, before its keys are checked."""
    if isinstance(raw_section, dict) and isinstance(raw_section.get("run_config"), dict):
        raw_section["run_config"] = flat_config(raw_section["run_config"])
