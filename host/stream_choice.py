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
    """``DTEMU_DDS_STREAM`` (1/on/yes/true or 0/off/no/false; off when unset) for a profile that
    reaches other hosts: never with ``loopback``, whose shared-memory pools are faster.  Still
    opt-in: made the default, it made DDP's steps on the testbed 17-24% slower (the table of notebook
    entry 42, 100 Mbit/s links, a 0.533-CPU share).  The CPU is why (entry 43): zmq's I/O thread
    woke ~55,000 times in a 16-step DDP run, once per 5-6 kB of a link paced at line rate, and spent
    1.0 s of a rank's CPU where DDS's receive thread spent 0.4 s in 2,000 wake-ups; a rank's CPU came
    to 8.2 s against 7.1 s, and on a CPU share time is CPU."""
    env = os.environ.get("DTEMU_DDS_STREAM", "").strip().lower()
    return env in ("1", "yes", "on", "true") and profile != "loopback"
