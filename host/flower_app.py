"""A Flower app, loaded for dtemu's roles (core.flower): from its folder, as Flower's own tools load
an app, or from the scenario's specs.

An app folder holds a pyproject.toml whose ``[tool.flwr.app.components]`` names the ``serverapp`` and
``clientapp`` ("package.module:attribute") and whose ``[tool.flwr.app.config]`` gives the run config's
defaults, flattened as Flower flattens them (a nested table's keys joined with dots); the scenario's
``flower.run_config`` goes over them, and may only use their keys, as Flower's overrides may.  The folder goes first on sys.path, so
its package imports as Flower's tools import it.  Anything that fails (no such folder, a pyproject
that does not parse, an app that does not import or is not a ServerApp / ClientApp) is a
ScenarioError naming its key: exit 2, before a run folder exists.
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

from dtemu.core.errors import ScenarioError
from dtemu.core.flower import wire
from dtemu.core.flower.app import FlowerApp, Outcome
from dtemu.core.flower.spec import flat_config
from dtemu.host import flower_thread
from dtemu.host.flower_jobs import app_named, on_path

EXTRA = "the Flower extra is not installed: pip install 'dtemu[flower]' (Flower 1.42)"


class LoadedApp(FlowerApp):
    """The app as emu and real run it: the ServerApp in a thread, each client's Context here, and its
    calls in this process or, where emu has an executor (``--jobs``, Ray), in its workers."""

    ships_calls = True  # (emu.executor: this work's jobs are its ClientApp calls)

    def __init__(self, *args, names: tuple = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.names = names  # (app_dir, client_app spec): what a worker loads (host.flower_jobs)
        self.contexts: dict[int, object] = {}
        self.lives: dict[int, int] = {}
        self.pending: dict[str, tuple[int, int, object]] = {}  # message id -> (client, life, ticket)
        self.executor = None

    def attach_executor(self, pool) -> None:
        self.executor = pool

    def open_run(self, folder) -> None:
        """Flower's own log (its strategies' round lines) goes to ``folder``/flower.log, not the terminal:
        the run's progress is the dashboard's, and the log stays with the run."""
        import logging

        from flwr.common.logger import FLOWER_LOGGER

        for handler in list(FLOWER_LOGGER.handlers):
            FLOWER_LOGGER.removeHandler(handler)
            handler.close()
        handler = logging.FileHandler(Path(folder) / "flower.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        FLOWER_LOGGER.addHandler(handler)
        FLOWER_LOGGER.propagate = False

    def server_thread(self, main):
        return flower_thread.AppThread(main)

    def start_client(self, index: int) -> None:
        self.contexts[index] = self.client_context(index)
        self.lives[index] = self.lives.get(index, 0) + 1

    def prefetch(self, index: int, frame: bytes, message_id: str) -> None:
        if self.executor is None or index not in self.contexts:
            return
        from dtemu.host.flower_jobs import FlowerCall, context_bytes

        job = FlowerCall(self.names, bytes(frame), context_bytes(self.contexts[index]), self.call_limit_s)
        self.pending[message_id] = (index, self.lives[index], self.executor.submit(job))

    def call(self, instruction, index: int):
        mine = self._take(instruction.metadata.message_id, index)
        if mine is None:
            return flower_thread.call(self.client_app, instruction, self.contexts[index], self.call_limit_s)
        from dtemu.host.flower_jobs import context_from_bytes

        try:
            reply, error, wall_s, cpu_s, context = self.executor.result(mine)
        except Exception as err:  # the worker could not run it (the app did not load there)
            return flower_thread.failed(instruction, f"the call failed in a worker: {type(err).__name__}: {err}")
        self.contexts[index] = context_from_bytes(context)
        return Outcome(None if reply is None else wire.decode(reply), error, wall_s, cpu_s)

    def _take(self, message_id: str, index: int):
        """The ticket of this call's prefetch, if it ran on what the client holds now; the client's
        other prefetches (instructions it never got, or got in an earlier life) are forgotten."""
        mine = None
        for mid, (client, life, ticket) in list(self.pending.items()):
            if client != index:
                continue
            del self.pending[mid]
            if mid == message_id and life == self.lives[index]:
                mine = ticket
            else:
                self.executor.forget(ticket)
        return mine


def load_app(scenario) -> FlowerApp:
    spec = scenario.flower
    if importlib.util.find_spec("flwr") is None:
        raise ScenarioError("mode", EXTRA)
    components, config = _folder(spec.app_dir) if spec.app_dir else ({}, {})
    server_spec = spec.server_app or components.get("serverapp")
    client_spec = spec.client_app or components.get("clientapp")
    if not server_spec or not client_spec:
        raise ScenarioError("flower.app_dir", f"{spec.app_dir}/pyproject.toml names no serverapp and clientapp in "
                                              "[tool.flwr.app.components]; or set flower.server_app and flower.client_app")
    server_app = app_named("flower.server_app" if spec.server_app else "flower.app_dir", server_spec, "ServerApp")
    client_app = app_named("flower.client_app" if spec.client_app else "flower.app_dir", client_spec, "ClientApp")
    unknown = sorted(set(spec.run_config) - set(config)) if spec.app_dir else []
    if unknown:   # as Flower refuses an override of a key the app does not have
        raise ScenarioError(f"flower.run_config.{unknown[0]}", f"the app has no such key; its pyproject.toml's "
                                                              f"[tool.flwr.app.config] has {', '.join(sorted(config)) or 'none'}")
    return LoadedApp(server_app, client_app, {**config, **spec.run_config}, scenario.fl.clients, spec.call_limit_s,
                     names=(spec.app_dir and str(Path(spec.app_dir).resolve()), client_spec))


def _folder(app_dir: str) -> tuple[dict, dict]:
    """The components and config defaults of the app in ``app_dir``; the folder goes on sys.path."""
    folder = Path(app_dir).resolve()
    try:
        meta = tomllib.loads((folder / "pyproject.toml").read_text("utf-8"))
    except OSError as err:
        raise ScenarioError("flower.app_dir", f"cannot read {folder / 'pyproject.toml'}: {err.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ScenarioError("flower.app_dir", f"{folder / 'pyproject.toml'} does not parse: {err}") from None
    app = meta.get("tool", {}).get("flwr", {}).get("app", {})
    on_path(str(folder))
    return dict(app.get("components", {})), flat_config(dict(app.get("config", {})))
