"""The run folder both runtimes write and every report reads.

    events.jsonl     one JSON object per line: t, node, kind, then the event's fields
    summary.json     final_accuracy, bytes_up, bytes_down, model_sha256, sim_time_s or wall_time_s, ...
    scenario.json    the scenario as run (overrides applied)
    checkpoint.dtck  the controller's latest checkpoint (core.checkpoint)

Roles never touch this module: they call ``ctx.emit`` and ``ctx.save_checkpoint``
and the runtime routes those here.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

CHECKPOINT = "checkpoint.dtck"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` so that ``path`` is always either the old or the new file.

    Temp file in the same folder, flushed and fsynced, then renamed over the
    target; a kill at any moment leaves the previous version intact.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _jsonable(value: Any) -> Any:
    """numpy scalars and sets, as JSON understands them."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=_jsonable, separators=(",", ":"))


def write_json(folder: str | Path, name: str, obj: Any) -> None:
    """``folder/name`` as indented JSON with sorted keys, written atomically."""
    text = json.dumps(obj, default=_jsonable, indent=2, sort_keys=True) + "\n"
    atomic_write(Path(folder) / name, text.encode())


class RunDir:
    def __init__(self, path: str | Path, append: bool = False):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        # Line-buffered: a process that is killed keeps every event it logged,
        # and `real launch` can follow the file while the run goes on.  A
        # restarted process appends: its earlier life's events stay.
        self._events = open(self.path / "events.jsonl", "a" if append else "w", encoding="utf-8", buffering=1)
        self._observers: list[Callable[[dict], None]] = []
        # Events come from the role's thread and from a transport's receive thread
        # (rejected frames): one line at a time, observers in the same order.
        self._lock = threading.RLock()

    def observe(self, fn: Callable[[dict], None]) -> None:
        """Also hand every event to ``fn`` (a dashboard)."""
        self._observers.append(fn)

    def event(self, event: dict) -> None:
        line = dumps(event) + "\n"
        with self._lock:
            self._events.write(line)
            for fn in self._observers:
                fn(event)

    def save_checkpoint(self, data: bytes) -> str:
        """The latest checkpoint, replaced atomically (a kill mid-save leaves the previous one).

        A kill mid-save also leaves its temporary file (``.checkpoint.dtck.*``,
        never read as a checkpoint); the next save removes such leftovers, since
        only one process saves into a run folder.
        """
        atomic_write(self.path / CHECKPOINT, data)
        for stale in self.path.glob(f".{CHECKPOINT}.*"):
            try:
                stale.unlink()
            except OSError:
                pass
        return CHECKPOINT

    def write_json(self, name: str, obj: Any) -> None:
        write_json(self.path, name, obj)

    def close(self) -> None:
        with self._lock:
            self._events.close()


def read_events(path: str | Path) -> list[dict]:
    with open(Path(path) / "events.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_events_partial(path: str | Path) -> tuple[list[dict], int]:
    """Events of a run that may still be going or was killed: (events, lines that did not
    parse, e.g. one being written or torn by a kill); no file yet gives ([], 0)."""
    file = Path(path) / "events.jsonl"
    if not file.exists():
        return [], 0
    events, torn = [], 0
    for line in file.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            torn += 1
    return events, torn


def read_summary(path: str | Path) -> dict:
    return json.loads((Path(path) / "summary.json").read_text())
