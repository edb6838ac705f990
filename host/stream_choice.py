"""Whether real mode carries large payloads on its TCP stream beside DDS (real.stream), and how.

Real mode reads it to open the stream; emu reads it to model the path the bytes take
(``network.framing: stream``, emu.wire_model) and a testbed run says which path its ranks
took: all three ask here, so that emu needs nothing of real's.
"""

from __future__ import annotations

import os

FRAME_BYTES = 1 << 20     # a message on the stream is cut into frames of this size (as in DDS): a
                          # receiver hears its sender's progress a frame at a time (real.beside)
MIN_BYTES = 64 << 10      # smaller frames go inline in DDS: a reference is not worth a second path
QUEUE_FRAMES = 16         # frames queued per destination before a send waits (zmq's SNDHWM)
ORDER_BYTES = FRAME_BYTES # a frame to one peer waits while more than this is still unacknowledged to
                          # others: a sender's messages cross its link one after another, as DDS's do


def stream_on(profile: str) -> bool:
    """``DTEMU_DDS_STREAM`` (1/on/yes/true or 0/off/no/false; off when unset) for a profile that
    reaches other hosts: never with ``loopback``, whose shared-memory pools are faster."""
    env = os.environ.get("DTEMU_DDS_STREAM", "").strip().lower()
    return env in ("1", "yes", "on", "true") and profile != "loopback"


def queue_bytes() -> int:
    """What a send may leave queued on the stream when it returns (emu's send window for it)."""
    return QUEUE_FRAMES * FRAME_BYTES
