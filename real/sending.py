"""The send side of ``DdsTransport`` (``real.transport``): a message cut into frames and written.

``Sending`` is a mixin: ``DdsTransport``'s set-up creates the writers (``_writer``,
``_addressed_writer``), the locks and the clock it works with (this module does
not import ``real.transport``).

* A message is cut into frames of ``frame_bytes`` (1 MiB: the best throughput
  measured); the frames of one message are written back to back (a lock per
  topic), so with reliable in-order delivery per writer they arrive in order,
  possibly interleaved with frames of other senders.  In a sealed run each
  frame starts with its tag (``core.wire.frame_auth``).
* Writes go through ``dds_write`` via ctypes (``real.dds_support``), which
  releases the GIL, so this process's receiver keeps running while a send
  blocks on flow control (the stock ``DataWriter.write`` holds the GIL).
* ``send(..., to=X)`` on an addressed topic (``real.transport``) writes on X's
  own DDS topic once that writer matched X's reader, on the shared topic until
  then.
* Same-host payloads (``real.shm``): a frame of 64 KiB or more is copied into a
  slot of a shared-memory pool per (writer, destination) and DDS carries the
  frame with a reference to it instead of its bytes.  A message given as
  ``Buffers`` (a collective frame's header and body) goes into its slot piece
  by piece.
"""

from __future__ import annotations

import ctypes as ct
import logging
import os
import time
from typing import Optional

from cyclonedds.core import DDSException
from cyclonedds.pub import DataWriter

from dtemu.core.runtime.requests import Buffers
from dtemu.core.wire import topics as wire_topics
from dtemu.core.wire import frame_auth
from dtemu.real import shm, stream
from dtemu.real.dds_support import _dds_write, _dds_write_ts, _SampleContainer, _wait_for_acks
from dtemu.real.wire import Frame, encode_frame, encode_parts

log = logging.getLogger("dtemu.real.transport")  # the sender's log records stay the transport's

MAX_ADDRESSED_WRITERS = 4096  # per-node DDS topics a transport sets up; beyond, the shared topic


class Sending:
    """``DdsTransport``'s writing of messages and frames; see the module docstring."""

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
            streams = self._stream_dests(wname, to) if self._stream_out is not None and total >= stream.MIN_BYTES \
                else None
            parts = max(1, -(-total // fb))
            if mv is None and not (parts == 1 and dests):
                mv = memoryview(bytes(data))
            for i in range(parts if only_frames is None else min(parts, only_frames)):
                chunk = data if mv is None else mv[i * fb:(i + 1) * fb]
                # On the stream the bytes go untagged: the connection proved the key and the reference
                # is tagged (real.stream); a sealed message's own MAC still covers them end to end.
                if streams and len(chunk) >= stream.MIN_BYTES and self._stream_out.put(
                        streams, stream.frame_key(wname, dst, label, msg_id, i, parts, total), chunk,
                        wait_s=self.write_timeout_s):   # the bytes went on the stream; DDS carries their length
                    self._write(w, encode_parts(self.node, dst, label, msg_id, i, parts | stream.STREAM_FLAG, total,
                                                stream.reference(self.frame_key, wname, self.node, dst, label, msg_id,
                                                                 i, parts, total, len(chunk)), pad4=True))
                    continue
                if sealed:  # the tag first: the receiver checks it before the frame counts (core.wire.frame_auth)
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

    def _stream_dests(self, wname: str, to: Optional[str]) -> Optional[list[str]]:
        """The nodes a frame of ``wname`` goes to on the stream (real.stream): as for the pools,
        and only once every one of their connections is ready (until then: inline).  With multicast
        delivery a message to everyone stays in DDS: one copy per link is what the user chose."""
        if not to and os.environ.get("DTEMU_DDS_DELIVERY", "").strip() == "multicast":
            return None
        dests = self._shm_dests(wname, to)
        return dests if dests and self._stream_out.ready(dests, self.stream_endpoints()) else None

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
        ok = self._stream_out.flush(timeout_s) if self._stream_out is not None else True  # (real.stream)
        for w in list(self._writers.values()):
            left = max(0.0, deadline - time.monotonic())
            ok = _wait_for_acks(w, left) and ok
        return ok

    def write_frame(self, topic: str, frame: Frame) -> None:
        """Write one raw Frame (no splitting, no checks): for tests and tools."""
        self._write(self._writer(topic), encode_frame(frame))
