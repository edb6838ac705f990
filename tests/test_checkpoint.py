import hashlib
import json
import os
import random
import select
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from dtemu.core.wire.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from dtemu.core.errors import CheckpointError
from dtemu.host.rundir import CHECKPOINT, atomic_write
from helpers import ROOT, kill_group


def sample():
    return Checkpoint(5, np.arange(10, dtype=np.float32), "abc", {"rounds_failed": 1})


def test_round_trip():
    back = decode_checkpoint(encode_checkpoint(sample()), expected_dim=10)
    assert back.round == 5 and back.scenario_digest == "abc" and back.extra == {"rounds_failed": 1}
    np.testing.assert_array_equal(back.weights, sample().weights)


@pytest.mark.parametrize("cut", [0, 3, 12, 30, -1, -4])
def test_truncated_is_refused(cut):
    data = encode_checkpoint(sample())
    with pytest.raises(CheckpointError):
        decode_checkpoint(data[:cut])


def test_corrupt_and_mismatched_are_refused():
    data = bytearray(encode_checkpoint(sample()))
    data[-1] ^= 1
    with pytest.raises(CheckpointError, match="checksum"):
        decode_checkpoint(bytes(data))
    with pytest.raises(CheckpointError, match="model has 11"):
        decode_checkpoint(encode_checkpoint(sample()), expected_dim=11)
    with pytest.raises(CheckpointError, match="bad magic"):
        decode_checkpoint(b"XXXX" + bytes(20))


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "c.dtck"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["c.dtck"]


# ------------------------------------------------------------------ what is wrong, in words

def _raw(header: bytes, body: bytes = b"", version: int = 1, magic: bytes = b"DTCK", header_len=None) -> bytes:
    n = len(header) if header_len is None else header_len
    return struct.pack("<4sB3xI", magic, version, n) + header + body


def _header(**changes) -> bytes:
    h = {"round": 1, "scenario": "abc", "dim": 2, "sha256": hashlib.sha256(bytes(8)).hexdigest(), "extra": {}}
    h.update(changes)
    return json.dumps({k: v for k, v in h.items() if v is not _DROP}).encode()


_DROP = object()
GOOD = encode_checkpoint(sample())
DAMAGED = {
    "empty file": (b"", r"truncated: 0 bytes"),
    "cut in the prefix": (GOOD[:7], r"truncated: 7 bytes"),
    "bad magic": (b"PK\x03\x04" + GOOD[4:], r"bad magic"),
    "future version": (GOOD[:4] + b"\x02" + GOOD[5:], r"unsupported checkpoint version 2"),
    "header of 4 GiB": (_raw(b"{}", header_len=2**32 - 1), r"more than the \d+ allowed"),
    "cut in the header": (GOOD[:40], r"truncated: its header needs \d+ bytes, 28 left"),
    "header not JSON": (_raw(b"{round: 1}"), r"not valid JSON"),
    "header nested 100000 deep": (_raw(b"[" * 100_000), r"not valid JSON \(RecursionError\)"),
    "header not an object": (_raw(b"[1, 2]"), r"not a JSON object"),
    "no checksum": (_raw(_header(sha256=_DROP)), r"lacks sha256"),
    "round is a bool": (_raw(_header(round=True), bytes(8)), r"bad round: True"),
    "round negative": (_raw(_header(round=-1), bytes(8)), r"bad round: -1"),
    "size is a float": (_raw(_header(dim=2.0), bytes(8)), r"bad size: 2.0"),
    "checksum not a digest": (_raw(_header(sha256=[1]), bytes(8)), r"not a sha256 hex digest"),
    "extra not an object": (_raw(_header(extra=5), bytes(8)), r"extra is not a JSON object"),
    "cut in the weights": (GOOD[:-4], r"truncated: 36 of 40 weight bytes"),
    "trailing bytes": (GOOD + b"\0", r"too long: 41 of 40 weight bytes"),
    "2^31 weights declared, none there": (_raw(_header(dim=2**31)), r"truncated: 0 of 8589934592 weight bytes"),
    "a flipped bit in the weights": (GOOD[:-1] + bytes([GOOD[-1] ^ 1]), r"checksum \(corrupt file\)"),
}


@pytest.mark.parametrize("what", list(DAMAGED))
def test_damaged_checkpoints_say_what_is_wrong(what):
    data, message = DAMAGED[what]
    with pytest.raises(CheckpointError, match=message):
        decode_checkpoint(data)


def test_any_buffer_decodes():
    for buf in (bytearray(GOOD), memoryview(GOOD)):
        assert decode_checkpoint(buf).round == 5


# ------------------------------------------------------------------ a kill during a save

SAVER = textwrap.dedent("""
    import sys
    import numpy as np
    from dtemu.core.wire.checkpoint import Checkpoint, encode_checkpoint
    from dtemu.host.rundir import RunDir
    run, r = RunDir(sys.argv[1]), int(sys.argv[2])
    w = np.empty(1 << 20, np.float32)  # a 4 MB model
    while True:
        w.fill(r)
        run.save_checkpoint(encode_checkpoint(Checkpoint(r, w, "kill-test")))
        print(r, flush=True)
        r += 1
""")


def test_a_kill_during_save_never_breaks_the_latest_checkpoint(tmp_path):
    rng = random.Random(11)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start, t0 = 0, time.monotonic()
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path), str(start)], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, start_new_session=True)
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 10.0)  # its first save is on disk
            assert ready, "the saver did not start"
            first = proc.stdout.readline()
            assert first.strip(), "the saver died"
            time.sleep(rng.uniform(0.0, 0.06))  # then kill it anywhere in the next few saves
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            printed = [int(x) for x in (first + proc.stdout.read()).split()]
        finally:
            kill_group(proc)
            proc.stdout.close()
        ckpt = decode_checkpoint((tmp_path / CHECKPOINT).read_bytes(), expected_dim=1 << 20)
        # The last save that returned, or the one after it (killed after its rename): whole, not mixed.
        assert ckpt.round in (printed[-1], printed[-1] + 1) and ckpt.scenario_digest == "kill-test"
        assert (ckpt.weights == ckpt.round).all()
        # A temp file the kill left is named apart, and no older one survives a save.
        others = sorted(p.name for p in tmp_path.iterdir() if p.name not in (CHECKPOINT, "events.jsonl"))
        assert len(others) <= 1 and all(n.startswith(f".{CHECKPOINT}.") for n in others), others
        start = ckpt.round + 1
    assert time.monotonic() - t0 < 10


def test_atomic_write_fsyncs_the_file_and_its_folder(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic_write(tmp_path / "x", b"data")
    assert synced == [False, True]  # the file's bytes, then the rename in its folder
