"""Which rank runs which role, and what it reads and writes: written once for both runtimes.

Each mode (core.modes) says its own: FL's rank 0 is the controller, ranks 1..N the clients (and
N+1 ESync's state server); DDP's ranks 0..W-1 the workers; geo's the master, the root PS, then per site its local PS and workers.  A ``RoleSpec``
starts its role on a ``Context`` with the checkpoint to resume from (the FL controller; emu hands
a restarted controller its latest checkpoint, real ``fl.init_path``).
"""

from __future__ import annotations

from dtemu.core.modes.base import RoleSpec
from dtemu.core.scenario import Scenario

__all__ = ["RoleSpec", "readers_of", "role_of", "roles", "writers_of"]


def role_of(scenario: Scenario, rank: int, work, population=None, residuals=None) -> RoleSpec:
    """The role of ``rank`` (its messages are sealed by the driver's layer, core.runtime.driver);
    ``population``: who the leader
    asks each round (a trace's windows, read by the host); ``residuals``: the FL clients'
    error-feedback residuals, bounded in memory (core.fl.residuals)."""
    return scenario.kind.role_of(scenario, rank, work, population, residuals)


def readers_of(scenario: Scenario) -> dict[str, frozenset[str]] | None:
    """Which nodes read each topic, where not every peer reads every topic a node publishes
    (FL's ESync: the state server reads none of the models; geo: the root PS reads no pull, workers
    and the master no push); None: they all do."""
    return scenario.kind.readers_of(scenario)


def writers_of(scenario: Scenario) -> dict[str, frozenset[str]]:
    """Which nodes write each topic (a barrier waits until its readers know them)."""
    return scenario.kind.writers_of(scenario)


def roles(scenario: Scenario, work, population=None, residuals=None) -> list[RoleSpec]:
    return [role_of(scenario, rank, work, population, residuals) for rank in range(len(scenario.node_names))]
