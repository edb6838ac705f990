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

``DdsTransport`` owns every DDS entity of a node: this module creates them
(participant, topics, writers, readers, WaitSets, the receive thread) and
deletes them.  What it does with them is in mixins of their own modules:
``real.sending`` (``send``: frames, addressed writers, shared memory),
``real.receiving`` (the receive thread, ``recv``), ``real.beside`` (bytes that came beside
DDS) and ``real.presence`` (``peers``, ``wait_matched``...).  The pieces that are not DDS
are ``real.reassembly``, ``real.dds_support`` and ``real.wire``.

Design
------
* One DomainParticipant per transport, in a ``cyclonedds.domain.Domain``
  created from ``real.config.config_xml(profile)`` (one Domain per domain id
  and process, shared by the transports of the process, deleted with the last).
* Every topic carries ``real.wire.Frame`` samples: a message is cut into frames
  (``real.sending``) and reassembled per (topic, src, msg_id) (``real.receiving``).
* QoS: reliable, KEEP_ALL, reader resource limits; ``train/model_blob`` is
  TRANSIENT_LOCAL with a durability-service history of KEEP_LAST 1 *per
  instance*.  ``Frame`` is keyed on ``part``, so the writer keeps exactly one
  frame per part index: the frames of its last message (plus higher parts of
  an older, larger message, which a late joiner drops as orphans because their
  part 0 is gone).  A late-joining reader thus gets the latest model and only
  that.
* Presence: topic ``ctl/hello``, written here once, read by ``real.presence``.
* No Python DDS Listener is used: cyclonedds-python's ``DataWriter.write``
  holds the GIL while ``dds_write`` may block on flow control, and a listener
  needs the GIL from a CycloneDDS thread.  Hence a receive thread of our own,
  and writes through ``dds_write`` via ctypes (``real.sending``).
* Addressed messages reach only their addressee.  A topic of ``addressed``
  (``ADDRESSED_TOPICS`` by default: ``coll/frames``, ``ps/state_reply``,
  ``ps/model``, geo's, a Flower server's instructions, ``train/model_blob``) has, besides its own DDS topic, one per node (``<topic>/to/<node name in
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

* Large payloads go beside DDS: on one host through shared memory (``real.shm``; the
  ``loopback`` profile, unsealed runs), between machines on a TCP stream per peer
  (``real.stream``; the ``lan`` profile); never on durable topics.

Caveats: messages are ordered per (sender, topic), not across topics;
complete messages wait in memory until ``recv``; a send to a reader whose
process died can block until the peer's lease expires (10 s by default),
bounded by ``write_timeout_s`` after which ``send`` raises DDSException (a crash
fault deletes its participant first, so its peers drop it at once: real.primitives).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections import deque
from typing import Iterable, Optional

from cyclonedds.core import GuardCondition, InstanceState, Qos, Policy, ReadCondition, SampleState, ViewState, \
    WaitSet
from cyclonedds.domain import DomainParticipant
from cyclonedds.pub import DataWriter
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

from dtemu.real.config import config_xml
from dtemu.core.wire import topics as wire_topics
from dtemu.real.clock_sync import ClockExchange, skew_ns
from dtemu.real.dds_support import _acquire_domain, _delete_entity, _release_domain
from dtemu.core.wire import frame_auth
from dtemu.real import shm, stream
from dtemu.real.presence import Presence
from dtemu.real.reassembly import FRAME_BYTES, MAX_MESSAGE_BYTES, REASSEMBLY_STATS, Reassembler
from dtemu.real.beside import POOL_VIEWS, Beside
from dtemu.real.receiving import _ANY_STATE, Receiving
from dtemu.real.sending import MAX_ADDRESSED_WRITERS, Sending
from dtemu.real.wire import Frame, Hello

# What other modules import from here (POOL_VIEWS, MAX_ADDRESSED_WRITERS: the sides that read them)
__all__ = ["DdsTransport", "HELLO", "ADDRESSED_TOPICS", "CALLER_TAKES", "POOL_VIEWS", "MAX_ADDRESSED_WRITERS"]

HELLO = "ctl/hello"  # presence, real mode's own topic; the roles' topics are core.wire.topics

# Topics whose addressed messages travel on per-node DDS topics (see the module docstring):
# collective frames, the state server's answers (on the shared topic, each of 12 workers woke
# for, took and dropped the 11 answers of every query round that were not its own: half of the
# round trip, docs/notebook/) and geo's pushes and pulls (on the shared
# topic the global PS's answer to one site reached every rank of every site, across the WAN:
# docs/netns.md, "Geo sites over namespaces") and a Flower server's instructions (each to its node:
# on the shared topic every client received all ten of a call's, 10x the bytes on the server's link,
# 5.6 s of a 16 s round on the testbed: docs/notebook/, entry 32), and FL's model sent to one client
# (FedAsync's to the client it asks, the full model a stale client gets under a downlink codec: on
# the shared topic it went to every client, twice the bytes on the controller's link with two
# clients, 20% of a FedAsync version on the testbed: entry 33).  A durable topic's addressed
# messages travel without durability: the latest model for a late joiner is the shared topic's.
ADDRESSED_TOPICS = (wire_topics.COLL_FRAMES, wire_topics.SS_REPLY,
                    wire_topics.GEO_PUSH, wire_topics.GEO_PULL, wire_topics.FLOWER_INS, wire_topics.MODEL_BLOB)
# Topics whose reader's thread does nothing but wait for them: the thread that calls recv takes
# their samples itself (real.receiving), which spares the receive thread's wake-up and
# its hand-off to the caller on every message: a worker's answers from the state server, and the
# state server's own input (it only ever reads ps/state; no one else subscribes to it).  The
# state server's round trip, docs/notebook/.
CALLER_TAKES = (wire_topics.SS_REPLY, wire_topics.SS_STATE)


def _default_domain_id() -> int:
    return int(os.environ.get("DTEMU_DDS_DOMAIN", "0"))


class DdsTransport(Sending, Receiving, Beside, Presence, Reassembler):
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
        must carry a valid tag (``core.wire.frame_auth``).  ``clock_skew_s``: this node's clock set
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
             "shm_fallbacks") + stream.STATS + REASSEMBLY_STATS, 0)
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
        # Same-host payloads (real.shm): a pool per (DDS writer, destination) out, the senders' in.
        self._shm, self._pools, self._shm_in = shm.enabled(profile, key is not None), {}, shm.Slots(node)
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
            endpoint = self._open_stream(profile, peers, whc_high)   # real.stream, or ""
            tag = frame_auth.hello_tag(self.frame_key, node, self.guid, endpoint) if self.frame_key else b""
            self._hello_writer.write(Hello(node=node, guid=self.guid, pid=os.getpid(), host=socket.gethostname(),
                                           tag=tag, stream=endpoint))
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
                if name in self._addressed:
                    phys = self.addressed_topic(name, self.node)
                    self._logical[phys] = name
                    # (volatile, as its writer is: a durable reader would not match it)
                    volatile = [p for p in policies if p is not Policy.Durability.TransientLocal]
                    ar = DataReader(self._dp, self._topic(phys), qos=Qos(*volatile))
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
        on its way names a file that must exist when it is first opened), and unmap the others';
        close the streams (what is queued out still leaves, for up to 2 s)."""
        for end in (getattr(self, "_stream_out", None), getattr(self, "_stream_in", None)):
            if end is not None:
                end.close()
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
