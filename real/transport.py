"""Message transport of real mode over CycloneDDS.

::

    from dtemu.real.transport import DdsTransport
    from dtemu.core.wire.topics import TRAIN_CMD, CLIENT_UPDATE, MODEL_BLOB

    with DdsTransport("server", profile="loopback", domain_id=7) as t:
        t.subscribe([CLIENT_UPDATE])
        missing = t.wait_peers(["client1", "client2"], timeout_s=30)     # presence, by name
        missing = t.wait_matched({TRAIN_CMD: ["client1", "client2"]}, timeout_s=30)
        t.send(MODEL_BLOB, model_bytes)                # to everyone (late joiners get it too)
        t.send(TRAIN_CMD, cmd_bytes, to="client1")     # addressed
        msg = t.recv([CLIENT_UPDATE], timeout_s=60)    # Message or None on timeout

(About 880 lines: ``DdsTransport`` is one object that owns every DDS entity
of a node and the thread that reads them; writing, presence, matching, the
receive loop and teardown share its state and lock.  The pieces that are
not DDS are apart: ``real.reassembly``, ``real.dds_support``, ``real.wire``.)

Design
------
* One DomainParticipant per transport, in a ``cyclonedds.domain.Domain``
  created from ``real.config.config_xml(profile)`` (one Domain per domain id
  and process, shared by the transports of the process, deleted with the last).
* Every topic carries ``real.wire.Frame`` samples.  A message is cut into
  frames of ``frame_bytes`` (1 MiB: the best throughput measured); the frames
  of one message are written back to back (a lock per topic), so with
  reliable in-order delivery per writer they arrive in order, possibly
  interleaved with frames of other senders.  The receiver reassembles per
  (topic, src, msg_id).  Because ``Frame`` is keyed (below), ``take`` returns
  samples grouped by instance rather than in arrival order, so the receiver
  takes the whole reader cache at once and sorts it by (src, msg_id, part):
  with per-writer in-order delivery that restores each sender's order.
* QoS: reliable, KEEP_ALL, reader resource limits; ``train/model_blob`` is
  TRANSIENT_LOCAL with a durability-service history of KEEP_LAST 1 *per
  instance*.  ``Frame`` is keyed on ``part``, so the writer keeps exactly one
  frame per part index: the frames of its last message (plus higher parts of
  an older, larger message, which a late joiner drops as orphans because their
  part 0 is gone).  A late-joining reader thus gets the latest model and only
  that.
* Presence: topic ``ctl/hello`` (keyed on the node name, TRANSIENT_LOCAL)
  carries ``Hello(node, guid, pid, host, tag)`` (keyed on the participant, tagged under a key);
  ``peers()`` lists the live ones,
  and ``matched_peers()`` maps matched endpoints (GUIDs) to node names.
* Receiving: one daemon thread waits on a WaitSet (read conditions + a guard
  condition), takes samples, decodes them with the zero-copy fast path and
  reassembles; it never dies on bad input (malformed frames are counted in
  ``stats["malformed"]`` and dropped; any unexpected exception is counted in
  ``stats["errors"]``).  Incomplete messages are bounded (count, bytes, age).
  ``on_reject(kind, detail)`` hears of every dropped frame or message
  (``RejectLimiter`` turns them into rate-limited ``frame_rejected`` events).
  The reassembly itself is ``Reassembler``, which needs no DDS.
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
  wakes it.  A message's ``received_at`` is when it was taken.
* No Python DDS Listener is used: cyclonedds-python's ``DataWriter.write``
  holds the GIL while ``dds_write`` may block on flow control, and a listener
  needs the GIL from a CycloneDDS thread.  Writes go through ``dds_write``
  via ctypes, which releases the GIL, so this process's receiver keeps
  running while a send blocks.
* Addressed messages reach only their addressee.  A topic of ``addressed``
  (``ADDRESSED_TOPICS`` by default: ``coll/frames``, ``ps/state_reply``,
  ``ps/model``) has, besides its own DDS topic, one per node (``<topic>/to/<node name in
  hex>``) that only that node reads; ``send(..., to=X)`` writes there once
  the writer matched X's reader (``wait_matched`` with names creates those
  writers and waits for them too; otherwise the first send to X creates its
  writer) and on the shared topic until then.  Messages still say their
  logical topic.  On the shared topic, frames from this node itself and messages addressed to
  another node are ignored (``dst`` is filtered at the receiver: DDS ships
  them to every reader of the topic).

* Clocks: ``real.clock_sync`` measures each peer's clock offset (NTP's exchange
  on ``ctl/clock``, on a thread of its own), and a message's ``sent_at`` is its
  DDS source timestamp (the sender's clock) read on this node's clock.

* Same-host payloads go beside DDS (``real.shm``; the ``loopback`` profile,
  unsealed runs, not on durable topics): a frame of 64 KiB or more is copied
  into a slot of a shared-memory pool per (writer, destination) and DDS carries
  the frame with a reference to it instead of its bytes; the receive thread
  copies it out (or, on ``POOL_VIEWS`` topics, lends a read-only view) and the
  frame goes on through the same checks.  A message given as ``Buffers``
  (a collective frame's header and body) goes into its slot piece by piece.

Caveats: messages are ordered per (sender, topic), not across topics;
complete messages wait in memory until ``recv``; a send to a reader whose
process died can block until the peer's lease expires (10 s by default),
bounded by ``write_timeout_s`` after which ``send`` raises DDSException.
"""

from __future__ import annotations

import ctypes as ct
import hmac
import itertools
import logging
import os
import socket
import threading
import time
from collections import deque
from typing import Iterable, Mapping, Optional

from cyclonedds.core import DDSException, GuardCondition, InstanceState, Qos, Policy, ReadCondition, \
    SampleState, ViewState, WaitSet
from cyclonedds.domain import DomainParticipant
from cyclonedds.pub import DataWriter
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

from dtemu.real.config import config_xml
from dtemu.core.runtime.requests import Buffers
from dtemu.core.wire import topics as wire_topics
from dtemu.real.clock_sync import ClockExchange, skew_ns
from dtemu.real.dds_support import _acquire_domain, _dds_write, _dds_write_ts, _delete_entity, _matched_handles, _release_domain, \
    _SampleContainer, _wait_for_acks
from dtemu.real import frame_auth, shm
from dtemu.real.reassembly import FRAME_BYTES, MAX_MESSAGE_BYTES, REASSEMBLY_STATS, Message, Reassembler
from dtemu.real.wire import Frame, Hello, WireError, decode_frame, encode_frame, encode_parts

try:  # the raw take the stock DataReader.take uses, without its per-batch deserialization
    from cyclonedds._clayer import ddspy_take as _ddspy_take
except Exception:  # pragma: no cover - only if cyclonedds changes its internals
    _ddspy_take = None

log = logging.getLogger(__name__)

HELLO = "ctl/hello"  # presence, real mode's own topic; the roles' topics are core.wire.topics

_ANY_STATE = SampleState.Any | ViewState.Any | InstanceState.Any

# Topics whose addressed messages travel on per-node DDS topics (see the module docstring):
# collective frames, the state server's answers (on the shared topic, each of 12 workers woke
# for, took and dropped the 11 answers of every query round that were not its own: half of the
# round trip, docs/notebook/) and the parameter server's models to one worker (an asynchronous
# server's answer to each update went to every worker) and geo's pushes and pulls (on the shared
# topic the global PS's answer to one site reached every rank of every site, across the WAN:
# docs/netns.md, "Geo sites over namespaces").
ADDRESSED_TOPICS = (wire_topics.COLL_FRAMES, wire_topics.SS_REPLY, wire_topics.PS_MODEL,
                    wire_topics.GEO_PUSH, wire_topics.GEO_PULL)
# Topics whose reader's thread does nothing but wait for them: the thread that calls recv takes
# their samples itself (see the module docstring), which spares the receive thread's wake-up and
# its hand-off to the caller on every message: a worker's answers from the state server, and the
# state server's own input (it only ever reads ps/state; no one else subscribes to it).  The
# state server's round trip, docs/notebook/.
CALLER_TAKES = (wire_topics.SS_REPLY, wire_topics.SS_STATE)
# Topics whose messages that came through shared memory may be delivered as read-only views of a
# slot of the sender's pool (a memoryview), not copies: collective frames, whose consumer sums them
# or copies them into place within the operation (real.shm; core.ddp.collectives copies what it
# keeps for longer).
POOL_VIEWS = frozenset({wire_topics.COLL_FRAMES})
_TICK_S = 0.2  # the receive thread also takes the callers' topics this often, so nothing waits there
MAX_ADDRESSED_WRITERS = 4096  # per-node DDS topics a transport sets up; beyond, the shared topic


def _default_domain_id() -> int:
    return int(os.environ.get("DTEMU_DDS_DOMAIN", "0"))


class DdsTransport(Reassembler):
    """Named node on a DDS domain; see the module docstring."""

    def __init__(self, node: str, profile: str = "loopback", domain_id: Optional[int] = None, *,
                 peers: Optional[Iterable[str] | str] = None,
                 subscribe: Iterable[str] = (),
                 frame_bytes: int = FRAME_BYTES,
                 max_message_bytes: int = MAX_MESSAGE_BYTES,
                 max_pending_messages: int = 64,
                 max_pending_bytes: int = 2 * MAX_MESSAGE_BYTES,
                 pending_timeout_s: float = 120.0,
                 reader_max_samples: int = 4096,
                 write_timeout_s: float = 15.0,
                 on_reject=None,
                 key: Optional[bytes] = None,
                 addressed: Iterable[str] = ADDRESSED_TOPICS,
                 whc_high: Optional[str] = None,
                 caller_takes: Iterable[str] = CALLER_TAKES,
                 clock_skew_s: Optional[float] = None):
        """``key``: the run's shared key; every frame sent is tagged and every frame received
        must carry a valid tag (``real.frame_auth``).  ``clock_skew_s``: this node's clock set
        off by so much (default ``$DTEMU_CLOCK_SKEW_S``, 0; real.clock_sync), to test that no time
        compares two clocks."""
        if not node or not isinstance(node, str):
            raise ValueError("node must be a non-empty name")
        if frame_bytes <= frame_auth.TAG_BYTES or max_message_bytes < 1:
            raise ValueError("frame_bytes and max_message_bytes must be positive")
        self.profile = profile
        self.domain_id = _default_domain_id() if domain_id is None else int(domain_id)
        self.frame_bytes = int(frame_bytes)
        self.write_timeout_s = float(write_timeout_s)
        self._reader_max_samples = int(reader_max_samples)
        self.stats: dict[str, int] = dict.fromkeys(
            ("sent_msgs", "sent_bytes", "sent_frames", "recv_frames", "shm_sent_frames", "shm_recv_frames",
             "shm_fallbacks") + REASSEMBLY_STATS, 0)
        Reassembler.__init__(self, node, max_message_bytes=max_message_bytes,
                             max_pending_messages=max_pending_messages, max_pending_bytes=max_pending_bytes,
                             pending_timeout_s=pending_timeout_s, stats=self.stats, on_reject=on_reject, key=key)

        self._lock = threading.RLock()       # entities and readers map
        self._cv = threading.Condition()      # delivered messages
        self._queues: dict[str, deque] = {}
        self._seq = itertools.count()
        self._msg_ids = itertools.count(time.time_ns() // 1000)  # grows across restarts of a node
        self._send_locks: dict[str, threading.Lock] = {}
        self._closing = False
        self._closed = False
        self._entities: list = []  # in creation order, deleted in reverse
        # addressed messages: per-node DDS topics of these topics (see the module docstring)
        self._addressed = frozenset(addressed)
        self._logical: dict[str, str] = {}  # per-node DDS topic -> its topic
        self._addr_readers: dict[str, DataReader] = {}  # this node's per-node topics
        self._addr_ready: set[str] = set()  # per-node DDS topics whose writer matched its reader
        self._addr_names: dict[tuple[str, str], str] = {}  # (topic, node) -> its per-node DDS topic
        # Readers are taken under _drain_lock (the Reassembler's state is one thread's at a time):
        # by the receive thread, which waits on _ws, and for the topics of caller_takes by the
        # thread in recv, which waits on _caller_ws (one such caller at a time: _caller_lock).
        self._drain_lock = threading.Lock()
        self._caller_takes = frozenset(caller_takes)
        self._thread_readers: list[tuple[str, DataReader]] = []  # (DDS topic, reader) the thread waits for
        self._caller_readers: list[tuple[str, DataReader]] = []  # those of caller_takes' topics
        self._caller_lock = threading.Lock()
        self._caller_wants: Optional[frozenset] = None  # what the caller in recv waits for (None: no one)
        self._caller_poked = False  # _caller_guard was set
        self._guard_set = False  # _guard was set by subscribe
        # Same-host payloads through shared memory (real.shm): a pool of slots per (DDS writer,
        # destination) on the way out, the senders' pools mapped on the way in.
        self._shm = shm.enabled(profile, key is not None)
        self._pools: dict[tuple[str, str], shm.Pool] = {}
        self._shm_in = shm.Slots(node)
        self._reader_names: dict[str, tuple[int, list[str]]] = {}  # topic -> (matched count, nodes)

        xml = config_xml(profile, peers, whc_high=whc_high)  # None: $DTEMU_DDS_WHC_HIGH or 2 MiB
        _acquire_domain(self.domain_id, xml)
        try:
            self._dp = DomainParticipant(self.domain_id)
            self.guid = str(self._dp.guid)
            self._topics: dict[str, Topic] = {}
            self._writers: dict[str, DataWriter] = {}
            self._readers: dict[str, DataReader] = {}
            self._ws = WaitSet(self._dp)
            self._guard = GuardCondition(self._dp)
            self._entities += [self._ws, self._guard]
            self._ws.attach(self._guard)
            self._caller_ws = WaitSet(self._dp)
            self._caller_guard = GuardCondition(self._dp)
            self._entities += [self._caller_ws, self._caller_guard]
            self._caller_ws.attach(self._caller_guard)
            # presence
            hello_topic = Topic(self._dp, HELLO, Hello)
            hq = Qos(Policy.Reliability.Reliable(duration(seconds=1)), Policy.Durability.TransientLocal,
                     Policy.History.KeepLast(1))
            self._hello_writer = DataWriter(self._dp, hello_topic, qos=hq)
            self._hello_reader = DataReader(self._dp, hello_topic, qos=hq)
            self._hello_alive = ReadCondition(self._hello_reader,
                                              SampleState.Any | ViewState.Any | InstanceState.Alive)
            self._entities += [hello_topic, self._hello_writer, self._hello_reader, self._hello_alive]
            for t in wire_topics.ALL:
                self._writer(t)
            tag = frame_auth.hello_tag(self.frame_key, node, self.guid) if self.frame_key else b""
            self._hello_writer.write(Hello(node=node, guid=self.guid, pid=os.getpid(), host=socket.gethostname(),
                                           tag=tag))
            skew = skew_ns() if clock_skew_s is None else int(clock_skew_s * 1e9)
            self.clock = ClockExchange(self._dp, node, self.frame_key, self.stats, skew)
            self._thread = threading.Thread(target=self._run, name=f"dds-recv-{node}", daemon=True)
            self._thread.start()
            if subscribe:
                self.subscribe(subscribe)
        except BaseException:
            self.close()
            raise

    # --- entities --------------------------------------------------------------------------
    def _topic(self, name: str) -> Topic:
        t = self._topics.get(name)
        if t is None:
            t = Topic(self._dp, name, Frame)
            self._topics[name] = t
            self._entities.append(t)
        return t

    def _writer(self, name: str) -> DataWriter:
        with self._lock:
            w = self._writers.get(name)
            if w is not None:
                return w
            if self._closing:
                raise RuntimeError("transport is closed")
            policies = [Policy.Reliability.Reliable(duration(seconds=self.write_timeout_s)),
                        Policy.History.KeepAll]
            if name in wire_topics.DURABLE_TOPICS:
                policies += [Policy.Durability.TransientLocal,
                             Policy.DurabilityService(cleanup_delay=0, history=Policy.History.KeepLast(1),
                                                      max_samples=-1, max_instances=-1,
                                                      max_samples_per_instance=-1)]
            w = DataWriter(self._dp, self._topic(name), qos=Qos(*policies))
            self._writers[name] = w
            self._send_locks[name] = threading.Lock()
            self._entities.append(w)
            return w

    def subscribe(self, topics: Iterable[str] | str) -> None:
        """Create readers for ``topics`` (idempotent).  Only ``train/model_blob`` delivers
        what was sent before the subscription (its latest message)."""
        if isinstance(topics, str):
            topics = [topics]
        with self._lock:
            if self._closing:
                raise RuntimeError("transport is closed")
            for name in topics:
                if name in self._readers:
                    continue
                if name == HELLO:
                    raise ValueError(f"{HELLO} is internal")
                n = self._reader_max_samples
                # IgnoreLocal: our own writes never come back to us (they were
                # taken and dropped, a 1 MiB copy each).
                policies = [Policy.Reliability.Reliable(duration(seconds=1)), Policy.History.KeepAll,
                            Policy.ResourceLimits(max_samples=n, max_instances=-1, max_samples_per_instance=n),
                            Policy.IgnoreLocal.Participant]
                if name in wire_topics.DURABLE_TOPICS:
                    policies.append(Policy.Durability.TransientLocal)
                by_caller = name in self._caller_takes
                ws = self._caller_ws if by_caller else self._ws
                readers = self._caller_readers if by_caller else self._thread_readers
                r = DataReader(self._dp, self._topic(name), qos=Qos(*policies))
                cond = ReadCondition(r, _ANY_STATE)
                self._entities += [r, cond]
                with self._cv:
                    self._queues.setdefault(name, deque())
                self._readers[name] = r
                ws.attach(cond)
                readers.append((name, r))
                if name in self._addressed and name not in wire_topics.DURABLE_TOPICS:
                    phys = self.addressed_topic(name, self.node)
                    self._logical[phys] = name
                    ar = DataReader(self._dp, self._topic(phys), qos=Qos(*policies))
                    acond = ReadCondition(ar, _ANY_STATE)
                    self._entities += [ar, acond]
                    self._addr_readers[phys] = ar
                    ws.attach(acond)
                    readers.append((phys, ar))
            self._guard.set(True)  # wake the receiver so it sees the new readers
            self._guard_set = True  # after set(True): the receiver resets it then (see _run)

    @staticmethod
    def addressed_topic(topic: str, node: str) -> str:
        """The DDS topic of ``topic``'s messages to ``node`` (hex: any printable name makes a valid topic name)."""
        return f"{topic}/to/{node.encode().hex()}"

    def _addressed_writer(self, topic: str, node: str) -> DataWriter:
        phys = self.addressed_topic(topic, node)
        with self._lock:
            self._logical[phys] = topic
            return self._writer(phys)

    @property
    def subscribed(self) -> list[str]:
        return sorted(self._readers)

    # --- sending -----------------------------------------------------------------------------
    def _write(self, w: DataWriter, ser: bytes) -> None:
        pad = (-len(ser)) % 4
        if pad:
            ser += b"\0" * pad
        if _dds_write is not None:
            c = _SampleContainer(ct.cast(ct.c_char_p(ser), ct.c_void_p), len(ser))
            if self.clock.skew:  # a clock with an injected error stamps its own time
                ret = _dds_write_ts(w._ref, ct.byref(c), self.clock.wall_ns())
            else:
                ret = _dds_write(w._ref, ct.byref(c))
        else:  # pragma: no cover
            from cyclonedds._clayer import ddspy_write
            ret = ddspy_write(w._ref, ser)
        if ret < 0:
            raise DDSException(ret, f"writing a frame on {w.topic.name}")

    def send(self, topic: str, data, to: Optional[str] = None, *, tag: Optional[str] = None,
             ack_timeout_s: Optional[float] = None, only_frames: Optional[int] = None) -> bool:
        """Send ``data`` (bytes-like) on ``topic`` to everyone, or to node ``to``.

        Blocks until every frame is written (flow control may make that wait for
        readers).  With ``ack_timeout_s`` it then waits until all matched readers
        acknowledged, and returns False if they did not in time; otherwise True.
        ``tag`` (default: the topic) travels in ``Frame.topic`` and comes back as
        ``Message.tag``.  ``only_frames`` writes just the first frames of the
        message (a sender dying mid-upload, for fault injection)."""
        if self._closing:
            raise RuntimeError("transport is closed")
        if isinstance(data, Buffers):   # one frame's pieces go into its slot one by one, unjoined
            mv, total = None, len(data)
        else:
            mv = memoryview(data)
            if mv.ndim != 1 or mv.itemsize != 1 or not mv.contiguous:
                mv = mv.cast("B") if mv.contiguous else memoryview(mv.tobytes())
            total = len(mv)
        if total > self.max_message_bytes:
            raise ValueError(f"message of {total} bytes exceeds max_message_bytes={self.max_message_bytes}")
        wname = topic
        if to and topic in self._addressed:
            phys = self._addr_names.get((topic, to))
            if phys is None:
                phys = self.addressed_topic(topic, to)
                if len(self._addr_names) < MAX_ADDRESSED_WRITERS:
                    self._addr_names[(topic, to)] = phys
            if phys in self._addr_ready:
                wname = phys
            else:
                # The first message to ``to`` sets its writer up (wait_matched with names does it
                # ahead); until that writer matched the addressee's reader, the shared topic.
                # Bounded: roles answer known peers only, but a writer each is not free.
                aw = self._writers.get(phys)
                if aw is None and len(self._logical) < MAX_ADDRESSED_WRITERS:
                    aw = self._addressed_writer(topic, to)
                if aw is not None and aw.get_publication_matched_status().current_count:
                    self._addr_ready.add(phys)
                    wname = phys
        w = self._writer(wname)
        sealed = self.frame_key is not None
        fb = self.frame_bytes - (frame_auth.TAG_BYTES if sealed else 0)  # a frame stays within frame_bytes
        dst, label = to or "", tag or topic
        with self._send_locks[wname]:
            msg_id = next(self._msg_ids)
            dests = self._shm_dests(wname, to) if self._shm and total >= shm.MIN_BYTES else None
            parts = max(1, -(-total // fb))
            if mv is None and not (parts == 1 and dests):
                mv = memoryview(bytes(data))
            for i in range(parts if only_frames is None else min(parts, only_frames)):
                chunk = data if mv is None else mv[i * fb:(i + 1) * fb]
                if sealed:  # the tag first: the receiver checks it before the frame counts (real.frame_auth)
                    chunk = frame_auth.frame_tag(self.frame_key, wname, self.node, dst, label, msg_id, i, parts,
                                                 total, chunk) + chunk
                ref = self._shm_put(wname, dests, chunk) if dests and len(chunk) >= shm.MIN_BYTES else None
                if ref is not None:  # the bytes went through shared memory; DDS carries the reference
                    self._write(w, encode_parts(self.node, dst, label, msg_id, i, parts | shm.SHM_FLAG, total,
                                                ref, pad4=True))
                    continue
                if mv is None:   # no slot came free: the pieces go inline, joined
                    chunk = mv = memoryview(bytes(data))
                self._write(w, encode_parts(self.node, dst, label, msg_id, i, parts, total, chunk, pad4=True))
            self.stats["sent_frames"] += parts
            self.stats["sent_msgs"] += 1
            self.stats["sent_bytes"] += total
            if ack_timeout_s is not None:
                return _wait_for_acks(w, ack_timeout_s)
        return True

    def _shm_dests(self, wname: str, to: Optional[str]) -> Optional[list[str]]:
        """The nodes whose pools a frame of ``wname`` goes through: the addressee, or every
        reader matched with the writer (None if one of them has not said hello yet: inline)."""
        if wname in wire_topics.DURABLE_TOPICS:
            return None   # a late joiner gets the writer's history: a reference names no slot of its own
        if to:
            return [to]
        matched, names = self._matched_readers(wname)
        return names if len(names) == matched and not any(n.startswith("?") for n in names) else None

    def reader_names(self, topic: str) -> list[str]:
        """The nodes whose readers our writer of ``topic`` is matched with ("?<guid>" for one
        that has not said hello yet), as ``matched_peers`` gives them; looked up again only
        when the match count moves (``matched_peers`` costs ~1 ms, too much for every frame)."""
        return self._matched_readers(topic)[1]

    def _matched_readers(self, topic: str) -> tuple[int, list[str]]:
        matched = self._writer(topic).get_publication_matched_status().current_count
        cached = self._reader_names.get(topic)
        if cached is None or cached[0] != matched:
            names = self.matched_peers([topic]).get(topic, {}).get("readers", [])
            cached = self._reader_names[topic] = (matched, names)
        return cached

    def _shm_put(self, wname: str, dests: list[str], chunk) -> Optional[bytes]:
        """Copy ``chunk`` into a slot of each destination's pool; the reference, or None to send
        inline (no slot free for longer than a moment: real.shm).  A slot filled for a frame
        that goes inline after all stays taken: the pools are unlinked when the sender closes."""
        entries = []
        try:
            for d in dests:
                pool = self._pools.get((wname, d))
                if pool is None:
                    if len(self._pools) >= MAX_ADDRESSED_WRITERS:
                        return None
                    pool = self._pools[(wname, d)] = shm.Pool(self.node, d, slot_bytes=self.frame_bytes)
                entries.append((d, pool.name, *pool.put(chunk, wait_s=min(0.2, self.write_timeout_s))))
        except (shm.PoolFull, OSError) as exc:
            self.stats["shm_fallbacks"] += 1
            log.debug("%s: %s on %s, frame sent inline", self.node, exc, wname)
            return None
        self.stats["shm_sent_frames"] += 1
        return shm.encode_ref(entries)

    def matched_count(self, topic: str) -> int:
        """How many readers our writer of ``topic`` is matched with (cheap)."""
        return self._writer(topic).get_publication_matched_status().current_count

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every matched reader acknowledged everything written (before closing)."""
        deadline = time.monotonic() + timeout_s
        ok = True
        for w in list(self._writers.values()):
            left = max(0.0, deadline - time.monotonic())
            ok = _wait_for_acks(w, left) and ok
        return ok

    def write_frame(self, topic: str, frame: Frame) -> None:
        """Write one raw Frame (no splitting, no checks): for tests and tools."""
        self._write(self._writer(topic), encode_frame(frame))

    # --- receiving ---------------------------------------------------------------------------
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
            for topic, reader in readers:
                self._drain_reader(topic, reader)

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
                if f.parts & shm.SHM_FLAG and not self._from_pool(topic, f):
                    continue
                try:
                    self._on_frame(topic, f, ts)
                except Exception as exc:  # a bug, not bad input: count, keep going
                    self.stats["errors"] += 1
                    self.last_error = repr(exc)
                    log.exception("dds receiver of %s: frame on %s", self.node, topic)
            if len(batch) < self._reader_max_samples:
                break

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

    def _deliver(self, topic, src, dst, tag, msg_id, data: bytes, source_ts: int) -> None:
        topic = self._logical.get(topic, topic)  # a per-node DDS topic delivers as its topic
        now = time.monotonic()
        sent_at = 0.0
        known = True
        if source_ts and source_ts > 0:  # the sender's clock, read on ours (real.clock_sync)
            known = self.clock.known(src)
            # (never after its arrival: the offset is exact only to half the round trip's asymmetry)
            sent_at = now - max(0.0, self.clock.wall_ns() / 1e9 - self.clock.local_time(src, source_ts))
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

    # --- presence and matching ---------------------------------------------------------------
    def participants(self) -> dict[str, str]:
        """Other live participants on the domain: {participant GUID: node name}.

        Invalid presence samples (real.wire.INVALID_HELLO: undecodable, or no sensible
        name; in a sealed run also those without a valid tag) are skipped, and the count
        of those currently on the domain is kept (stats ``invalid_hello``)."""
        with self._lock:
            if self._closing:
                return {}
            samples = self._hello_reader.read(N=100000, condition=self._hello_alive)
        valid = [s for s in samples if s.node and self._authentic(s)]
        self.stats["invalid_hello"] = len(samples) - len(valid)
        return {s.guid: s.node for s in valid if s.guid != self.guid}

    def _authentic(self, hello: Hello) -> bool:
        if self.frame_key is None:
            return True
        want = frame_auth.hello_tag(self.frame_key, hello.node, hello.guid)
        return hmac.compare_digest(bytes(hello.tag), want)

    def peers(self) -> dict[str, str]:
        """Other live nodes on the domain: {node name: participant GUID} (of two participants
        that claim one name, one; unsealed, anyone can claim any name)."""
        return {node: guid for guid, node in sorted(self.participants().items())}

    def wait_peers(self, names: Iterable[str], timeout_s: float = 10.0, poll_s: float = 0.02) -> list[str]:
        """Wait until every node in ``names`` is present; return the ones still missing
        (empty list = all there)."""
        want = sorted(set(names) - {self.node})
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            have = self.peers()
            missing = [n for n in want if n not in have]
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(poll_s)

    def matched_peers(self, topics: Optional[Iterable[str]] = None) -> dict[str, dict[str, list[str]]]:
        """Per topic, the remote nodes matched with us: ``readers`` = nodes whose reader
        matched our writer (they get what we send), ``writers`` = nodes whose writer
        matched our reader (only for subscribed topics).  Endpoints of participants
        that have not said hello yet appear as "?<guid>"."""
        if isinstance(topics, str):
            topics = [topics]
        names = self.participants()
        out: dict[str, dict[str, list[str]]] = {}
        with self._lock:
            if self._closing:
                return {}
            for t in (list(topics) if topics is not None
                      else sorted((set(self._writers) | set(self._readers)) - set(self._logical))):
                rd, wr = set(), set()
                w = self._writers.get(t)
                if w is not None:
                    rd = self._endpoint_names(_matched_handles(w), w.get_matched_subscription_data, names)
                r = self._readers.get(t)
                if r is not None:
                    wr = self._endpoint_names(_matched_handles(r), r.get_matched_publication_data, names)
                out[t] = {"readers": sorted(rd), "writers": sorted(wr)}
        return out

    def _endpoint_names(self, handles, describe, names) -> set[str]:
        found = set()
        for h in handles:
            try:
                d = describe(h)
            except Exception:  # unmatched meanwhile
                continue
            if d is None:
                continue
            pk = str(d.participant_key)
            if pk == self.guid:
                continue
            found.add(names.get(pk, "?" + pk))
        return found

    def wait_matched(self, expected, timeout_s: float = 10.0, *, topics: Optional[Iterable[str]] = None,
                     role: str = "readers", poll_s: float = 0.02) -> dict:
        """The subscribe/publish barrier.  ``expected`` is one of

        * ``{topic: count}``  - at least ``count`` distinct remote nodes matched,
        * ``{topic: [names]}`` - these nodes matched,
        * ``[names]`` or ``count`` together with ``topics=[...]``.

        ``role="readers"`` (default) counts remote readers of our writers (who will
        receive what we send); ``role="writers"`` remote writers matched with our readers.
        Returns what is still missing when it gives up: ``{topic: missing names or
        missing count}``; an empty dict means everything matched."""
        if role not in ("readers", "writers"):
            raise ValueError("role must be 'readers' or 'writers'")
        if isinstance(expected, Mapping):
            want = dict(expected)
        else:
            if topics is None:
                raise ValueError("give topics=[...] with a list of names or a count")
            if isinstance(topics, str):
                topics = [topics]
            if not isinstance(expected, int):
                expected = sorted(set(expected))
            want = {t: expected for t in topics}
        # Addressed topics: each named reader must also match the writer of its own DDS topic.
        per_node: dict[str, tuple[str, str]] = {}  # per-node DDS topic -> (topic, node)
        if role == "readers":
            for t, exp in want.items():
                if t in self._addressed and not isinstance(exp, int):
                    for n in set(exp) - {self.node}:
                        self._addressed_writer(t, n)
                        per_node[self.addressed_topic(t, n)] = (t, n)
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            got = self.matched_peers(list(want) + list(per_node))
            missing = {}
            for t, exp in want.items():
                have = [n for n in got.get(t, {}).get(role, [])]
                if isinstance(exp, int):
                    if len(have) < exp:
                        missing[t] = exp - len(have)
                else:
                    lack = set(exp) - set(have) - {self.node}
                    lack |= {n for phys, (pt, n) in per_node.items()
                             if pt == t and n not in got.get(phys, {}).get("readers", [])}
                    if lack:
                        missing[t] = sorted(lack)
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(poll_s)

    # --- life cycle ----------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
        for guard in (getattr(self, "_guard", None), getattr(self, "_caller_guard", None)):
            try:  # wake the receive thread, and a caller taking in recv
                guard.set(True)
            except Exception:
                pass
        t = getattr(self, "_thread", None)
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10.0)
        clock = getattr(self, "clock", None)
        if clock is not None:
            clock.close()
        self._flush_rejects()
        self._teardown()

    def _teardown(self) -> None:
        self._closing = True
        self._close_pools()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        with self._drain_lock:  # not while a caller is taking
            waitsets = [getattr(self, "_ws", None), getattr(self, "_caller_ws", None)]
            for ws in waitsets:  # detach first, then delete the rest children-first
                _delete_entity(ws)
            for e in reversed([e for e in self._entities if e not in waitsets]):
                _delete_entity(e)
            self._entities = []
            _delete_entity(getattr(self, "_dp", None))
        self._readers = {}
        self._addr_readers = {}
        self._writers = {}
        self._pending.clear()
        self._current.clear()
        self._pending_bytes = 0
        if not getattr(self, "_domain_released", False):
            self._domain_released = True
            _release_domain(self.domain_id)

    def _close_pools(self, wait_s: float = 2.0) -> None:
        """Unlink this node's pools, after their readers took what is in them (a reference still
        on its way names a file that must exist when it is first opened), and unmap the others'."""
        deadline = time.monotonic() + wait_s
        for pool in list(getattr(self, "_pools", {}).values()):
            while not pool.drained() and time.monotonic() < deadline:
                time.sleep(0.005)
            pool.close()
        self._pools = {}
        slots_in = getattr(self, "_shm_in", None)
        if slots_in is not None:
            with self._drain_lock:
                slots_in.close()

    def __enter__(self) -> "DdsTransport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DdsTransport({self.node!r}, profile={self.profile!r}, domain_id={self.domain_id})"
