"""Deterministic mutational fuzzing of every decoder of dtemu.

    python -m tools.fuzz --inputs 20000 --seed 1 [--json out.json] [--only codec,checkpoint]
                         [--alloc-check] [--corpus tests/corpus | --no-save]
    python -m tools.fuzz --replay tests/corpus
    python -m tools.fuzz --write-handmade          # (re)write the hand-made corpus inputs

Targets (the ``<decoder>`` names of the corpus folders):

    codec           core.codecs.decode (fp32 / q8 / s4 / sq8 packets)
    message         core.messages.decode (TrainCmd, Stop, ModelBlob, ClientUpdate)
    coll_frame      core.ddp.frames.decode_frame
    coll_assembly   frames through Collective._file: decode, reassembly, counting
    auth            sealed messages through core.auth Sealer.open, then messages.decode
    checkpoint      core.checkpoint.decode_checkpoint
    dgc_bucket      core.bucket.decode_bucket
    dds_wire        real.wire.decode_frame (CDR of real.wire.Frame)
    dds_reassembly  serialized frames through real.transport.Reassembler, as the receive thread

Each target is fed valid seeds made by the real encoders and mutations of
them: bit flips, byte sets, truncation, extension, insertion, deletion,
splicing of two seeds, and values written into the seed's header fields (0, 1,
max, 2^31, 2^32-1, negative-as-unsigned, off by one).  The sequence targets
(coll_assembly, auth, dds_reassembly) take frames back to back, each behind a
u32 length, mutated as a whole (duplicated, dropped, reordered, spliced from
other seeds) and frame by frame.  Everything is driven by one ``random.Random`` per target seeded from
``--seed`` and the target's name, so a run is repeatable.

Every input ends up in one of:

    accepted   decoded; the result passed the target's invariant checks
    typed      refused with the decoder's documented error (CodecError, ...;
               for the sequence targets: some frame was rejected and counted)
    unhandled  any other exception: a bug
    invalid    decoded, but the result breaks an invariant (a frame counted
               twice, a payload that is not the one sent, ...): a bug
    oversize   (--alloc-check) allocated more than 1 MiB + 16 bytes per input byte

Inputs in the last three classes are written to ``<corpus>/<target>/<sha256[:16]>.bin``;
``tests/test_fuzz.py`` replays that folder on every test run.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import random
import struct
import sys
import time
import traceback
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dtemu.core.compression import codecs
from dtemu.core.wire import messages
from dtemu.core.wire.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from dtemu.core.ddp.collectives import BARRIER_ROUND, COLL_FRAMES, Collective
from dtemu.core.ddp.frames import (Frame as CollFrame, decode_frame as decode_coll_frame,
                                   encode_frame as encode_coll_frame, split_payload)
from dtemu.core.errors import CheckpointError, CodecError, DecodeError, FrameError, MessageError
from dtemu.core.runtime.requests import Message, RecordingContext

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"

OUTCOMES = ("accepted", "typed", "unhandled", "invalid", "oversize")
BAD = ("unhandled", "invalid", "oversize")
ALLOC_SLACK = 1 << 20  # bytes a decode may allocate beyond 16 per input byte under --alloc-check


class Invalid(Exception):
    """A decoder accepted an input and returned something that breaks an invariant."""


class Rejected(DecodeError):
    """A sequence target rejected (and counted) at least one of its frames."""


def need(cond: bool, what: str) -> None:
    if not cond:
        raise Invalid(what)


# ---------------------------------------------------------------- targets


@dataclass
class Seed:
    data: bytes
    fields: list[tuple[int, str]] = field(default_factory=list)  # (offset, struct format) of header fields


@dataclass
class Target:
    name: str
    seeds: list[Seed]
    decode: Callable[[bytes], Any]  # raises ``typed`` for malformed input
    typed: type[BaseException]
    check: Callable[[bytes, Any], None] | None = None  # raises Invalid
    mutate: Callable[[random.Random, "Target"], bytes] | None = None  # default: byte mutations of a seed
    sequence: bool = False


_INTERESTING = {
    1: (0, 1, 0x7F, 0x80, 0xFF),
    2: (0, 1, 0x7FFF, 0x8000, 0xFFFF),
    4: (0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 1 << 20, 1 << 28),
    8: (0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, 1 << 40, 1 << 63, (1 << 64) - 1),
}


def _field_value(rng: random.Random, size: int, orig: int) -> int:
    mod = 1 << (8 * size)
    choice = rng.randrange(6)
    if choice == 0:
        return (orig + rng.choice((-1, 1))) % mod  # off by one
    if choice == 1:
        return (-max(1, orig)) % mod  # a negative number read as unsigned
    if choice == 2:
        return (orig * rng.choice((2, 16, 256))) % mod
    return rng.choice(_INTERESTING[size])


def mutate_bytes(rng: random.Random, data: bytes, fields: list[tuple[int, str]], others: list[bytes],
                 max_len: int) -> bytes:
    """1-5 stacked mutations of ``data``."""
    buf = bytearray(data)
    for _ in range(1 + min(4, int(rng.expovariate(1.0)))):
        op = rng.randrange(11)
        n = len(buf)
        if op <= 2 and fields:  # header fields get the most attention
            off, fmt = rng.choice(fields)
            size = struct.calcsize(fmt)
            if off + size <= n:
                orig = struct.unpack_from(fmt, buf, off)[0]
                if isinstance(orig, float):
                    new = rng.choice((0.0, -1.0, 1e-45, 3.4e38, float("inf"), float("-inf"), float("nan")))
                else:
                    new = _field_value(rng, size, orig)
                    if fmt[-1].islower():  # a signed field: reinterpret
                        new = struct.unpack(fmt, struct.pack(fmt.upper(), new))[0]
                struct.pack_into(fmt, buf, off, new)
        elif op == 3 and n:
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(n)
                buf[i] ^= 1 << rng.randrange(8)
        elif op == 4 and n:
            buf[rng.randrange(n)] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op == 5:
            del buf[rng.randint(0, n):]
        elif op == 6:
            extra = rng.choice((bytes(rng.randint(1, 16)), rng.randbytes(rng.randint(1, 64)),
                                bytes(buf[-rng.randint(1, 8):]) if n else b"\0"))
            buf += extra
        elif op == 7 and n:
            i = rng.randint(0, n)
            buf[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 8 and n:
            i = rng.randrange(n)
            del buf[i:i + rng.randint(1, 16)]
        elif op == 9 and others:  # splice: our head, another seed's tail
            other = rng.choice(others)
            buf = buf[:rng.randint(0, n)] + other[rng.randint(0, len(other)):]
        elif op == 10 and n >= 4:  # a u32-sized window anywhere (sizes, indices, scales)
            i = rng.randrange(n - 3)
            struct.pack_into(rng.choice("<>") + "I", buf, i, rng.choice(_INTERESTING[4]))
        if len(buf) > max_len:
            del buf[max_len:]
    return bytes(buf)


def default_mutate(rng: random.Random, t: Target) -> bytes:
    seed = rng.choice(t.seeds)
    max_len = 2 * max(len(s.data) for s in t.seeds) + 64
    return mutate_bytes(rng, seed.data, seed.fields, [s.data for s in t.seeds], max_len)


# ---------------------------------------------------------------- codec packets

_CODEC_HEADER_FIELDS = [(4, "<B"), (5, "<B"), (6, "<H"), (8, "<I"), (12, "<I"), (16, "<I")]


def codec_target() -> Target:
    rng = np.random.default_rng(0)
    seeds = []
    for name in codecs.CODECS:
        for dim in (0, 1, 7, 33, 100):
            for chunk, density in ((4, 0.1), (8192, 0.5), (1, 1.0)):
                vec = rng.standard_normal(dim).astype(np.float32)
                packet = codecs.encode(vec, codecs.CodecParams(name, chunk=chunk, density=density))
                fields = list(_CODEC_HEADER_FIELDS)
                if len(packet) >= 24:
                    fields.append((20, "<i"))  # first index / scale / value
                seeds.append(Seed(packet, fields))

    def decode(data):
        return codecs.decode(data, max_dim=1 << 20)

    def check(data, obj):
        dense = obj.to_dense()
        need(dense.dtype == np.float32 and dense.shape == (obj.dim,), "dense form has the wrong shape")
        if isinstance(obj, codecs.Sparse):
            need(obj.indices.shape == obj.values.shape, "indices and values differ in length")
            if obj.indices.size:
                need(obj.indices[0] >= 0 and obj.indices[-1] < obj.dim, "index out of range")
                need(bool((np.diff(obj.indices) > 0).all()), "indices not increasing")
        need(len(data) == codecs.HEADER_SIZE + codecs._body_size(
            codecs.peek_codec(data), obj.dim, getattr(obj, "indices", obj.to_dense()).shape[0],
            struct.unpack_from("<I", data, 16)[0]), "packet length does not match its header")

    return Target("codec", seeds, decode, CodecError, check)


# ---------------------------------------------------------------- FL messages


def message_target() -> Target:
    packet = codecs.encode(np.arange(5, dtype=np.float32), codecs.CodecParams("fp32"))
    samples = [
        (messages.TrainCmd(3, 6000, 1, 0.05, 2**62), [(8, "<I"), (12, "<I"), (16, "<H"), (18, "<d"), (26, "<Q")]),
        (messages.TrainCmd(0, 0, 0, 1e-9, 0), [(18, "<d")]),
        (messages.Stop(10, "done"), [(8, "<I"), (12, "<H")]),
        (messages.Stop(0, ""), [(12, "<H")]),
        (messages.ModelBlob.of(4, packet), [(8, "<I")]),
        (messages.ModelBlob.of(0, b""), [(8, "<I")]),
        (messages.ClientUpdate(2, 99, "client1", 6000, "delta", 94, 0.25, packet),
         [(8, "<I"), (12, "<Q"), (20, "<I"), (24, "<B"), (25, "<I"), (29, "<f"), (33, "<B")]),
        (messages.ClientUpdate(1, 1, "c" * messages.MAX_NAME, 1, "weights", 1, float("nan"), b""),
         [(24, "<B"), (33, "<B")]),
    ]
    header = [(4, "<B"), (5, "<B"), (6, "<H")]
    seeds = [Seed(messages.encode(m), header + f) for m, f in samples]

    def mutate(rng, t):
        data = default_mutate(rng, t)
        # Half of the damaged ModelBlobs get a matching checksum, so the fields behind it are reached.
        if len(data) >= 40 and data[5] == 3 and rng.random() < 0.5:
            buf = bytearray(data)
            buf[12:44] = hashlib.sha256(bytes(buf[44:])).digest()
            data = bytes(buf)
        return data

    def check(data, msg):
        need(isinstance(msg, (messages.TrainCmd, messages.Stop, messages.ModelBlob, messages.ClientUpdate)),
             "not a message")
        if isinstance(msg, messages.TrainCmd):
            need(0 < msg.lr < math.inf, "lr not positive and finite")
        if isinstance(msg, messages.ClientUpdate):
            need(msg.kind in messages.UPDATE_KINDS and 0 < len(msg.client.encode()) <= messages.MAX_NAME,
                 "bad kind or name")
        if isinstance(msg, messages.ModelBlob):
            need(hashlib.sha256(msg.packet).hexdigest() == msg.sha256, "checksum not verified")

    return Target("message", seeds, messages.decode, MessageError, check, mutate)


# ---------------------------------------------------------------- collective frames

_COLL_FIELDS = [(4, "<B"), (5, "<B"), (6, "<H"), (8, "<I"), (12, "<H"), (14, "<H"), (16, "<I"),
                (20, "<I"), (24, "<I"), (28, "<Q"), (36, "<B")]
COLL_WORLD = 3
COLL_FRAME_BYTES = 48
COLL_MAX_PAYLOAD = 1 << 12


def _coll_frames(rank, round_, name, payload, part=0, group=0):
    chunks = split_payload(payload, COLL_FRAME_BYTES)
    return [encode_coll_frame(CollFrame(group, round_, name, part, rank, COLL_WORLD, i, len(chunks),
                                        len(payload), c)) for i, c in enumerate(chunks)]


def coll_frame_target() -> Target:
    seeds = []
    for rank, round_, name, payload in ((1, 5, "grad", bytes(range(100))), (2, 0, "g", b""),
                                        (0, BARRIER_ROUND, "barrier", b"\x01\x00"), (2, 7, "dense", b"x" * 48)):
        for f in _coll_frames(rank, round_, name, payload):
            seeds.append(Seed(f, _COLL_FIELDS))

    def decode(data):
        return decode_coll_frame(data, world=COLL_WORLD, max_total=COLL_MAX_PAYLOAD)

    def check(data, f):
        need(f.rank < f.world == COLL_WORLD and f.seq < f.seq_count and f.total <= COLL_MAX_PAYLOAD,
             "header out of range")
        need(len(f.data) <= len(data), "body longer than the frame")

    return Target("coll_frame", seeds, decode, FrameError, check)


# ---------------------------------------------------------------- sequences of frames


def pack_sequence(frames: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(f)) + f for f in frames)


def unpack_sequence(data: bytes) -> list[bytes]:
    """Frames back to back behind u32 lengths; a length past the end takes the rest."""
    out, i = [], 0
    while i + 4 <= len(data):
        (n,) = struct.unpack_from("<I", data, i)
        i += 4
        out.append(data[i:i + n])
        i += n
    return out


def sequence_mutate(rng: random.Random, seq_seeds: list[list[bytes]], frame_fields, all_frames: list[bytes]):
    frames = list(rng.choice(seq_seeds))
    for _ in range(1 + min(3, int(rng.expovariate(1.0)))):
        op = rng.randrange(8)
        n = len(frames)
        if op == 0 and n:  # duplicate one
            frames.insert(rng.randint(0, n), rng.choice(frames))
        elif op == 1 and n > 1:  # swap two
            i, j = rng.randrange(n), rng.randrange(n)
            frames[i], frames[j] = frames[j], frames[i]
        elif op == 2:
            rng.shuffle(frames)
        elif op == 3 and n:
            del frames[rng.randrange(n)]
        elif op == 4:  # a frame of another sequence
            frames.insert(rng.randint(0, n), rng.choice(all_frames))
        elif op == 5:  # replay the whole sequence
            frames += frames
        elif n:  # damage one frame
            i = rng.randrange(n)
            frames[i] = mutate_bytes(rng, frames[i], frame_fields(frames[i]), all_frames, 2 * len(frames[i]) + 64)
    return pack_sequence(frames[:64])


def coll_assembly_target() -> Target:
    """Frames through ``Collective._file`` (decode, checks, reassembly, counting) as a receiver sees them."""
    payloads = {
        (5, "grad", 0, 1): bytes(range(100)),
        (5, "grad", 0, 2): bytes(range(200, 248)),
        (6, "dense", 1, 1): b"",
        (6, "dense", 1, 2): bytes(130),
        (BARRIER_ROUND, "barrier", 0, 1): b"\x01\x00",
    }
    per_key = {k: _coll_frames(k[3], k[0], k[1], p, part=k[2]) for k, p in payloads.items()}
    # Frames of a regroup (control names, sent with round = group = the generation) and of a
    # newer generation: they must not disturb the payloads of this one.
    control = (_coll_frames(1, 0, "stop", b"\x02\x00") + _coll_frames(2, 1, "alive", b"", group=1)
               + _coll_frames(1, 1, "state", bytes(70), group=1) + _coll_frames(1, 5, "grad", bytes(10), group=1))
    originals = {f for fs in per_key.values() for f in fs} | set(control)
    keys = list(per_key)
    seq_seeds = [
        [f for k in keys[:2] for f in per_key[k]],
        [f for pair in zip(per_key[keys[0]], per_key[keys[1]]) for f in pair] + per_key[keys[0]][2:],
        [f for k in reversed(keys) for f in reversed(per_key[k])],
        [f for k in keys for f in per_key[k]],
        per_key[keys[0]] + control + per_key[keys[1]],
    ]
    all_frames = sorted(originals)

    def run(data):
        ctx = RecordingContext(node="w0")
        coll = Collective(ctx, 0, [f"w{r}" for r in range(COLL_WORLD)], frame_bytes=COLL_FRAME_BYTES,
                          max_payload=COLL_MAX_PAYLOAD)
        frames = unpack_sequence(data)
        for frame in frames:
            coll._file(Message(COLL_FRAMES, "peer", frame))
            for key, asm in [*coll._assemblies.items(), *getattr(coll, "_control_asm", {}).items()]:
                need(asm.size == sum(len(p) for p in asm.parts.values()), f"{key}: size is not the sum of its frames")
                need(asm.size <= asm.total and all(s < asm.count for s in asm.parts), f"{key}: beyond its payload")
            need(not (coll._assemblies.keys() & coll._done.keys()), "a payload both complete and pending")
        rejected = [e for e in ctx.events if e["kind"] == "frame_rejected"]
        need(len(rejected) == coll.counts["malformed"], "a rejected frame was not logged exactly once")
        if all(f in originals for f in frames):  # only dropped, duplicated, reordered: nothing may go wrong
            need(coll.counts["malformed"] == 0, "an intact frame was rejected")
            for key, fs in per_key.items():
                if all(f in frames for f in fs):
                    need(coll._done.get(key) == payloads[key], f"{key}: not reassembled from intact frames")
                else:
                    need(key not in coll._done, f"{key}: complete without all its frames")
        if coll.counts["malformed"]:
            raise Rejected(f"{coll.counts['malformed']} of {len(frames)} frames rejected")
        return coll

    def mutate(rng, t):
        return sequence_mutate(rng, seq_seeds, lambda f: _COLL_FIELDS, all_frames)

    seeds = [Seed(pack_sequence(s)) for s in seq_seeds]
    return Target("coll_assembly", seeds, run, Rejected, None, mutate, sequence=True)


# ---------------------------------------------------------------- sealed FL messages

AUTH_KEY = bytes(range(32))
AUTH_TOPIC = "train/client_update"
AUTH_SRC = "client1"


def _reseal(envelope: bytes) -> bytes:
    """``envelope`` with its MAC made right again for whatever header and body it now has
    (what a peer holding the key could send), if it still has the envelope's shape."""
    from dtemu.core.wire.auth import _HEADER as AUTH_HEADER, _MAC, MAGIC as AUTH_MAGIC, _mac
    if len(envelope) < AUTH_HEADER.size or envelope[:4] != AUTH_MAGIC:
        return envelope
    end = AUTH_HEADER.size + envelope[5]
    if len(envelope) < end + _MAC:
        return envelope
    head, body = envelope[:end], envelope[end + _MAC:]
    return head + _mac(AUTH_KEY, AUTH_TOPIC, head, body) + body


def auth_target() -> Target:
    """Sealed messages through ``Sealer.open`` (MAC, sender, replay window) and ``messages.decode``,
    as the controller reads ``train/client_update``: one receiver, a sequence of envelopes."""
    from dtemu.core.wire.auth import Sealer

    packet = codecs.encode(np.arange(5, dtype=np.float32), codecs.CodecParams("fp32"))
    sender = Sealer(AUTH_KEY, AUTH_SRC, incarnation=5)
    envelopes = [sender.seal(AUTH_TOPIC, r, messages.encode(
        messages.ClientUpdate(r, 7, AUTH_SRC, 10, "delta", 3, 0.5, packet))) for r in range(5)]
    envelopes.append(sender.seal(AUTH_TOPIC, 5, b"not a message"))  # signed, but malformed inside
    other = Sealer(AUTH_KEY, "client2").seal(AUTH_TOPIC, 1, messages.encode(messages.Stop(1, "x")))  # signed as another
    wrong_key = Sealer(bytes(32), AUTH_SRC).seal(AUTH_TOPIC, 1, envelopes[0][-40:])
    originals = set(envelopes)
    seq_seeds = [envelopes[:5], envelopes[:3] + envelopes[1:3] + envelopes[3:5],  # replays
                 envelopes[4::-1], [envelopes[0], other, wrong_key, envelopes[5], envelopes[1]]]
    fields = [(4, "<B"), (5, "<B"), (6, "<H"), (8, "<I"), (12, "<Q")]
    all_frames = sorted({e for s in seq_seeds for e in s})

    def run(data):
        receiver = Sealer(AUTH_KEY, "controller")
        got, reasons = [], []
        envs = unpack_sequence(data)
        for env in envs:
            try:
                opened = receiver.open(AUTH_TOPIC, AUTH_SRC, env)
                messages.decode(opened.data)
            except DecodeError as err:
                reasons.append(getattr(err, "reason", "malformed"))
                continue
            got.append(opened.sequence)
            need(opened.sender == AUTH_SRC, "accepted a message signed as someone else")
        need(len(got) == len(set(got)), "accepted the same sequence number twice (a replay)")
        if all(e in originals for e in envs):
            want = [e for i, e in enumerate(envs) if e not in envs[:i] and e != envelopes[5]]
            need(len(got) == len(want), "an intact, fresh message was refused")
        if reasons:
            raise Rejected(f"{len(reasons)} refused: {sorted(set(reasons))}")
        return got

    def mutate(rng, t):
        out = unpack_sequence(sequence_mutate(rng, seq_seeds, lambda e: fields, all_frames))
        if rng.random() < 0.6:  # a sender with the key: the MAC verifies, the rest is whatever it is
            out = [_reseal(e) if rng.random() < 0.7 else e for e in out]
        return pack_sequence(out)

    return Target("auth", [Seed(pack_sequence(s)) for s in seq_seeds], run, DecodeError, None, mutate, sequence=True)


# ---------------------------------------------------------------- checkpoints

_JSON_VALUES = ("-1", "0", "1", "2147483648", "4294967295", "18446744073709551616", "1" + "0" * 40,
                "1.5", "1e999", "-1e999", "NaN", "true", "false", "null", '""', '"x"', "[]", "{}",
                '"' + "a" * 64 + '"', '{"a": [1, 2, {"b": null}]}', "[" * 5000 + "]" * 5000,
                "[" * 100000, '{"a":' * 3000 + "1" + "}" * 3000)


def _checkpoint_bytes(round_, weights, digest, extra, header_override: bytes | None = None) -> bytes:
    data = encode_checkpoint(Checkpoint(round_, weights, digest, extra))
    if header_override is None:
        return data
    body = np.ascontiguousarray(weights, dtype="<f4").tobytes()
    return struct.pack("<4sB3xI", b"DTCK", 1, len(header_override)) + header_override + body


def checkpoint_target() -> Target:
    rng = np.random.default_rng(1)
    fields = [(4, "<B"), (8, "<I")]
    seeds = []
    for dim, extra in ((0, {}), (1, {"rounds_failed": 1}), (10, {"bytes_up": 12345, "note": "x"}), (257, {})):
        w = rng.standard_normal(dim).astype(np.float32)
        seeds.append(Seed(_checkpoint_bytes(dim % 7, w, "d" * 64, extra), fields))

    def json_mutate(rng_: random.Random) -> bytes:
        dim = rng_.choice((0, 1, 5, 40))
        weights = np.arange(dim, dtype=np.float32)
        header = {"round": 3, "scenario": "d" * 64, "dim": dim,
                  "sha256": hashlib.sha256(weights.astype("<f4").tobytes()).hexdigest(), "extra": {}}
        key = rng_.choice(("round", "scenario", "dim", "sha256", "extra", None))
        text = json.dumps(header, sort_keys=True)
        if key is None:  # a key missing
            drop = rng_.choice(list(header))
            text = json.dumps({k: v for k, v in header.items() if k != drop}, sort_keys=True)
        else:
            token = rng_.choice(_JSON_VALUES)
            text = text.replace(json.dumps(key) + ": " + json.dumps(header[key]), json.dumps(key) + ": " + token, 1)
        if rng_.random() < 0.2:
            text = rng_.choice(("[", "{", '"', "1", "null", "[1,2]", '"abc"', "\ufeff", "\x00")) + text
        raw = text.encode("utf-8", "surrogatepass")
        data = _checkpoint_bytes(0, weights, "", {}, raw)
        if rng_.random() < 0.3:  # and some damage on top
            data = mutate_bytes(rng_, data, fields, [], 2 * len(data) + 64)
        return data

    def mutate(rng_, t):
        return json_mutate(rng_) if rng_.random() < 0.35 else default_mutate(rng_, t)

    def check(data, ck):
        need(isinstance(ck.round, int) and not isinstance(ck.round, bool) and ck.round >= 0, "bad round")
        need(ck.weights.dtype == np.float32 and ck.weights.ndim == 1, "weights not a float32 vector")
        need(isinstance(ck.scenario_digest, str) and isinstance(ck.extra, dict), "bad digest or extra")
        body = np.ascontiguousarray(ck.weights, dtype="<f4").tobytes()
        need(data.endswith(body), "weights are not the file's")

    return Target("checkpoint", seeds, decode_checkpoint, CheckpointError, check, mutate)


# ---------------------------------------------------------------- DGC buckets

BUCKET_SHAPES = [("w", (6, 5)), ("b", (3,)), ("v", (40,)), ("e", (0,))]


def _bucket_fields(data: bytes) -> list[tuple[int, str]]:
    from dtemu.core.wire.bucket import ENTRY, ENTRY_SIZE, HEADER_SIZE
    fields = [(4, "<B"), (5, "<B"), (6, "<H"), (8, "<I"), (12, "<I"), (16, "<I")]
    off, vb = HEADER_SIZE, 2 if data[5] == 1 else 4
    while off + ENTRY_SIZE <= len(data):
        _, kind, _, numel, k = ENTRY.unpack_from(data, off)
        fields += [(off, "<H"), (off + 2, "<B"), (off + 3, "<B"), (off + 4, "<I"), (off + 8, "<I")]
        if kind == 1 and k:
            fields.append((off + ENTRY_SIZE, "<i"))  # first index
        off += ENTRY_SIZE + (numel * vb if kind == 0 else k * (4 + vb))
    return fields


def dgc_bucket_target() -> Target:
    import torch

    from dtemu.core.wire.bucket import Bucket, TensorPayload, decode_bucket, encode_bucket

    gen = torch.Generator().manual_seed(2)
    seeds = []
    for fp16 in (False, True):
        for sparse_k in (0, 1, 4, None):
            payloads = []
            for _, shape in BUCKET_SHAPES:
                numel = math.prod(shape)
                if sparse_k is None or numel < 8:
                    payloads.append(TensorPayload(numel, torch.randn(numel, generator=gen)))
                else:
                    idx = torch.sort(torch.randperm(numel, generator=gen)[:sparse_k]).values
                    payloads.append(TensorPayload(numel, torch.randn(sparse_k, generator=gen), idx))
            data = encode_bucket(Bucket(1, 7, 4, fp16, payloads))
            seeds.append(Seed(data, _bucket_fields(data)))

    def decode(data):
        return decode_bucket(data, BUCKET_SHAPES)

    def check(data, b):
        need(0 <= b.rank < b.world_size and len(b.payloads) == len(BUCKET_SHAPES), "bad header")
        for p, (_, shape) in zip(b.payloads, BUCKET_SHAPES):
            need(p.numel == math.prod(shape) and p.values.dtype == torch.float32, "bad tensor")
            if p.indices is not None:
                idx = p.indices.numpy()
                need(idx.shape == tuple(p.values.shape) and len(idx) <= p.numel, "bad sparse entry")
                need(len(idx) == 0 or (idx[0] >= 0 and idx[-1] < p.numel and bool((np.diff(idx) > 0).all())),
                     "bad indices")
            else:
                need(p.k == p.numel, "dense entry of the wrong length")

    return Target("dgc_bucket", seeds, decode, FrameError, check)


# ---------------------------------------------------------------- real mode: DDS frames


def _wire_fields(data: bytes) -> list[tuple[int, str]]:
    """Offsets of a serialized real.wire.Frame's length and integer fields."""
    little, v2 = bool(data[1] & 1), data[1] > 3
    e = "<" if little else ">"
    a8 = 4 if v2 else 8
    fields, pos = [(0, "<B"), (1, "<B")], 0
    for _ in range(3):
        pos += (-pos) % 4
        fields.append((4 + pos, e + "I"))
        pos += 4 + struct.unpack_from(e + "I", data, 4 + pos)[0]
    pos += (-pos) % a8
    fields.append((4 + pos, e + "Q"))
    fields += [(4 + pos + 8, e + "I"), (4 + pos + 12, e + "I")]
    pos += 16
    pos += (-pos) % a8
    fields += [(4 + pos, e + "Q"), (4 + pos + 8, e + "I")]
    return fields


def _wire_frames():
    from cyclonedds.idl._support import Endianness

    from dtemu.real.wire import Frame, encode_frame
    out = []
    cases = [Frame(src="a", dst="", topic="train/client_update", msg_id=1, part=0, parts=1, total=3, payload=b"abc"),
             Frame(src="node-1", dst="me", topic="t", msg_id=2**40, part=1, parts=3, total=20, payload=bytes(7)),
             Frame(src="", dst="", topic="", msg_id=0, part=0, parts=0, total=0, payload=b""),
             Frame(src="é", dst="x" * 9, topic="coll/frames", msg_id=2**64 - 1, part=2**32 - 1, parts=2**32 - 1,
                   total=2**64 - 1, payload=bytes(range(50)))]
    for f in cases:
        for v2 in (False, True):
            for end in (Endianness.Little, Endianness.Big):
                out.append(encode_frame(f, endianness=end, use_version_2=v2))
    return out


def dds_wire_target() -> Target:
    from dtemu.real.wire import WireError, decode_frame

    seeds = [Seed(d, _wire_fields(d)) for d in _wire_frames()]

    def decode(data):
        return decode_frame(data, copy=True)

    def check(data, f):
        need(all(isinstance(s, str) for s in (f.src, f.dst, f.topic)) and isinstance(f.payload, bytes),
             "bad field types")
        need(0 <= f.part < 2**32 and 0 <= f.parts < 2**32 and 0 <= f.total < 2**64, "integers out of range")
        need(len(f.payload) <= len(data), "payload longer than the sample")

    return Target("dds_wire", seeds, decode, WireError, check)


REASM_NODE = "me"
REASM_TOPIC = "train/client_update"
REASM_LIMITS = dict(max_message_bytes=1 << 12, max_pending_messages=3, max_pending_bytes=1 << 12,
                    pending_timeout_s=60.0)


def dds_reassembly_target() -> Target:
    """Serialized frames through real.wire.decode_frame and ``Reassembler._on_frame``, as the receive thread does."""
    from cyclonedds.idl._support import Endianness

    from dtemu.real.reassembly import REASSEMBLY_STATS, Reassembler
    from dtemu.real.wire import Frame, WireError, decode_frame, encode_frame

    def message(src, msg_id, data, frame_bytes, dst="", tag=REASM_TOPIC, end=Endianness.Little, v2=False):
        parts = max(1, -(-len(data) // frame_bytes))
        return [encode_frame(Frame(src=src, dst=dst, topic=tag, msg_id=msg_id, part=i, parts=parts, total=len(data),
                                   payload=data[i * frame_bytes:(i + 1) * frame_bytes]), endianness=end,
                             use_version_2=v2) for i in range(parts)]

    a1 = message("a", 1, bytes(range(90)), 32)  # 3 frames
    b1 = message("b", 7, b"B" * 40, 25, end=Endianness.Big, v2=True)  # 2 frames
    a2 = message("a", 2, b"second", 32)
    c1 = message("c", 1, b"", 32)
    mine = message("b", 8, b"for me", 4, dst=REASM_NODE)
    other = message("b", 9, b"not mine", 4, dst="other")
    own = message(REASM_NODE, 1, b"own", 32)
    # A sender's message ids grow (DdsTransport's counter): b's 7 before its 8.
    seq_seeds = [a1 + a2, [a1[0], b1[0], a1[1], b1[1], a1[2]], c1 + b1 + mine + other + own,
                 a1[:2] + a2 + b1]
    expected = {  # what each seed delivers, in order
        0: [("a", bytes(range(90))), ("a", b"second")],
        1: [("b", b"B" * 40), ("a", bytes(range(90)))],
        2: [("c", b""), ("b", b"B" * 40), ("b", b"for me")],
        3: [("a", b"second"), ("b", b"B" * 40)],
    }
    packed = [pack_sequence(s) for s in seq_seeds]
    all_frames = sorted({f for s in seq_seeds for f in s})

    def run(data):
        # Twice: one frame at a time, and as one batch sorted by (src, msg_id, part) as
        # DdsTransport._drain hands a batch taken from the reader to _on_frame.
        frames = unpack_sequence(data)
        one = _reassemble(frames, batch=False)
        both = _reassemble(frames, batch=True)
        if data in packed:
            want = expected[packed.index(data)]
            need([(m.src, m.data) for m in one.delivered] == want, "seed not delivered intact")
            need(sorted((m.src, m.data) for m in both.delivered) == sorted(want), "seed not delivered intact as a batch")
        rejects = one.rejects + both.rejects
        if rejects:
            raise Rejected(f"{len(rejects)} rejects: {sorted(set(rejects))}")
        return one

    def _reassemble(frames, batch):
        r = Reassembler(REASM_NODE, stats=dict.fromkeys(REASSEMBLY_STATS, 0), **REASM_LIMITS)
        r.rejects = []
        r.on_reject = lambda kind, detail: r.rejects.append(kind)
        decoded = []
        for frame in frames:
            try:
                decoded.append(decode_frame(frame, copy=False))
            except WireError as exc:
                r._malformed(str(exc))
        if batch:
            decoded.sort(key=lambda f: (f.src, f.msg_id, f.part))
        for f in decoded:
            r._on_frame(REASM_TOPIC, f, 0)
            need(r._pending_bytes == sum(p.got for p in r._pending.values()), "pending bytes miscounted")
            need(all(p.got == sum(len(c) for c in p.chunks) for p in r._pending.values()), "chunks miscounted")
            need(len(r._pending) <= r.max_pending_messages and r._pending_bytes <= r.max_pending_bytes,
                 "pending messages beyond their bounds")
            need(all(k in r._pending for k in r._current.values()), "a current message that is not pending")
        r._expire(float("inf"))  # everything still incomplete times out
        need(not r._pending and not r._current and r._pending_bytes == 0, "expired messages left behind")
        s = r.stats
        need(len(r.rejects) == s["malformed"] + s["orphan_frames"] + s["incomplete_dropped"] + s["forged_frames"]
             + s["replayed_frames"], "a rejected frame was not reported exactly once")
        need(all(len(m.data) <= r.max_message_bytes and m.src not in ("", REASM_NODE) and m.dst in ("", REASM_NODE)
                 for m in r.delivered), "delivered a message it should have refused")
        return r

    def mutate(rng, t):
        return sequence_mutate(rng, seq_seeds, _safe_wire_fields, all_frames)

    return Target("dds_reassembly", [Seed(p) for p in packed], run, Rejected, None, mutate, sequence=True)


def _safe_wire_fields(data: bytes) -> list[tuple[int, str]]:
    try:
        return _wire_fields(data)
    except (struct.error, IndexError):
        return []


# ---------------------------------------------------------------- hand-made inputs

U31, U32 = 1 << 31, (1 << 32) - 1


def _pad(data: bytes, size: int = 100) -> bytes:
    return data + bytes(max(0, size - len(data)))


def huge_inputs() -> dict[str, list[tuple[str, bytes]]]:
    """Per target: inputs of about 100 bytes that declare 2^31 elements or bytes (or more).

    Each must be refused (or, for the assemblies, kept pending) without
    allocating for what it declares: tests/test_fuzz.py measures it.
    """
    from dtemu.core.ddp.frames import _FIELDS, FRAME
    from dtemu.core.wire import envelope

    def coll_hdr(*fields):   # a frame's header: the envelope (group 0), then its fields
        return envelope.pack(FRAME, 0) + _FIELDS.pack(*fields)

    out: dict[str, list[tuple[str, bytes]]] = {}
    out["codec"] = [
        ("fp32 D=2^31", _pad(codecs.HEADER.pack(b"FP32", 1, 0, 0, U31, U31, 0))),
        ("q8 D=2^32-1 chunk 1", _pad(codecs.HEADER.pack(b"Q8\0\0", 1, 1, 0, U32, U32, 1))),
        ("s4 k=2^31", _pad(codecs.HEADER.pack(b"S4\0\0", 1, 2, 0, U31, U31, 0))),
        ("sq8 k=2^28 chunk 1", _pad(codecs.HEADER.pack(b"SQ8\0", 1, 3, 0, 1 << 28, 1 << 28, 1))),
    ]
    inner = _pad(codecs.HEADER.pack(b"FP32", 1, 0, 0, U31, U31, 0), 50)
    out["message"] = [
        ("ClientUpdate carrying a packet of D=2^31",
         messages.encode(messages.ClientUpdate(1, 1, "c1", 10, "delta", 1, 0.5, inner))),
        ("ModelBlob carrying a packet of D=2^31", messages.encode(messages.ModelBlob.of(1, inner))),
        ("Stop with a 65535-byte reason", _pad(envelope.pack(envelope.FAMILIES["fl"]["stop"]) + struct.pack("<IH", 1, 0xFFFF))),
    ]
    from dtemu.core.wire.auth import _HEADER as AUTH_HEADER, MAGIC as AUTH_MAGIC, Sealer
    update = messages.encode(messages.ClientUpdate(1, 1, AUTH_SRC, 10, "delta", 1, 0.5, inner))
    out["auth"] = [
        ("sender of 255 bytes", pack_sequence([_pad(AUTH_HEADER.pack(AUTH_MAGIC, 1, 255, 0, 1, 1))])),
        ("a signed update carrying a packet of D=2^31",
         pack_sequence([Sealer(AUTH_KEY, AUTH_SRC).seal(AUTH_TOPIC, 1, update)])),
    ]
    frame = coll_hdr(5, 1, COLL_WORLD, 0, 0, U31, U31, 4) + b"grad"
    out["coll_frame"] = [
        ("total=2^31 in 2^31 frames", _pad(frame)),
        ("total=2^64-1", _pad(coll_hdr(5, 1, COLL_WORLD, 0, 0, 1, (1 << 64) - 1, 4) + b"grad")),
    ]
    within = coll_hdr(5, 1, COLL_WORLD, 0, 0, 2, COLL_MAX_PAYLOAD, 4) + b"grad"
    out["coll_assembly"] = [
        ("a frame claiming 2^31 bytes", pack_sequence([_pad(frame)])),
        ("a frame of the largest payload allowed, 2 frames", pack_sequence([_pad(within)])),
    ]
    header = json.dumps({"round": 1, "scenario": "x", "dim": U31, "sha256": "0" * 64}).encode()
    out["checkpoint"] = [
        ("dim=2^31", _pad(struct.pack("<4sB3xI", b"DTCK", 1, len(header)) + header)),
        ("header of 2^32-1 bytes", _pad(struct.pack("<4sB3xI", b"DTCK", 1, U32))),
    ]
    from dtemu.core.wire.bucket import ENTRY, HEADER as BUCKET_HEADER
    out["dgc_bucket"] = [
        ("dense tensor of 2^31 values", _pad(BUCKET_HEADER.pack(b"DGC\0", 1, 0, len(BUCKET_SHAPES), 0, 1, 4)
                                             + ENTRY.pack(0, 0, 0, U31, U31))),
        ("sparse tensor with k=2^32-1", _pad(BUCKET_HEADER.pack(b"DGC\0", 1, 0, len(BUCKET_SHAPES), 0, 1, 4)
                                             + ENTRY.pack(0, 1, 0, 30, U32))),
    ]
    if have_dds():
        le = b"\x00\x01\x00\x00"
        out["dds_wire"] = [
            ("src of 2^31 bytes", _pad(le + struct.pack("<I", U31) + b"a")),
            ("payload of 2^32-1 bytes", _pad(le + struct.pack("<I", 2) + b"a\0\0\0" + struct.pack("<I", 1) + b"\0\0\0\0"
                                             + struct.pack("<I", 1) + b"\0\0\0\0" + struct.pack("<QIIQI", 1, 0, 2, U31, U32))),
        ]
        from dtemu.real.wire import Frame, encode_frame
        big = encode_frame(Frame(src="a", topic="t", msg_id=1, part=0, parts=U31, total=U31, payload=b"x" * 40))
        ok = encode_frame(Frame(src="a", topic="t", msg_id=2, part=0, parts=2, total=REASM_LIMITS["max_message_bytes"],
                                payload=b"x" * 40))
        out["dds_reassembly"] = [
            ("a message of 2^31 bytes in 2^31 frames", pack_sequence([big])),
            ("the first frame of the largest message allowed", pack_sequence([ok])),
        ]
    return out


def handmade_inputs() -> dict[str, list[tuple[str, bytes]]]:
    """``huge_inputs`` plus truncated headers, duplicates and other classics, per target."""
    out = huge_inputs()
    t = {name: TARGETS[name]() for name in out}
    seed = {name: t[name].seeds[min(1, len(t[name].seeds) - 1)].data for name in out}
    for name, data in seed.items():
        out[name] += [("empty", b""), ("truncated in the header", data[:len(data) // 8 or 1]),
                      ("last byte missing", data[:-1]), ("a byte too many", data + b"\0")]
    seq = [unpack_sequence(t["coll_assembly"].seeds[0].data)]
    out["coll_assembly"] += [
        ("every frame twice", pack_sequence([f for f in seq[0] for _ in (0, 1)])),
        ("frames in reverse", pack_sequence(seq[0][::-1])),
        ("a copy with other bytes after the original", pack_sequence(seq[0] + [seq[0][0][:-1] + b"?"])),
        ("last frame missing", pack_sequence(seq[0][:-1])),
    ]
    envs = unpack_sequence(t["auth"].seeds[0].data)
    out["auth"] += [("the same envelope twice (a replay)", pack_sequence([envs[0], envs[0]])),
                    ("a sequence number too old to tell", pack_sequence([_reseal(e) for e in (
                        envs[0][:12] + struct.pack("<Q", 1000) + envs[0][20:],
                        envs[0][:12] + struct.pack("<Q", 1) + envs[0][20:])]))]
    if "dds_reassembly" in out:
        frames = unpack_sequence(t["dds_reassembly"].seeds[0].data)  # a: 3 frames, then 1
        out["dds_reassembly"] += [
            ("orphan: part 1 alone", pack_sequence(frames[1:2])),
            ("a part twice", pack_sequence(frames[:2] + frames[1:])),
            ("parts out of order", pack_sequence([frames[0], frames[2], frames[1]])),
        ]
    return out


def write_handmade(corpus: Path) -> list[Path]:
    return [save(corpus, name, data) for name, items in handmade_inputs().items() for _, data in items]


# ---------------------------------------------------------------- running

TARGETS: dict[str, Callable[[], Target]] = {
    "codec": codec_target,
    "message": message_target,
    "coll_frame": coll_frame_target,
    "coll_assembly": coll_assembly_target,
    "auth": auth_target,
    "checkpoint": checkpoint_target,
    "dgc_bucket": dgc_bucket_target,
    "dds_wire": dds_wire_target,
    "dds_reassembly": dds_reassembly_target,
}


def have_dds() -> bool:
    return importlib.util.find_spec("cyclonedds") is not None


def build(names=None) -> dict[str, Target]:
    out = {}
    for name in names or TARGETS:
        if name.startswith("dds_") and not have_dds():
            continue
        out[name] = TARGETS[name]()
    return out


def classify(t: Target, data: bytes, alloc_limit: int | None = None) -> tuple[str, str]:
    """(outcome, detail) of decoding ``data`` with target ``t``."""
    try:
        if alloc_limit is not None:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
        result = t.decode(data)
        if alloc_limit is not None:
            peak = tracemalloc.get_traced_memory()[1] - before
            if peak > alloc_limit + 16 * len(data):
                return "oversize", f"peak allocation {peak} bytes for {len(data)} input bytes"
        if t.check is not None:
            t.check(data, result)
        return "accepted", ""
    except Invalid as exc:
        return "invalid", str(exc)
    except t.typed as exc:
        return "typed", f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # the bugs we look for (RecursionError, struct.error, IndexError, ...)
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        return "unhandled", f"{type(exc).__name__}: {exc} at {Path(tb.filename).name}:{tb.lineno}"


@dataclass
class Result:
    name: str
    tried: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    examples: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"decoder": self.name, "tried": self.tried, **self.counts, "seconds": round(self.seconds, 2),
                "examples": self.examples}


def save(corpus: Path, target: str, data: bytes) -> Path:
    folder = corpus / target
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(data).hexdigest()[:16]}.bin"
    path.write_bytes(data)
    return path


def generate(t: Target, inputs: int, seed: int):
    """The ``inputs`` inputs a run with ``seed`` tries on ``t``: the same ones every time."""
    rng = random.Random(f"dtemu-fuzz:{seed}:{t.name}")
    mutate = t.mutate or default_mutate
    for i in range(inputs):
        if i < len(t.seeds):
            yield t.seeds[i].data  # the seeds themselves first
        elif not t.sequence and rng.random() < 0.02:
            yield rng.randbytes(rng.randint(0, 96))  # plain noise now and then
        else:
            yield mutate(rng, t)


def fuzz_target(t: Target, inputs: int, seed: int, corpus: Path | None = None,
                alloc_check: bool = False) -> Result:
    res = Result(t.name)
    alloc_limit = ALLOC_SLACK if alloc_check else None
    start = time.perf_counter()
    for data in generate(t, inputs, seed):
        outcome, detail = classify(t, data, alloc_limit)
        res.tried += 1
        res.counts[outcome] += 1
        if outcome in BAD:
            where = str(save(corpus, t.name, data)) if corpus is not None else ""
            if len(res.examples) < 10:
                res.examples.append({"outcome": outcome, "detail": detail[:300], "input_hex": data[:64].hex(),
                                     "length": len(data), "saved": where})
    res.seconds = time.perf_counter() - start
    return res


def run(inputs: int, seed: int, names=None, corpus: Path | None = None, alloc_check: bool = False,
        targets: dict[str, Target] | None = None) -> list[Result]:
    targets = targets or build(names)
    if alloc_check:
        tracemalloc.start()
    try:
        return [fuzz_target(t, inputs, seed, corpus, alloc_check) for t in targets.values()]
    finally:
        if alloc_check:
            tracemalloc.stop()


def replay(corpus: Path, targets: dict[str, Target] | None = None) -> list[tuple[Path, str, str]]:
    """Every ``<corpus>/<target>/*.bin`` through its target: (path, outcome, detail)."""
    targets = targets or build([p.name for p in sorted(corpus.iterdir()) if p.is_dir() and p.name in TARGETS])
    out = []
    for folder in sorted(p for p in corpus.iterdir() if p.is_dir()):
        t = targets.get(folder.name)
        if t is None:
            continue
        for path in sorted(folder.glob("*.bin")):
            outcome, detail = classify(t, path.read_bytes())
            out.append((path, outcome, detail))
    return out


def table(results: list[Result]) -> str:
    cols = ("decoder", "tried", *OUTCOMES, "seconds")
    rows = [[r.name, r.tried, *(r.counts[o] for o in OUTCOMES), f"{r.seconds:.1f}"] for r in results]
    total = ["total", sum(r.tried for r in results), *(sum(r.counts[o] for r in results) for o in OUTCOMES),
             f"{sum(r.seconds for r in results):.1f}"]
    rows.append(total)
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*cols), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=2000, help="inputs per decoder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="comma-separated decoders: " + ", ".join(TARGETS))
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--corpus", default=str(CORPUS), help="where failing inputs go")
    ap.add_argument("--no-save", action="store_true", help="do not write failing inputs")
    ap.add_argument("--alloc-check", action="store_true",
                    help="trace allocations; a decode that allocates > 1 MiB + 16 B per input byte is a failure")
    ap.add_argument("--replay", metavar="DIR", help="replay a corpus folder instead of fuzzing")
    ap.add_argument("--write-handmade", action="store_true",
                    help="write the hand-made inputs (huge sizes, truncations, duplicates) to --corpus and exit")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or None
    unknown = set(names or ()) - set(TARGETS)
    if unknown:
        ap.error(f"unknown decoders {sorted(unknown)}")
    if args.replay:
        bad = 0
        for path, outcome, detail in replay(Path(args.replay)):
            bad += outcome in BAD
            print(f"{outcome:<9}  {path}  {detail[:120]}")
        return 1 if bad else 0
    if args.write_handmade:
        for path in write_handmade(Path(args.corpus)):
            print(path)
        return 0
    corpus = None if args.no_save else Path(args.corpus)
    results = run(args.inputs, args.seed, names, corpus, args.alloc_check)
    print(table(results))
    for r in results:
        for ex in r.examples[:3]:
            print(f"  {r.name}: {ex['outcome']}: {ex['detail']}  {ex['saved']}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": "python -m tools.fuzz " + " ".join(argv if argv is not None else sys.argv[1:]),
            "inputs_per_decoder": args.inputs, "seed": args.seed, "alloc_check": args.alloc_check,
            "results": [r.to_dict() for r in results]}, indent=2) + "\n")
    return 1 if any(r.counts[o] for r in results for o in BAD) else 0


if __name__ == "__main__":
    sys.exit(main())
