"""The rogue participant's attack (``real rogue``, real/rogue.py): joins a DDS domain and attacks a federated run.

    real rogue --domain 7 --duration 60 [--key-file wrong.key] [--report out.json] [--flood RATE]

What it does, all the time it runs:

- stops when it sees the run's Stop (or after ``--duration``);
- snoops ``train/train_cmd`` (commands are signed, not secret) and, for each
  new round, publishes updates *claiming to be each client*: one sealed with
  a wrong key, one with no seal, both carrying a huge poisoned delta; and a
  forged command and model to the clients, sealed with the wrong key;
- snoops ``train/client_update`` and re-publishes every honest update it sees,
  byte for byte and under the honest sender's name: once at once (a replay
  within the round) and once more in the next round (a stale replay); and
  re-writes the honest frames themselves, tags and message ids included.

With ``--flood RATE`` it also sends, from a thread, RATE samples a second of
anything well-formed on every topic: frames in honest and made-up names with
random ids, parts and sizes (declarations up to 2^62 bytes), and presence
announcements (honest names, made-up ones, bad UTF-8), until the run stops.

It reads every frame whatever its addressee and writes frames under any
sender name it likes: anyone on a DDS domain can, which is why the names inside
messages are signed.  It prints (and with ``--report`` writes) what it
published, so a test can check that none of it was accepted.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from dtemu.core.compression import codecs
from dtemu.core.wire import messages
from dtemu.core.wire.auth import Sealer, peek_inner
from dtemu.core.errors import DecodeError
from dtemu.core.wire.messages import ClientUpdate, ModelBlob, Stop, TrainCmd
from dtemu.core.wire.topics import CLIENT_UPDATE, MODEL_BLOB, TRAIN_CMD
from dtemu.core.wire import frame_auth
from dtemu.real.transport import DdsTransport
from dtemu.core.wire import topics
from dtemu.real.wire import Frame, Hello, encode_frame


class Snooper(DdsTransport):
    """A transport that also keeps messages addressed to others, and the honest frames themselves.

    In a sealed run every frame starts with a tag (core.wire.frame_auth) it cannot
    make but can skip: it notices from the first single-frame message whose
    payload is 16 bytes longer than its total, and strips tags from then on.
    """

    tagged = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.raw: list[tuple[str, Frame]] = []  # honest update frames, exactly as they came

    def _on_frame(self, topic, f, source_ts, checked=False):
        if topic == CLIENT_UPDATE and f.src != self.node:
            self.raw.append((topic, Frame(src=f.src, dst=f.dst, topic=f.topic, msg_id=f.msg_id, part=f.part,
                                          parts=f.parts, total=f.total, payload=bytes(f.payload))))
            del self.raw[:-64]
        if f.parts == 1 and len(f.payload) == f.total + frame_auth.TAG_BYTES:
            Snooper.tagged = True
        if self.tagged and len(f.payload) >= frame_auth.TAG_BYTES:
            f.payload = f.payload[frame_auth.TAG_BYTES:]
        f.dst = ""
        super()._on_frame(topic, f, source_ts, checked)


def send_as(transport: DdsTransport, src: str, topic: str, data: bytes, to: str = "") -> None:
    """Publish ``data`` as if ``src`` sent it (the frames carry whatever name we like)."""
    fb = transport.frame_bytes
    parts = max(1, -(-len(data) // fb))
    msg_id = int(time.time_ns() & 0x7FFFFFFFFFFFFFFF)
    for i in range(parts):
        transport.write_frame(topic, Frame(src=src, dst=to, topic=topic, msg_id=msg_id, part=i, parts=parts,
                                           total=len(data), payload=data[i * fb:(i + 1) * fb]))


def poisoned_update(round_: int, seed: int, client: str, dim: int) -> bytes:
    delta = np.full(dim, 1e3, np.float32)
    return messages.encode(ClientUpdate(round_, seed, client, 10**6, "delta", 1, 0.0,
                                        codecs.encode(delta, codecs.CodecParams("fp32"))))


def flood(t: DdsTransport, names: list[str], rate: float, stop: threading.Event, published: dict) -> None:
    """Random well-formed samples on every topic and on presence, ``rate`` a second, until ``stop``."""
    rng = np.random.default_rng()
    period = 1.0 / rate
    hello = t._hello_writer
    wire = {topic: t._writer(topic) for topic in topics.ALL}
    next_at = time.monotonic()
    while not stop.is_set():
        src = str(rng.choice(names + [f"nobody{rng.integers(1000)}"]))
        if rng.random() < 0.05:  # presence: an honest name, a made-up one, or one that is not UTF-8
            node = src if rng.random() < 0.5 else "evXl"
            raw = Hello(node=node, guid=f"rogue-{rng.integers(1 << 30)}", pid=1, host="rogue").serialize()
            t._write(hello, raw.replace(b"evXl", b"ev\xffl"))
            published["flood_hellos"] += 1
        else:
            topic = str(rng.choice(list(topics.ALL)))
            parts = int(rng.integers(1, 6))
            total = int(rng.choice([rng.integers(0, 4096), rng.integers(0, 1 << 62)]))
            f = Frame(src=src, dst=str(rng.choice(["", "controller"] + names)), topic=topic,
                      msg_id=int(rng.integers(0, 1 << 62)), part=int(rng.integers(0, parts)), parts=parts,
                      total=total, payload=rng.bytes(int(rng.integers(0, 256))))
            t._write(wire[topic], encode_frame(f, pad4=True))
            published["flood_frames"] += 1
        next_at += period
        delay = next_at - time.monotonic()
        if delay > 0:
            stop.wait(delay)
        else:
            next_at = time.monotonic()  # behind: no burst to catch up


def run(domain: int, duration: float, clients: list[str], wrong_key: bytes, dim_hint: int | None,
        flood_rate: float = 0.0) -> dict:
    published = {"forged_updates": 0, "unsigned_updates": 0, "replayed_updates": 0, "forged_commands": 0,
                 "forged_models": 0, "replayed_frames": 0, "flood_frames": 0, "flood_hellos": 0}
    seen_rounds: set[int] = set()
    captured: list[tuple[str, bytes, int]] = []  # (sender, sealed bytes, round seen)
    dim = dim_hint
    forger = {c: Sealer(wrong_key, c, incarnation=int(time.time() * 1000)) for c in clients + ["controller"]}
    with Snooper("rogue", domain_id=domain, subscribe=[TRAIN_CMD, CLIENT_UPDATE, MODEL_BLOB]) as t:
        stop = threading.Event()
        flooder = None
        if flood_rate > 0:
            flooder = threading.Thread(target=flood, args=(t, clients + ["controller"], flood_rate, stop, published),
                                       daemon=True)
            flooder.start()

        def attack(cmd: TrainCmd) -> None:
            for c in clients:
                bad = poisoned_update(cmd.round, cmd.seed, c, dim)
                send_as(t, c, CLIENT_UPDATE, forger[c].seal(CLIENT_UPDATE, cmd.round, bad), to="controller")
                send_as(t, c, CLIENT_UPDATE, bad, to="controller")
                published["forged_updates"] += 1
                published["unsigned_updates"] += 1
            # Stale replays: what the clients sent in earlier rounds, sent again now.
            for sender, data, r in captured:
                if r < cmd.round:
                    send_as(t, sender, CLIENT_UPDATE, data, to="controller")
                    published["replayed_updates"] += 1
            captured[:] = [x for x in captured if x[2] >= cmd.round - 1]
            # The honest frames themselves, byte for byte (tags and message ids included).
            for topic, frame in t.raw:
                t.write_frame(topic, frame)
                published["replayed_frames"] += 1
            fake = TrainCmd(cmd.round + 1, cmd.subset, cmd.epochs, 10.0, cmd.seed ^ 1)
            send_as(t, "controller", TRAIN_CMD, forger["controller"].seal(TRAIN_CMD, fake.round, messages.encode(fake)))
            published["forged_commands"] += 1
            blob = ModelBlob.of(cmd.round, codecs.encode(np.zeros(dim, np.float32), codecs.CodecParams("fp32")))
            send_as(t, "controller", MODEL_BLOB, forger["controller"].seal(MODEL_BLOB, cmd.round + 5,
                                                                          messages.encode(blob)))
            published["forged_models"] += 1

        end = time.monotonic() + duration
        current, waiting = 0, []
        while time.monotonic() < end:
            msg = t.recv([TRAIN_CMD, CLIENT_UPDATE, MODEL_BLOB], timeout_s=0.2)
            if msg is None:
                continue
            try:
                inner = messages.decode(peek_inner(msg.data))
            except DecodeError:
                continue
            if isinstance(inner, Stop):
                break  # the run is over
            if isinstance(inner, ModelBlob) and dim is None:
                dim = codecs.decode(inner.packet).to_dense().size
            if isinstance(inner, TrainCmd) and inner.round not in seen_rounds:
                seen_rounds.add(inner.round)
                current = inner.round
                waiting.append(inner)
            elif isinstance(inner, ClientUpdate) and msg.src in clients and msg.topic == CLIENT_UPDATE:
                send_as(t, msg.src, CLIENT_UPDATE, msg.data, to="controller")  # a replay within the round
                published["replayed_updates"] += 1
                captured.append((msg.src, msg.data, current))
            if dim is not None:
                for cmd in waiting:
                    attack(cmd)
                waiting = []
        stop.set()
        if flooder is not None:
            flooder.join(timeout=5)
        t.flush(timeout_s=2.0)
    published["rounds_attacked"] = len(seen_rounds)
    return published
