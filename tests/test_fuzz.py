"""Bad input: the fuzz harness (tools/fuzz.py), its regression corpus, and the size bounds.

(a) every input in tests/corpus/<decoder>/ (the ones that found bugs, and
    hand-made ones: huge declared sizes, truncated headers, duplicate frames)
    decodes or gives the decoder's typed error;
(b) a short fuzz run per decoder finds nothing unhandled;
(c) inputs of ~100 bytes that declare 2^31 elements or bytes are refused
    (or kept pending) without allocating for them, measured with tracemalloc.
"""

import json
import struct
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dtemu.core.compression import codecs
from dtemu.core.wire import messages
from dtemu.core.wire.bucket import ENTRY, HEADER as BUCKET_HEADER, decode_bucket
from dtemu.core.wire.checkpoint import decode_checkpoint
from dtemu.core.wire.topics import COLL_FRAMES
from dtemu.core.ddp.collectives import Collective
from dtemu.core.ddp.frames import Frame, decode_frame, encode_frame
from dtemu.core.errors import CheckpointError, CodecError, DecodeError, FrameError
from dtemu.core.runtime.requests import Message, RecordingContext
from tools import fuzz

CORPUS = Path(__file__).resolve().parent / "corpus"
TARGETS = fuzz.build()  # the dds_* ones only where cyclonedds is installed
SMALL_PEAK = 1 << 20  # "small": under 1 MB


def corpus_files():
    return [(p.parent.name, p) for p in sorted(CORPUS.glob("*/*.bin"))]


def peak_bytes(fn) -> int:
    """Peak bytes allocated while ``fn()`` runs (a DecodeError it raises is fine)."""
    tracemalloc.start()
    try:
        fn()
    except DecodeError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


# ------------------------------------------------------------------ (a) the corpus


@pytest.mark.parametrize("target,path", corpus_files(), ids=lambda x: x.name if isinstance(x, Path) else x)
def test_corpus_input_decodes_or_gives_the_typed_error(target, path):
    if target not in TARGETS:
        pytest.skip(f"{target} needs cyclonedds")
    outcome, detail = fuzz.classify(TARGETS[target], path.read_bytes())
    assert outcome in ("accepted", "typed"), f"{path.name}: {outcome}: {detail}"


def test_corpus_has_inputs_for_every_decoder():
    assert {t for t, _ in corpus_files()} >= set(fuzz.TARGETS)


def test_refused_frame_does_not_block_the_intact_ones():
    """The bug the fuzzer found in _Assembly: a frame refused for overrunning its payload
    used to be counted in the payload's size anyway, so the intact frames after it were refused."""
    ctx = RecordingContext()
    coll = Collective(ctx, 0, ["w0", "w1"], frame_bytes=64)
    intact = [encode_frame(Frame(0, 1, "grad", 0, 1, 2, i, 2, 100, chunk))
              for i, chunk in enumerate((b"a" * 64, b"b" * 36))]
    too_long = encode_frame(Frame(0, 1, "grad", 0, 1, 2, 0, 2, 100, b"x" * 70))
    for data in (intact[1], too_long, intact[0]):
        coll._file(Message(COLL_FRAMES, "w1", data))
    assert coll.counts["malformed"] == 1
    assert coll._done[(1, "grad", 0, 1)] == b"a" * 64 + b"b" * 36


# ------------------------------------------------------------------ (b) a short fuzz run


@pytest.mark.parametrize("name", list(fuzz.TARGETS))
def test_short_fuzz_run_finds_nothing_unhandled(name, tmp_path):
    if name not in TARGETS:
        pytest.skip(f"{name} needs cyclonedds")
    res = fuzz.fuzz_target(TARGETS[name], 300, seed=20240601, corpus=tmp_path)
    assert res.tried == 300
    assert res.counts["unhandled"] == res.counts["invalid"] == 0, res.examples
    assert res.counts["accepted"] > 0 and res.counts["typed"] > 0  # both sides reached
    assert not list(tmp_path.rglob("*.bin"))


def test_fuzz_runs_are_repeatable():
    t = TARGETS["codec"]
    a, b = list(fuzz.generate(t, 200, seed=1)), list(fuzz.generate(t, 200, seed=1))
    assert a == b and a != list(fuzz.generate(t, 200, seed=2))
    assert a[:len(t.seeds)] == [s.data for s in t.seeds]


def test_cli_table_and_json(tmp_path, capsys):
    out = tmp_path / "fuzz.json"
    assert fuzz.main(["--inputs", "60", "--seed", "3", "--only", "codec,checkpoint", "--no-save",
                      "--alloc-check", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["decoder", "tried", *fuzz.OUTCOMES, "seconds"]
    got = json.loads(out.read_text())
    assert [r["decoder"] for r in got["results"]] == ["codec", "checkpoint"]
    assert all(r["tried"] == 60 and r["unhandled"] == 0 for r in got["results"])


def test_an_unhandled_input_is_saved_to_the_corpus(tmp_path):
    def decode(data):
        if data.startswith(b"boom"):
            raise IndexError("a bug")
        raise CodecError("refused")

    t = fuzz.Target("toy", [fuzz.Seed(b"boom!"), fuzz.Seed(b"fine")], decode, CodecError)
    res = fuzz.fuzz_target(t, 2, seed=0, corpus=tmp_path)
    assert res.counts["unhandled"] == 1 and res.counts["typed"] == 1
    saved = list((tmp_path / "toy").glob("*.bin"))
    assert [p.read_bytes() for p in saved] == [b"boom!"] and len(saved[0].stem) == 16
    assert "IndexError" in res.examples[0]["detail"]


# ------------------------------------------------------------------ hypothesis over the sequences


def _frames_of(target):
    return sorted({f for s in TARGETS[target].seeds for f in fuzz.unpack_sequence(s.data)})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_collective_assembly_any_mix_of_frames(data):
    frames = _frames_of("coll_assembly")
    seq = data.draw(st.lists(st.sampled_from(frames) | st.binary(max_size=90), max_size=14))
    outcome, detail = fuzz.classify(TARGETS["coll_assembly"], fuzz.pack_sequence(seq))
    assert outcome in ("accepted", "typed"), detail


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_dds_reassembly_any_mix_of_frames(data):
    if "dds_reassembly" not in TARGETS:
        pytest.skip("needs cyclonedds")
    frames = _frames_of("dds_reassembly")
    seq = data.draw(st.lists(st.sampled_from(frames) | st.binary(max_size=90), max_size=14))
    outcome, detail = fuzz.classify(TARGETS["dds_reassembly"], fuzz.pack_sequence(seq))
    assert outcome in ("accepted", "typed"), detail


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=10)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["round", "scenario", "dim", "sha256", "extra"]), _json), st.binary(max_size=16))
def test_checkpoint_header_of_any_json(header, body):
    raw = json.dumps(header).encode()
    data = struct.pack("<4sB3xI", b"DTCK", 1, len(raw)) + raw + body
    outcome, detail = fuzz.classify(TARGETS["checkpoint"], data)
    assert outcome in ("accepted", "typed"), detail


# ------------------------------------------------------------------ (c) declared sizes are bounded


def _huge_cases():
    return [(name, what, data) for name, items in fuzz.huge_inputs().items() for what, data in items]


@pytest.mark.parametrize("name,what,data", _huge_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_huge_declared_sizes_are_refused_before_allocation(name, what, data):
    t = TARGETS[name]
    assert len(data) <= 160
    outcome = []
    peak = peak_bytes(lambda: outcome.append(fuzz.classify(t, data)))
    assert outcome[0][0] in ("typed", "accepted"), outcome  # accepted: an assembly keeps it pending
    assert peak < SMALL_PEAK, f"{name}: {what}: peak {peak} bytes"


def test_size_bounds_hold_even_with_permissive_limits():
    """Not only the model's bounds: each decoder checks a declared size against the bytes at hand."""
    fp32 = codecs.HEADER.pack(b"FP32", 1, 0, 0, 1 << 31, 1 << 31, 0) + bytes(80)
    assert peak_bytes(lambda: codecs.decode(fp32, max_dim=1 << 32)) < SMALL_PEAK
    with pytest.raises(CodecError, match="body is 80 bytes but the header implies 8589934592"):
        codecs.decode(fp32, max_dim=1 << 32)

    update = messages.encode(messages.ClientUpdate(1, 1, "c1", 10, "delta", 1, 0.5, fp32))
    assert peak_bytes(lambda: codecs.decode(messages.decode(update).packet, max_dim=1 << 32)) < SMALL_PEAK

    # frame 0 of 53,687,092 of 40 bytes each: a cut that fits the 2 GiB it claims
    frame = encode_frame(Frame(0, 5, "grad", 0, 1, 2, 0, -(-(1 << 31) // 40), 1 << 31, bytes(40)))
    assert len(frame) < 100 and decode_frame(frame, world=2, max_total=1 << 40).total == 1 << 31
    coll = Collective(RecordingContext(), 0, ["w0", "w1"], max_payload=1 << 40)
    assert peak_bytes(lambda: coll._file(Message(COLL_FRAMES, "w1", frame))) < SMALL_PEAK
    assert coll.counts["malformed"] == 0 and len(coll._assemblies) == 1  # pending, 40 bytes held

    header = json.dumps({"round": 1, "scenario": "x", "dim": 1 << 31, "sha256": "0" * 64}).encode()
    ckpt = struct.pack("<4sB3xI", b"DTCK", 1, len(header)) + header + bytes(16)
    assert peak_bytes(lambda: decode_checkpoint(ckpt, expected_dim=1 << 31)) < SMALL_PEAK
    with pytest.raises(CheckpointError, match="truncated: 16 of 8589934592"):
        decode_checkpoint(ckpt, expected_dim=1 << 31)

    shapes = [("huge", (1 << 31,))]
    bucket = BUCKET_HEADER.pack(b"DGC\0", 1, 0, 1, 0, 1, 4) + ENTRY.pack(0, 0, 0, 1 << 31, 1 << 31) + bytes(68)
    assert peak_bytes(lambda: decode_bucket(bucket, shapes)) < SMALL_PEAK
    with pytest.raises(FrameError, match="body of 8589934592 bytes but only 68 left"):
        decode_bucket(bucket, shapes)


def test_transport_reassembly_holds_only_what_arrived():
    pytest.importorskip("cyclonedds")
    from dtemu.real.reassembly import MAX_MESSAGE_BYTES, Reassembler
    from dtemu.real.wire import Frame as WireFrame, decode_frame as decode_wire, encode_frame as encode_wire

    r = Reassembler("me")  # the transport's defaults: messages up to 1 GiB
    data = encode_wire(WireFrame(src="a", topic="t", msg_id=1, part=0, parts=1 << 20, total=MAX_MESSAGE_BYTES,
                                 payload=bytes(40)))
    assert len(data) < 100
    assert peak_bytes(lambda: r._on_frame("t", decode_wire(data, copy=False), 0)) < SMALL_PEAK
    assert r._pending_bytes == 40 and r.stats["malformed"] == 0
    big = encode_wire(WireFrame(src="b", topic="t", msg_id=1, part=0, parts=2, total=MAX_MESSAGE_BYTES + 1,
                                payload=bytes(40)))
    r._on_frame("t", decode_wire(big, copy=False), 0)
    assert r.stats["malformed"] == 1 and len(r._pending) == 1
