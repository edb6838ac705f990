"""A Flower app as dtemu's roles hold it: the loaded ServerApp and ClientApp, the run config they
read, and the identities Flower gives a run's nodes.  Nothing here loads code (host.flower_app does)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

RUN_ID = 1  # one run per process: Flower's TaskIdentity is a process's


def already_done() -> None:
    """The work of a Compute whose time is the compute model's alone: the app's call (or the
    ServerApp's work) has already run, so emu charges its modelled time and real spends none."""
    return None


def node_id(index: int) -> int:
    """Client ``index``'s Flower node id (1-based index): a stable 63-bit number, as a SuperLink's are
    (Flower's simulation draws them at random; a seeded run needs them fixed)."""
    return int.from_bytes(hashlib.sha256(f"dtemu:client{index}".encode()).digest()[:8], "little") >> 1


@dataclass(frozen=True)
class Call:
    """A grid call the ServerApp waits on: ``name`` (send_and_receive, push_messages, pull_messages)
    and its arguments."""

    name: str
    args: tuple = ()
    timeout: float | None = None


@dataclass(frozen=True)
class Finished:
    """The ServerApp returned (``error`` None) or raised (``error``, with its ``trace``)."""

    error: BaseException | None = None
    trace: str = ""


@dataclass(frozen=True)
class Outcome:
    """A ClientApp call's end: the reply to send (an error reply if the app failed), or None if it hung;
    what went wrong, for client_app_failed; its wall time, and the CPU seconds of the thread that ran it (what
    `emu calibrate` prices a call by: a call's wall time under a CPU share depends on what else the
    machine ran meanwhile)."""

    reply: object = None
    error: str = ""
    wall_s: float = 0.0
    cpu_s: float = 0.0


@dataclass
class FlowerApp:
    server_app: Any  # flwr ServerApp (callable(grid, context))
    client_app: Any  # flwr ClientApp (callable(message, context) -> Message)
    run_config: dict = field(default_factory=dict)
    clients: int = 0
    call_limit_s: float = 600.0  # flower.call_limit_s: wall seconds a ClientApp call may take
    # What emu and real ask of a scenario's work (core.ml.workload.Workload): an app's model is its own.
    reference_cost: float | None = None
    dim: int = 0

    # --- what the host runs it in (host.flower_app: threads, executors; core starts neither) ------
    def server_thread(self, main):
        """A handle that runs ``main(handle)`` one grid call at a time: ``next()`` runs it to its next
        Call (or Finished), ``answer(value)`` resumes it, ``cancel()`` ends it; ``ask(call)`` is the
        app's side; ``gap``: the wall seconds the app ran before the call ``next()`` returned
        (host.flower_thread.AppThread)."""
        raise NotImplementedError

    def start_client(self, index: int) -> None:
        """Client ``index`` starts a life: a new Context (what an earlier life kept died with it)."""
        raise NotImplementedError

    def call(self, instruction, index: int) -> Outcome:
        """Client ``index``'s ClientApp on ``instruction`` with its Context, waited for ``call_limit_s``
        wall seconds at most."""
        raise NotImplementedError

    def prefetch(self, index: int, frame: bytes, message_id: str) -> None:
        """The server sent client ``index`` the instruction ``frame``: an executor may start its call now
        (host.flower_app; the client's ``call`` then takes the result).  Nothing by default."""

    def server_context(self):
        from flwr.app import Context, RecordDict
        from flwr.common.constant import SUPERLINK_NODE_ID

        return Context(run_id=RUN_ID, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                       run_config=dict(self.run_config))

    def client_context(self, index: int):
        """Client ``index``'s Context, as Flower's simulation makes it: partition-id index - 1 of
        num-partitions (the clients)."""
        from flwr.app import Context, RecordDict
        from flwr.common.constant import NUM_PARTITIONS_KEY, PARTITION_ID_KEY

        return Context(run_id=RUN_ID, node_id=node_id(index),
                       node_config={PARTITION_ID_KEY: index - 1, NUM_PARTITIONS_KEY: self.clients},
                       state=RecordDict(), run_config=dict(self.run_config))
