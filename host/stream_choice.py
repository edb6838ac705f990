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
QUEUE_FRAMES = 16         # at least this many frames may wait in zmq's queue for a destination (its
                          # SNDHWM); what paces a sender is its writer history (real.stream_out)


def stream_on(profile: str) -> bool:
    """Whether a transport of ``profile`` carries large payloads on the stream: for every profile
    that reaches other hosts (``lan``, a file), never with ``loopback``, whose shared-memory pools
    are faster.  ``DTEMU_DDS_STREAM=0`` (0/off/no/false) keeps every byte in DDS.  Between
    namespaces it took the collectives from 2-4.7x gloo's time to under 2x, and since a sender
    keeps its order on it (real.stream_out) geo's flat PS is as fast as through DDS (notebook
    entries 41 and 42)."""
    env = os.environ.get("DTEMU_DDS_STREAM", "").strip().lower()
    return env not in ("0", "no", "off", "false") and profile != "loopback"
