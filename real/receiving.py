"""The receive side of ``DdsTransport`` (``real.transport``): its thread, a caller's own take, ``recv``.

``Receiving`` is a mixin: ``DdsTransport``'s set-up creates the readers, WaitSets,
guard conditions, queues and locks it works with, and ``real.reassembly.Reassembler``
checks and reassembles what it takes (this module does not import ``real.transport``).

* Receiving: one daemon thread waits on a WaitSet (read conditions + a guard
  condition), takes samples, decodes them with the zero-copy fast path and
  reassembles; it never dies on bad input (malformed frames are counted in
  ``stats["malformed"]`` and dropped; any unexpected exception is counted in
  ``stats["errors"]``).  Incomplete messages are bounded (count, bytes, age).
  ``on_reject(kind, detail)`` hears of every dropped frame or message
  (``RejectLimiter`` turns them into rate-limited ``frame_rejected`` events).
  The reassembly itself is ``Reassembler``, which needs no DDS.
* Order: because ``Frame`` is keyed on ``part`` (``real.transport``, QoS),
  ``take`` returns samples grouped by instance rather than in arrival order, so
  the receiver takes the whole reader cache at once and sorts it by
  (src, msg_id, part): with per-writer in-order delivery that restores each
  sender's order.
* Some topics are taken by their caller.  The readers of ``caller_takes``
  (``CALLER_TAKES``: ``ps/state_reply``, which a worker reads right after its
  query, and ``ps/state``, all the state server reads) are on a WaitSet of
  their own: the thread in ``recv`` waits there and
  takes and reassembles their samples itself, through the same checks (bad
  input counted and dropped, tags verified, events), under the lock the
  receive thread takes too.  That spares a thread's wake-up and a hand-off
  per answer (docs/notebook/, the state server's answer time).  What arrives
  there while nobody waits is taken by the receive thread every 0.2 s, and a
  message the receive thread queues on another topic the caller waits for
  wakes it.  A message's ``received_at`` is when it was taken, and its
  ``sent_at`` its DDS source timestamp read on this node's clock
  (``real.clock_sync``).
* Payloads beside DDS (``real.beside``): a frame that carries a reference to a
  shared-memory slot (``real.shm``) or to bytes on the stream (``real.stream``)
  gets its bytes first, then goes on through the same checks; a frame whose
  bytes are not here yet waits, and its sender's later frames on that topic
  wait behind it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Iterable, Optional

from cyclonedds.core import DDSException, InstanceState, SampleState, ViewState
from cyclonedds.sub import DataReader
from cyclonedds.util import duration

from dtemu.host.thread_name import name_this_thread
from dtemu.real import shm, stream
from dtemu.real.reassembly import Message
from dtemu.real.wire import Frame, WireError, decode_frame

try:  # the raw take the stock DataReader.take uses, without its per-batch deserialization
    from cyclonedds._clayer import ddspy_take as _ddspy_take
except Exception:  # pragma: no cover - only if cyclonedds changes its internals
    _ddspy_take = None

log = logging.getLogger("dtemu.real.transport")  # the receiver's log records stay the transport's

_ANY_STATE = SampleState.Any | ViewState.Any | InstanceState.Any

_TICK_S = 0.2  # the receive thread also takes the callers' topics this often, so nothing waits there


class Receiving:
    """``DdsTransport``'s receive thread, its callers' own takes and ``recv``; see the module docstring."""

    def recv(self, topics: Optional[Iterable[str] | str] = None, timeout_s: Optional[float] = None) -> Optional[Message]:
        """The oldest complete message on ``topics`` (default: every subscribed topic),
        waiting up to ``timeout_s`` (None = forever); None on timeout or after close()."""
        if isinstance(topics, str):
            topics = [topics]
        wanted = list(topics) if topics is not None else None
        if wanted is not None:
            missing = [t for t in wanted if t not in self._readers]
            if missing:
                raise ValueError(f"not subscribed to {missing}; call subscribe() first")
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        if self._caller_readers and (wanted is None or not self._caller_takes.isdisjoint(wanted)):
            msg = self._recv_taking(wanted, deadline)
        else:
            msg = self._recv_queued(wanted, deadline)
        return self._on_our_clock(msg) if msg is not None and msg.sender_clock else msg

    def _on_our_clock(self, msg: Message) -> Message:
        """A message that came before its sender's clock was measured: its time on ours, if the
        clock is measured by now (the first messages of a run can beat the clocks' first exchange;
        a role's barrier waits for its peers' clocks, real.primitives).  Never waited for here:
        a sender that never answers (anyone can publish under any name) would stall the role."""
        if self.clock.known(msg.src):
            msg.sent_at = min(msg.received_at, msg.sent_at - self.clock.offset(msg.src))
            msg.sender_clock = False
        else:   # still not measured: read as sent when it came (a clock's error is not a transfer)
            msg.sent_at = min(msg.received_at, msg.sent_at)
        return msg

    def _pop(self, wanted: Optional[list[str]]) -> Optional[Message]:
        """The oldest queued message on ``wanted``, or None (with ``_cv`` held)."""
        best = None
        for t in (wanted if wanted is not None else list(self._queues)):
            q = self._queues.get(t)
            if q and (best is None or q[0][0] < best[0][0]):
                best = q
        return best.popleft()[1] if best is not None else None

    def _recv_queued(self, wanted: Optional[list[str]], deadline: Optional[float],
                     cap_s: float = 1.0) -> Optional[Message]:
        """Wait for the receive thread to queue a message (or, with ``cap_s``, for a while)."""
        with self._cv:
            while True:
                msg = self._pop(wanted)
                if msg is not None:
                    return msg
                if self._closed:
                    return None
                left = cap_s if deadline is None else min(cap_s, deadline - time.monotonic())
                if left <= 0:
                    return None
                self._cv.wait(left)
                if cap_s < 1.0:  # one wait: the caller checks whether it can take for itself now
                    return self._pop(wanted)

    def _recv_taking(self, wanted: Optional[list[str]], deadline: Optional[float]) -> Optional[Message]:
        """recv of a caller_takes topic: this thread waits on those topics' readers and takes
        their samples itself (the same checks and reassembly as the receive thread's); what
        the receive thread queues meanwhile on ``wanted`` wakes it too (_deliver)."""
        while not self._caller_lock.acquire(blocking=False):  # another thread is taking: its turn
            msg = self._recv_queued(wanted, deadline, cap_s=0.01)
            if msg is not None or self._closed or (deadline is not None and time.monotonic() >= deadline):
                return msg
        try:
            self._caller_wants = frozenset(wanted) if wanted is not None else frozenset(self._queues)
            while True:
                if self._caller_poked:
                    self._caller_poked = False
                    self._caller_guard.set(False)
                with self._cv:
                    msg = self._pop(wanted)
                    if msg is not None or self._closing:
                        return msg
                left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if left > 0:
                    try:  # returns at once if a reader holds samples already (its condition: any sample)
                        self._caller_ws.wait(duration(seconds=left))
                    except DDSException:  # deleted by close()
                        if self._closing:
                            return None
                        raise
                try:
                    self._drain(self._caller_readers)
                except Exception as exc:  # a take that failed: closing, or counted as the thread does
                    if self._closing:
                        return None
                    self._receive_error(exc)
                if left <= 0:  # time is up: what the readers held was the last look
                    with self._cv:
                        return self._pop(wanted)
        finally:
            self._caller_wants = None
            self._caller_lock.release()

    def pending_count(self) -> int:
        """Complete messages waiting for recv()."""
        with self._cv:
            return sum(len(q) for q in self._queues.values())

    def _run(self) -> None:
        name_this_thread("dtemu-recv")
        last_expire = last_tick = time.monotonic()
        while not self._closing:
            try:
                self._ws.wait(duration(seconds=_TICK_S))
                if self._closing:
                    break
                if self._guard_set:  # (a C call: not on every wake-up)
                    self._guard_set = False
                    self._guard.set(False)
                self._drain()
                now = time.monotonic()
                if now - last_tick >= _TICK_S:  # the callers' topics, when no caller is taking them
                    last_tick = now
                    if self._caller_readers and not self._caller_lock.locked():
                        self._drain(self._caller_readers)
                if now - last_expire >= 1.0:
                    last_expire = now
                    with self._drain_lock:
                        self._expire(now)
                    self._flush_rejects(final=False)
            except Exception as exc:  # never die
                if self._closing:
                    break
                self._receive_error(exc)

    def _receive_error(self, exc: Exception) -> None:
        self.stats["errors"] += 1
        self.last_error = repr(exc)
        log.exception("dds receiver of %s", self.node)
        time.sleep(0.05)

    def _take(self, reader: DataReader):
        # Take *everything* available: Frame is keyed on ``part`` so take() returns samples
        # grouped by instance, not in arrival order.  DDS delivers one writer's samples in
        # order, so a snapshot of the whole reader cache, sorted by (src, msg_id, part),
        # restores each sender's order (see _drain).
        n = max(1, self._reader_max_samples)
        if _ddspy_take is not None:
            ret = _ddspy_take(reader._ref, _ANY_STATE, n)
            if isinstance(ret, int):
                raise DDSException(ret, "take")
            return ret
        return [(s, s.sample_info) for s in reader.take(n)]  # pragma: no cover

    def _drain(self, readers: Optional[list] = None) -> None:
        """Take and reassemble what ``readers`` hold (default: the receive thread's)."""
        if readers is None:
            readers = self._thread_readers
        with self._lock:
            readers = list(readers)
        with self._drain_lock:
            if self._parked:
                self._release_parked()
            for topic, reader in readers:
                self._drain_reader(topic, reader)
            if self._parked:   # bytes that came while their frame was being parked
                self._release_parked()

    def _drain_reader(self, topic: str, reader: DataReader) -> None:
        while not self._closing:
            batch = self._take(reader)
            if not batch:
                break
            frames = []
            for data, info in batch:
                if not info.valid_data:  # instance state changes (a writer went away)
                    continue
                self.stats["recv_frames"] += 1
                if isinstance(data, Frame):  # fallback path of _take
                    f = data
                    f.payload = memoryview(bytes(f.payload))
                else:
                    try:
                        f = decode_frame(data, copy=False)
                    except WireError as exc:
                        self._malformed(str(exc))
                        continue
                frames.append((f, info.source_timestamp))
            if len(frames) > 1:
                frames.sort(key=lambda x: (x[0].src, x[0].msg_id, x[0].part))
            for f, ts in frames:
                self._take_frame(topic, f, ts)
            if len(batch) < self._reader_max_samples:
                break

    def _take_frame(self, topic: str, f: Frame, ts: int) -> None:
        """One frame, in its sender's order on ``topic``: after any of that sender's frames still
        waiting for their bytes from the stream (real.stream), else now."""
        waiting = self._parked.get((topic, f.src)) if self._parked else None
        if waiting is not None:
            waiting.append((f, ts, time.monotonic()))
            return
        checked = False
        if f.parts & stream.STREAM_FLAG:
            got = self._from_stream(topic, f)
            if got is None:   # its bytes are still on their way
                self._parked[(topic, f.src)] = deque([(f, ts, time.monotonic())])
                return
            if not got:
                return
            checked = True    # its reference verified, its bytes came on the sender's own connection
        if f.parts & shm.SHM_FLAG and not self._from_pool(topic, f):
            return
        self._frame_in(topic, f, ts, checked)

    def _frame_in(self, topic: str, f: Frame, ts: int, checked: bool = False) -> None:
        try:
            self._on_frame(topic, f, ts, checked)
        except Exception as exc:  # a bug, not bad input: count, keep going
            self.stats["errors"] += 1
            self.last_error = repr(exc)
            log.exception("dds receiver of %s: frame on %s", self.node, topic)

    def _deliver(self, topic, src, dst, tag, msg_id, data: bytes, source_ts: int) -> None:
        topic = self._logical.get(topic, topic)  # a per-node DDS topic delivers as its topic
        now = time.monotonic()
        sent_at = 0.0
        known = True
        if source_ts and source_ts > 0:  # the sender's clock, read on ours (real.clock_sync)
            known = self.clock.known(src)
            age = self.clock.wall_ns() / 1e9 - self.clock.local_time(src, source_ts)
            # Never after its arrival: the offset is exact only to half the round trip's asymmetry.  An
            # offset not measured yet (0 here) is subtracted when the role takes the message
            # (_on_our_clock), which clamps then: clamped now, the sender's clock error would be lost.
            sent_at = now - (max(0.0, age) if known else age)
        msg = Message(topic=topic, src=src, data=data, sent_at=sent_at, received_at=now, dst=dst, tag=tag,
                      msg_id=msg_id, sender_clock=not known)
        self.stats["recv_msgs"] += 1
        self.stats["recv_bytes"] += len(data)
        with self._cv:
            self._queues.setdefault(topic, deque()).append((next(self._seq), msg))
            self._cv.notify_all()
        wants = self._caller_wants
        if wants is not None and topic in wants and threading.get_ident() == self._thread.ident:
            self._caller_poked = True
            self._caller_guard.set(True)
