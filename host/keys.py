"""Where a run's shared key comes from: a file or the environment, never the scenario.

A scenario is shared and copied into every run folder, so the key that seals
messages (``core.wire.auth``) and frames (``core.wire.frame_auth``) is read here,
by the CLIs, and handed to the runtimes as bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from dtemu.core.errors import KeyFileError
from dtemu.core.wire.auth import parse_key


def load_key(path: str | None = None, environ=os.environ) -> tuple[bytes | None, str]:
    """(key, where it came from): ``path``, else $DTEMU_KEY_FILE, else $DTEMU_KEY, else no key."""
    path = path or environ.get("DTEMU_KEY_FILE")
    if path:
        try:
            raw = Path(path).read_bytes()
        except OSError as err:
            raise KeyFileError(f"cannot read the key file {path}: {err.strerror}") from None
        return parse_key(raw, path), path
    if environ.get("DTEMU_KEY"):
        return parse_key(environ["DTEMU_KEY"].encode(), "$DTEMU_KEY"), "$DTEMU_KEY"
    return None, "none"
