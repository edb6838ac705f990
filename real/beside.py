"""The receive side of what travels beside DDS (``real.shm``, ``real.stream``): a frame that
carries a reference gets its bytes here before it goes on through the same checks.

``Beside`` is a mixin of ``DdsTransport`` (with ``real.receiving``'s ``Receiving``, which
calls it): ``_from_pool`` copies (or lends) a shared-memory slot's bytes; ``_from_stream``
takes a frame's bytes from the stream, or says they are not here yet, and
``_release_parked`` hands on the frames that waited for theirs, in each sender's order.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import Optional

import numpy as np

from dtemu.core.wire import topics as wire_topics
from dtemu.host.writer_history import whc_high_bytes
from dtemu.real import shm, stream, stream_out
from dtemu.real.reassembly import MAX_SENDERS
from dtemu.real.wire import Frame

# Topics whose messages that came beside DDS may be delivered as read-only views (a memoryview)
# of the buffer they came in (a shared-memory slot, the stream's receive buffer), not copies:
# collective frames, whose consumer sums them or copies them into place within the operation
# (core.ddp.collectives copies what it keeps for longer).
POOL_VIEWS = frozenset({wire_topics.COLL_FRAMES})


class Beside:
    """``DdsTransport``'s bytes from beside DDS; see the module docstring."""

    @property
    def streaming(self) -> bool:
        """Whether this transport carries large payloads on its TCP stream (real.stream)."""
        return getattr(self, "_stream_in", None) is not None

    def _from_pool(self, topic: str, f: Frame) -> bool:
        """Replace a reference's payload by the bytes it points at (real.shm): a copy, or on the
        topics of ``POOL_VIEWS`` a view of the slot; False if it was refused (counted as
        malformed)."""
        if f.dst and f.dst != self.node or f.src == self.node:
            f.parts ^= shm.SHM_FLAG
            return True   # not ours: _on_frame drops it without looking at the payload
        if not self._shm:
            self._malformed(f"a shared-memory reference from {f.src!r}, which this transport does not take")
            return False
        try:
            f.payload = self._shm_in.resolve(f.src, f.payload, view=self._logical.get(topic, topic) in POOL_VIEWS)
        except ValueError as exc:
            self._malformed(f"from {f.src!r}: {exc}")
            return False
        f.parts ^= shm.SHM_FLAG
        self.stats["shm_recv_frames"] += 1
        return True

    def _release_parked(self) -> None:
        """Hand on the waiting frames whose bytes came; give up on a frame whose sender's stream
        has been silent for STALL_S since it came (or that waited STALL_MAX_S): counted as lost.  Not
        when its sender leaves the domain: a sender that flushed and closed has its last bytes still
        in its kernel's socket, crossing a slow link (geo's last pulls over 20 Mbit/s: 7.8 s)."""
        now = time.monotonic()
        for (topic, src), waiting in list(self._parked.items()):
            del self._parked[(topic, src)]
            while waiting:
                f, ts, since = waiting[0]
                if f.parts & stream.STREAM_FLAG:
                    got = self._from_stream(topic, f)
                    if got is None:
                        heard = self._stream_in.heard(src) if self._stream_in is not None else 0.0
                        if now - max(since, heard) < stream.STALL_S and now - since < stream.STALL_MAX_S:
                            self._parked[(topic, src)] = waiting
                            break
                        self.stats["stream_lost"] += 1
                        self._reject("lost", f"frame {f.part} of message {f.msg_id} of {src!r} on {topic}: its bytes "
                                             f"never came on the stream (its sender's stream silent "
                                             f"{now - max(since, heard):.1f} s; waited {now - since:.1f} s)")
                        got = False
                    waiting.popleft()
                    if got:   # its bytes came on the sender's own connection, its reference verified
                        self._frame_in(topic, f, ts, checked=True)
                    continue
                waiting.popleft()
                self._take_frame(topic, f, ts)

    def _from_stream(self, topic: str, f: Frame) -> Optional[bool]:
        """Replace a reference's payload by its bytes from the stream (real.stream): True when they
        are here, None while they are not, False if the reference is refused (counted)."""
        if f.dst and f.dst != self.node or f.src == self.node:
            f.parts ^= stream.STREAM_FLAG
            return True   # not ours: _on_frame drops it without looking at the payload
        parts = f.parts & ~stream.STREAM_FLAG
        n = None
        if self._stream_in is not None:
            n = stream.read_reference(self.frame_key, topic, f.src, f.dst, f.topic, f.msg_id, f.part, parts,
                                      f.total, f.payload)
        if n is None:
            self.stats["forged_frames" if self.frame_key is not None else "malformed"] += 1
            self._reject("forged" if self.frame_key is not None else "malformed",
                         f"a stream reference in the name of {f.src!r} on {topic} that does not verify")
            return False
        if (f.msg_id, f.part) <= self._stream_last.get((topic, f.src), (-1, -1)):
            self.stats["replayed_frames"] += 1   # its bytes were taken by the first: it would wait forever
            return False
        data = self._stream_in.take(f.src, stream.frame_key(topic, f.dst, f.topic, f.msg_id, f.part, parts, f.total))
        if data is None:
            return None
        if len(data) != n:
            self._malformed(f"stream bytes of {f.src!r} on {topic}: {len(data)}, the reference says {n}")
            return False
        # On POOL_VIEWS topics the buffer zmq received into is lent, not copied (an array is
        # delivered as a view: real.reassembly), as a shared-memory slot is
        if self._logical.get(topic, topic) in POOL_VIEWS:
            data = np.frombuffer(data, np.uint8)
            data.flags.writeable = False   # lent as a shared-memory slot is: to read
        f.payload = data
        f.parts = parts
        self._stream_last[(topic, f.src)] = (f.msg_id, f.part)
        self._stream_last.move_to_end((topic, f.src))
        if len(self._stream_last) > MAX_SENDERS:   # unsealed, anyone may claim any name
            self._stream_last.popitem(last=False)
        self.stats["stream_recv_frames"] += 1
        return True

    def _open_stream(self, profile: str, peers, whc_high: Optional[str]) -> str:
        """Bind this node's stream (real.stream) when the profile carries one; its endpoint, or "".
        A destination may have the writer history's bytes unacknowledged on it (real.stream_out)."""
        self._parked: dict[tuple[str, str], deque] = {}   # (topic, sender) -> frames waiting, in order
        self._stream_last: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()   # the last taken
        self._stream_in = self._stream_out = None
        if not stream.enabled(profile):
            return ""
        self._stream_out = stream_out.StreamOut(self.node, self.frame_key, self.stats,
                                               whc_high_bytes(whc_high))
        self._stream_in = stream.StreamIn(self.node, stream.local_address(stream.peer_list(peers)), self.frame_key,
                                          self.frame_bytes, self.stats, on_bytes=self._stream_woke)
        return self._stream_in.endpoint

    def _stream_woke(self, sender: str) -> None:
        if self._parked:   # a frame may wait for these bytes: the receive thread looks again
            self._guard_set = True
            self._guard.set(True)
