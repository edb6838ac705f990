"""The receive side of real mode's transport, without DDS: frames in, messages out.

``Reassembler`` checks every decoded frame and keeps the pieces of incomplete
messages within bounds (count, bytes, age); ``RejectLimiter`` turns what it
drops into rate-limited ``frame_rejected`` events.  ``DdsTransport``
(``real.transport``) is a Reassembler fed by its receive thread (``real.receiving``);
``tools/fuzz.py`` drives one with arbitrary frames.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from dtemu.core import events as ev
from dtemu.core.wire import frame_auth
from dtemu.real.wire import Frame

log = logging.getLogger(__name__)

FRAME_BYTES = 1 << 20
MAX_MESSAGE_BYTES = 1 << 30


@dataclass
class Message:
    """A reassembled message.  Times are on this process's ``time.monotonic()`` clock:
    ``sent_at`` is the DDS source timestamp of the first frame (sender's wall clock,
    moved to this clock with the offset real.clock_sync measured; 0.0 if unknown), ``received_at``
    when the last frame arrived."""
    topic: str
    src: str
    data: bytes
    sent_at: float
    received_at: float
    dst: str = ""
    tag: str = ""
    msg_id: int = 0
    # sent_at is still on the sender's clock: its offset was not measured yet when it arrived
    sender_clock: bool = False


@dataclass
class _Pending:
    topic: str
    src: str
    msg_id: int
    parts: int
    total: int
    tag: str
    dst: str
    source_ts: int
    chunks: list = field(default_factory=list)
    got: int = 0
    next_part: int = 1
    touched: float = 0.0


REASSEMBLY_STATS = ("recv_msgs", "recv_bytes", "malformed", "orphan_frames", "incomplete_dropped",
                    "own_frames", "not_for_me", "errors", "forged_frames", "replayed_frames", "duplicate_frames")
MAX_SENDERS = 4096  # (topic, sender) pairs whose newest message id is remembered
REJECT_KINDS = ("malformed", "orphan", "incomplete_dropped", "forged", "replayed")
_MAX_DETAIL = 300


class Reassembler:
    """The receive side of ``DdsTransport`` without DDS: decoded frames in, messages out.

    ``_on_frame`` checks each frame, keeps the pieces of incomplete messages per
    (topic, src, msg_id) within the bounds (count, bytes, age) and hands complete
    messages to ``_deliver`` (the transport queues them for ``recv``; this base
    class keeps them in ``delivered``).  Only the receive thread calls it, so it
    has no lock.  ``tools/fuzz.py`` drives it with arbitrary frames.

    With ``key`` (the run's shared key), a frame counts only if its tag
    verifies (``core.wire.frame_auth``): a forged frame is dropped before it touches
    any state.  In every run a sender's messages on a topic must start with
    growing message ids: a part 0 that is not newer than the last one started
    (a replay) is dropped, and so is a repeated frame of the message being
    built; neither can evict an honest sender's message in flight.

    ``on_reject(kind, detail)``, if set, is called for every frame or message
    dropped: ``kind`` is "malformed", "orphan", "incomplete_dropped", "forged"
    or "replayed".  It runs on
    the receive thread and must be quick; whatever it raises is counted in
    ``stats["errors"]`` and never leaves the thread.  If it has a ``flush()``
    method, that is called about once a second and when the transport closes.
    """

    def __init__(self, node: str, *, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 max_pending_messages: int = 64, max_pending_bytes: int = 2 * MAX_MESSAGE_BYTES,
                 pending_timeout_s: float = 120.0, stats: Optional[dict] = None, on_reject=None,
                 key: Optional[bytes] = None):
        self.node = node
        self.frame_key = frame_auth.frame_key(key) if key else None
        self.max_message_bytes = int(max_message_bytes)
        self.max_pending_messages = int(max_pending_messages)
        self.max_pending_bytes = int(max_pending_bytes)
        self.pending_timeout_s = float(pending_timeout_s)
        self.stats: dict[str, int] = stats if stats is not None else dict.fromkeys(REASSEMBLY_STATS, 0)
        self.on_reject = on_reject
        self.last_error: str = ""
        self._pending: dict[tuple, _Pending] = {}
        self._current: dict[tuple, tuple] = {}  # (topic, src) -> key of its pending message
        # (topic, src) -> id of the newest message it started; bounded (least recently started out)
        # so that made-up sender names in an unsealed run cannot grow it without end
        self._last_id: OrderedDict[tuple, int] = OrderedDict()
        self._pending_bytes = 0
        self.delivered: list[Message] = []  # only with the base class's _deliver

    def _reject(self, kind: str, detail: str) -> None:
        cb = self.on_reject
        if cb is None:
            return
        try:
            cb(kind, detail[:_MAX_DETAIL])
        except Exception as exc:  # the callback's bug must not kill the receiver
            self.stats["errors"] += 1
            self.last_error = repr(exc)
            log.exception("on_reject callback of %s", self.node)

    def _flush_rejects(self, final: bool = True) -> None:
        flush = getattr(self.on_reject, "flush", None)
        if flush is None:
            return
        try:
            flush(final=final)
        except Exception as exc:
            self.stats["errors"] += 1
            self.last_error = repr(exc)
            log.exception("on_reject flush of %s", self.node)

    def _malformed(self, why: str, key: Optional[tuple] = None) -> None:
        self.stats["malformed"] += 1
        log.debug("%s: malformed frame dropped: %s", self.node, why)
        self._reject("malformed", why)
        if key is not None:
            self._drop_pending(key)

    def _on_frame(self, topic: str, f: Frame, source_ts: int, checked: bool = False) -> None:
        """One frame in; ``checked``: authenticated already (real.stream's), so no tag to check."""
        payload = f.payload
        if f.src == self.node:
            self.stats["own_frames"] += 1
            return
        if f.dst and f.dst != self.node:
            self.stats["not_for_me"] += 1
            return
        if self.frame_key is not None and not checked:
            payload = frame_auth.check(self.frame_key, topic, f.src, f.dst, f.topic, f.msg_id, f.part, f.parts,
                                       f.total, payload)
            if payload is None:
                self.stats["forged_frames"] += 1
                self._reject("forged", f"a frame in the name of {f.src!r} on {topic} with no valid tag")
                return
        n = len(payload)
        if (not f.src or f.parts == 0 or f.part >= f.parts or f.total > self.max_message_bytes
                or n > f.total or (f.total > 0 and n == 0) or f.parts > max(1, f.total)):
            self._malformed(f"src={f.src!r} part={f.part}/{f.parts} total={f.total} len={n}")
            return
        key = (topic, f.src, f.msg_id)
        p = self._pending.get(key)
        if p is not None and f.part < p.next_part:  # a frame of this message again
            self.stats["duplicate_frames"] += 1
            return
        if p is None:
            if f.part == 0 and f.msg_id <= self._last_id.get((topic, f.src), -1):
                self.stats["replayed_frames"] += 1
                self._reject("replayed", f"message {f.msg_id} of {f.src!r} on {topic} is not newer than "
                                         f"{self._last_id[(topic, f.src)]}")
                return
            if f.part != 0:
                self.stats["orphan_frames"] += 1  # e.g. a late joiner's replay of an older, larger blob
                self._reject("orphan", f"part {f.part}/{f.parts} of message {f.msg_id} of {f.src!r} on {topic}")
                return
            old = self._current.get((topic, f.src))
            if old is not None:  # its sender moved on: the older message can never complete
                self._drop_pending(old)
            self._last_id[(topic, f.src)] = f.msg_id
            self._last_id.move_to_end((topic, f.src))
            if len(self._last_id) > MAX_SENDERS:
                self._last_id.popitem(last=False)
            if f.parts == 1:
                if n != f.total:
                    self._malformed("single-frame message with the wrong size")
                    return
                # a slot of a shared-memory pool lent as an array (real.shm) is delivered as a
                # read-only memoryview of it, not copied; anything else as bytes
                data = memoryview(payload) if isinstance(payload, np.ndarray) else bytes(payload)
                self._deliver(topic, f.src, f.dst, f.topic, f.msg_id, data, source_ts)
                return
            p = _Pending(topic, f.src, f.msg_id, f.parts, f.total, f.topic, f.dst, source_ts,
                         [payload], n, 1, time.monotonic())
            self._pending[key] = p
            self._current[(topic, f.src)] = key
            self._pending_bytes += n
            self._enforce_bounds(key)
            return
        if (f.parts != p.parts or f.total != p.total or f.part != p.next_part or p.got + n > p.total
                or f.topic != p.tag or f.dst != p.dst):
            self._malformed(f"inconsistent frame {f.part}/{f.parts} for message {f.msg_id} of {f.src}", key)
            return
        p.chunks.append(payload)
        p.got += n
        p.next_part += 1
        p.touched = time.monotonic()
        self._pending_bytes += n
        if p.next_part < p.parts:
            self._enforce_bounds(key)
            return
        self._drop_pending(key, counted=False)
        if p.got != p.total:
            self._malformed(f"message {f.msg_id} of {f.src}: {p.got} bytes for total {p.total}")
            return
        self._deliver(topic, p.src, p.dst, p.tag, p.msg_id, b"".join(p.chunks), p.source_ts)

    def _drop_pending(self, key: tuple, counted: bool = True) -> None:
        p = self._pending.pop(key, None)
        if p is None:
            return
        self._pending_bytes -= p.got
        if self._current.get((p.topic, p.src)) == key:
            del self._current[(p.topic, p.src)]
        if counted:
            self.stats["incomplete_dropped"] += 1
            self._reject("incomplete_dropped",
                         f"message {p.msg_id} of {p.src!r} on {p.topic}: {p.got} of {p.total} bytes")

    def _enforce_bounds(self, keep: tuple) -> None:
        while (len(self._pending) > self.max_pending_messages or self._pending_bytes > self.max_pending_bytes):
            victims = [k for k in self._pending if k != keep]
            if not victims:
                if self._pending_bytes > self.max_pending_bytes:
                    self._drop_pending(keep)
                return
            oldest = min(victims, key=lambda k: self._pending[k].touched)
            self._drop_pending(oldest)

    def _expire(self, now: float) -> None:
        for k in [k for k, p in self._pending.items() if now - p.touched > self.pending_timeout_s]:
            self._drop_pending(k)

    def _deliver(self, topic, src, dst, tag, msg_id, data: bytes, source_ts: int) -> None:
        self.stats["recv_msgs"] += 1
        self.stats["recv_bytes"] += len(data)
        self.delivered.append(Message(topic=topic, src=src, data=data, sent_at=0.0, received_at=0.0,
                                      dst=dst, tag=tag, msg_id=msg_id))


class RejectLimiter:
    """An ``on_reject`` callback that logs rejects as events without letting a flood fill the disk.

    ``emit(kind, **fields)`` (a node's ``emit``) gets a ``frame_rejected`` event
    (layer "transport", reason, detail) for at most ``per_window`` rejects of each
    reason per ``window_s`` (5 per 10 s: a flood adds a handful of lines a minute);
    the others are only counted, and the end of the reason's window (the
    transport checks about once a second, and when it closes) reports them as one
    ``frame_rejected_summary`` event (reason, suppressed since the last report,
    total so far).  Thread-safe.
    """

    def __init__(self, emit, per_window: int = 5, window_s: float = 10.0, clock=time.monotonic):
        self.emit = emit
        self.per_window = int(per_window)
        self.window_s = float(window_s)
        self.clock = clock
        self.totals: dict[str, int] = {}
        self._windows: dict[str, list] = {}  # reason -> [window start, emitted in it, suppressed unreported]
        self._lock = threading.Lock()

    def __call__(self, kind: str, detail: str) -> None:
        now = self.clock()
        with self._lock:
            w = self._windows.get(kind)
            if w is None or now - w[0] >= self.window_s:
                if w is not None:
                    self._summary(kind, w)
                w = self._windows[kind] = [now, 0, 0]
            self.totals[kind] = self.totals.get(kind, 0) + 1
            if w[1] < self.per_window:
                w[1] += 1
                self.emit(ev.FRAME_REJECTED, layer="transport", reason=kind, detail=detail)
            else:
                w[2] += 1

    def flush(self, final: bool = True) -> None:
        """Report what was held back: of every window (``final``, when the transport closes), or
        only of the windows that have ended (the transport's periodic call)."""
        now = self.clock()
        with self._lock:
            for kind, w in self._windows.items():
                if final or now - w[0] >= self.window_s:
                    self._summary(kind, w)

    def _summary(self, kind: str, w: list) -> None:
        if w[2]:
            self.emit(ev.FRAME_REJECTED_SUMMARY, layer="transport", reason=kind, suppressed=w[2],
                      total=self.totals[kind])
            w[2] = 0
