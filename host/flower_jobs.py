"""A ClientApp call as a job for emu's executors (``--jobs N``, ``--executor ray``): the app's
names, the instruction's frame and the client's Context as bytes, so that it runs in a worker process
and gives what the same call in the emulator gives (the Context comes back with the reply).

The server's role names each instruction to the app as it sends it (core.flower.server: ``prefetch``),
so the calls of a round run in the workers while the emulator goes on; the client's role takes its
call's result when it gets there (host.flower_app).  A call is a function of the instruction and the
Context only where the app seeds its own randomness, as a Flower app must to be repeatable anyway.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from dtemu.core.errors import ScenarioError
from dtemu.core.flower import wire
from dtemu.core.ml import user_code

_apps: dict[tuple, object] = {}  # in a worker: the ClientApps loaded, by what names them


@dataclass(frozen=True, eq=False)
class FlowerCall:
    names: tuple  # (app_dir, client_app spec): client_app_of
    instruction: bytes  # a wire.INSTRUCTION frame
    context: bytes  # the client's flwr Context, protobuf
    limit_s: float

    def split(self, parts: int) -> list["FlowerCall"]:
        return [self]

    def finish(self, results: list):
        return results[0]

    def run(self) -> tuple[bytes | None, str, float, float, bytes]:
        """(the reply's frame, or None if the call hung; what went wrong; wall seconds; CPU seconds; the
        Context after)."""
        from dtemu.host import flower_thread

        if self.names not in _apps:
            _apps[self.names] = client_app_of(*self.names)
        instruction = wire.decode(self.instruction)
        context = context_from_bytes(self.context)
        outcome = flower_thread.call(_apps[self.names], instruction, context, self.limit_s)
        reply = None if outcome.reply is None else wire.encode(wire.REPLY, outcome.reply)
        return reply, outcome.error, outcome.wall_s, outcome.cpu_s, context_bytes(context)


def context_bytes(context) -> bytes:
    from flwr.common.serde import context_to_proto

    return context_to_proto(context).SerializeToString()


def context_from_bytes(data: bytes):
    from flwr.common.serde import context_from_proto
    from flwr.proto.message_pb2 import Context as ProtoContext

    return context_from_proto(ProtoContext.FromString(data))


def client_app_of(app_dir: str | None, spec: str):
    """The ClientApp ``spec`` names, its app's folder first on sys.path (a worker process's loading)."""
    if app_dir:
        on_path(app_dir)
    return app_named("flower.client_app", spec, "ClientApp")


def on_path(folder: str) -> None:
    """An app's folder first on sys.path, as Flower's tools put it, so that its package imports."""
    if folder not in sys.path:
        sys.path.insert(0, folder)


def app_named(key: str, spec: str, kind: str):
    """The ServerApp or ClientApp ``spec`` names."""
    import flwr.clientapp
    import flwr.serverapp

    cls = flwr.serverapp.ServerApp if kind == "ServerApp" else flwr.clientapp.ClientApp
    app = user_code.load(key, spec, kind)  # (an import that fails or raises is the key's error)
    if not isinstance(app, cls):
        raise ScenarioError(key, f"{spec!r} is a {type(app).__name__}, not a Flower {kind}")
    if kind == "ServerApp" and getattr(app, "_main", None) is None:  # (flwr 1.42's ServerApp: no @app.main)
        raise ScenarioError(key, f"{spec!r} is a legacy ServerApp (server_fn / a Strategy of flwr.server): its "
                                 "clients are driven from a thread pool, in an order the emulator's clock cannot "
                                 "fix; write it on the Message API (@app.main, flwr.serverapp.strategy)")
    return app
