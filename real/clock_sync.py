"""Each peer's clock against this node's: NTP's exchange over DDS, so no time compares two clocks.

A receiver reads when a message was sent from its DDS source timestamp, which
is the *sender's* wall clock.  A message's transfer time (events' ``comm_s``),
ESync's m_k (``core.fl.esync``) and a paced link's delivery time
(``real.paced_links``) subtract it from the receiver's clock.  Between two
machines whose clocks are off by a second, an ESync client would then look a
second slow (issue 28, part 4).  So every transport measures each peer's offset
with NTP's four timestamps and reads source timestamps on its own clock:

- it ticks on ``ctl/clock`` (``real.wire.Tick``): a ping at ``t1``, its own wall clock;
- every peer answers it in its own next tick (``t1`` echoed, ``t2`` when the ping was taken, both
  on the peer's clock; the answering tick's own ``t1`` is ``t3``);
- the answer is taken at ``t4``, and then::

      delay  = (t4 - t1) - (t3 - t2)          # the round trip, less the peer's time
      offset = ((t2 - t1) + (t3 - t4)) / 2    # the peer's clock minus ours

  exact when both halves of the trip take equally long; off by at most half
  the delay otherwise.  Of a peer's last ``KEEP`` answers the one with the
  least delay gives its offset (a queued answer only lengthens the delay; an answer held until
  the peer's next tick does not, since ``t3 - t2`` takes it out).

Answers ride in ticks because a DDS topic delivers every sample to every reader: an answer of its
own to each ping was N^2 samples a period for every node to wake for and take (10 ranks: 25-34
wake-ups and 0.005 CPU s a second each, 4% of a testbed site's 0.533 CPU; entry 52 of the notebook).
A tick is one sample a node a period, whatever it answers.

Pings go every ``FAST_S`` for the first ``FAST_PINGS``, then every ``SLOW_S``
(clocks drift slowly); a tick from a peer that has not answered yet is followed
by one of ours at once (answering it).  Until a peer has answered, its offset is 0.  A role's
barrier (real.primitives' ``wait_peers``) waits, at most ``WAIT_S``, for its
peers' first answers; a message that still arrived before its sender's is read
on our clock when the role takes it, if the answer has come by then
(``DdsTransport.recv`` never waits for one: anyone can publish under a name
that never answers).  A tick that in a sealed run does not carry a valid tag, and an answer
to us that is not to a ping of ours, is counted (``stats["clock_refused"]``) and dropped: anyone
on the domain can publish a Tick.

``DTEMU_CLOCK_SKEW_S`` sets this process's clock off by that many seconds
(source timestamps, ticks, and the rank's own clock, ``real.primitives``): it
is how the tests make a machine whose clock is wrong.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections import deque

from cyclonedds.core import GuardCondition, InstanceState, Policy, Qos, ReadCondition, SampleState, ViewState, WaitSet
from cyclonedds.pub import DataWriter
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

from dtemu.core.wire import frame_auth
from dtemu.host.thread_name import name_this_thread
from dtemu.real.dds_support import _delete_entity
from dtemu.real.wire import MAX_TICK_ANSWERS, Tick, TickAnswer

log = logging.getLogger("dtemu.real.clock_sync")

SKEW_ENV = "DTEMU_CLOCK_SKEW_S"
CLOCK = "ctl/clock"
KEEP = 8
FAST_PINGS, FAST_S, SLOW_S = 20, 0.05, 2.0
WAIT_S = 2.0  # the most a barrier waits for its peers' first answers (one that never answers stays at 0)
_OUTSTANDING = 32  # pings whose answers are still taken
# clocks kept, and pings answered in one tick: an unsealed domain's answers may claim any number of names
MAX_PEERS = MAX_TICK_ANSWERS


def skew_ns() -> int:
    """This process's clock error, injected (``DTEMU_CLOCK_SKEW_S``; 0 by default)."""
    try:
        return int(float(os.environ.get(SKEW_ENV, "0") or 0) * 1e9)
    except ValueError:
        return 0


class Offsets:
    """Each peer's clock minus ours, in seconds, from NTP exchanges (no I/O: the arithmetic)."""

    def __init__(self, keep: int = KEEP, max_peers: int = MAX_PEERS):
        self._samples: dict[str, deque] = {}
        self._keep = keep
        self._max_peers = max_peers
        self._best: dict[str, float] = {}

    def add(self, peer: str, t1: int, t2: int, t3: int, t4: int) -> bool:
        """One answered ping (ns); False if its times cannot be a round trip, or it is from one
        peer more than this keeps."""
        delay = (t4 - t1) - (t3 - t2)
        if t4 < t1 or t3 < t2 or delay < 0:
            return False
        if peer not in self._samples and len(self._samples) >= self._max_peers:
            return False
        samples = self._samples.setdefault(peer, deque(maxlen=self._keep))
        samples.append((delay, ((t2 - t1) + (t3 - t4)) / 2))
        self._best[peer] = min(samples)[1] / 1e9
        return True

    def offset(self, peer: str) -> float:
        """``peer``'s clock minus ours, s (0 until it has answered)."""
        return self._best.get(peer, 0.0)

    def known(self, peer: str) -> bool:
        """Has ``peer`` answered (a lookup: every message received asks)?"""
        return peer in self._best

    def delay(self, peer: str) -> float | None:
        """The least round trip seen to ``peer``, s."""
        samples = self._samples.get(peer)
        return min(samples)[0] / 1e9 if samples else None

    def as_dict(self) -> dict:
        return {p: {"offset_s": round(self._best[p], 6), "delay_s": round(self.delay(p), 6),
                    "samples": len(self._samples[p])} for p in sorted(self._best)}


class ClockExchange:
    """This node's pings and answers on ``ctl/clock``, on a thread of their own."""

    def __init__(self, participant, node: str, fkey: bytes | None, stats: dict, skew: int = 0):
        self.node, self._fkey, self.stats = node, fkey, stats
        self.skew = skew  # ns: this clock's error, injected
        stats.setdefault("clock_samples", 0)
        stats.setdefault("clock_refused", 0)
        stats.setdefault("clock_ticks", 0)  # ticks this node wrote
        stats.setdefault("clock_taken", 0)  # peers' ticks it took: N - 1 a period (answers ride in them)
        self.offsets = Offsets()
        self._sent: deque = deque(maxlen=_OUTSTANDING)  # t1 of our recent ticks (pings)
        self._pending: dict[str, tuple[int, int]] = {}  # peer -> its latest ping's t1, when we took it
        self._answered = threading.Condition()  # notified on each answer taken
        self._last_tick = 0.0
        self._closing = False
        qos = Qos(Policy.Reliability.BestEffort, Policy.History.KeepLast(64))
        topic = Topic(participant, CLOCK, Tick)
        self._writer = DataWriter(participant, topic, qos=qos)
        self._reader = DataReader(participant, topic, qos=qos)
        cond = ReadCondition(self._reader, SampleState.Any | ViewState.Any | InstanceState.Any)
        self._guard = GuardCondition(participant)  # wakes the thread to stop
        self._ws = WaitSet(participant)
        self._ws.attach(cond)
        self._ws.attach(self._guard)
        self._entities = [topic, self._writer, self._reader, cond, self._guard]
        self._thread = threading.Thread(target=self._run, name=f"dds-clock-{node}", daemon=True)
        self._thread.start()

    def offset(self, peer: str) -> float:
        return self.offsets.offset(peer)

    def known(self, peer: str) -> bool:
        """Whether ``peer`` has answered a ping (its offset is measured)."""
        return self.offsets.known(peer)

    def wait(self, peers, timeout_s: float) -> list[str]:
        """Wait until every one of ``peers`` has answered a ping; those that have not, at the end."""
        deadline = time.monotonic() + timeout_s
        with self._answered:
            while True:
                missing = [p for p in peers if not self.known(p)]
                left = deadline - time.monotonic()
                if not missing or left <= 0 or self._closing:
                    return missing
                self._answered.wait(left)

    def wall_ns(self) -> int:
        """This node's wall clock (ns since the epoch), as a machine with its error would read it."""
        return time.time_ns() + self.skew

    def local_time(self, peer: str, peer_ns: int) -> float:
        """A time ``peer`` read on its clock (ns), on ours (s since the epoch)."""
        return peer_ns / 1e9 - self.offsets.offset(peer)

    def _tick(self) -> None:
        """Ping, and answer every ping taken since the last tick (each peer's latest)."""
        self._last_tick = time.monotonic()
        answers, self._pending = [TickAnswer(dst=p, t1=a, t2=b) for p, (a, b) in self._pending.items()], {}
        t1 = self.wall_ns()
        self._sent.append(t1)
        tag = frame_auth.tick_tag(self._fkey, self.node, t1, [(x.dst, x.t1, x.t2) for x in answers]) \
            if self._fkey else b""
        self._writer.write(Tick(src=self.node, t1=t1, answers=answers, tag=tag), timestamp=self.wall_ns())
        self.stats["clock_ticks"] += 1

    def _run(self) -> None:
        name_this_thread("dtemu-clock")
        ticks, next_tick = 0, time.monotonic()
        while not self._closing:
            try:
                now = time.monotonic()
                if now >= next_tick:
                    self._tick()
                    ticks += 1
                    next_tick = now + (FAST_S if ticks < FAST_PINGS else SLOW_S)
                self._ws.wait(duration(seconds=max(0.001, next_tick - time.monotonic())))
                if not self._closing:
                    self._take()
            except Exception:  # never die: a clock that is not synchronised only keeps offset 0
                if self._closing:
                    break
                self.stats["errors"] = self.stats.get("errors", 0) + 1
                log.exception("clock exchange of %s", self.node)
                time.sleep(0.05)

    def _take(self) -> None:
        for tick in self._reader.take(N=256):
            taken = self.wall_ns()
            if not isinstance(tick, Tick) or tick.src in ("", self.node):
                continue
            self.stats["clock_taken"] += 1
            if self._fkey and not hmac.compare_digest(bytes(tick.tag), frame_auth.tick_tag(
                    self._fkey, tick.src, tick.t1, [(x.dst, x.t1, x.t2) for x in tick.answers])):
                self.stats["clock_refused"] += 1
                continue
            if tick.src in self._pending or len(self._pending) < MAX_PEERS:
                self._pending[tick.src] = (tick.t1, taken)  # answered in our next tick
            for ans in tick.answers:
                if ans.dst != self.node:
                    continue  # an answer to someone else
                if ans.t1 in self._sent and self.offsets.add(tick.src, ans.t1, ans.t2, tick.t1, taken):
                    self.stats["clock_samples"] += 1
                    with self._answered:  # (DdsTransport.recv may wait for it)
                        self._answered.notify_all()
                else:
                    self.stats["clock_refused"] += 1
            if not self.known(tick.src) and time.monotonic() - self._last_tick > 0.005:
                self._tick()  # a new peer: answer and ping it now rather than at the next tick

    def close(self) -> None:
        """Stop the thread; the transport deletes the participant, and these entities with it."""
        self._closing = True
        try:
            self._guard.set(True)
        except Exception:
            pass
        self._thread.join(timeout=5.0)
        for e in reversed([self._ws, *self._entities]):
            _delete_entity(e)
